"""Verifier of desktop-submit-form: the app's saved form must hold exactly the asked values."""

import json
import sys

try:
    with open("/app/registration.json", encoding="utf-8") as f:
        data = json.load(f)
except (OSError, ValueError) as exc:
    print(f"FAIL: /app/registration.json missing or not JSON ({exc}); was Submit pressed?")
    sys.exit(1)
want = {"name": "Ada Lovelace", "email": "ada@example.org", "subscribe": True}
if data != want:
    print(f"FAIL: expected {want}, found {data}")
    sys.exit(1)
print("PASS")

"""Verifier of desktop-submit-form: the app's saved form must hold exactly the asked values.

Exit 0 = solved, 10 = not solved; any other exit means the checker could not run
(tasks/catalog/README.md).
"""

import json
import sys

try:
    with open("/app/registration.json", encoding="utf-8") as f:
        data = json.load(f)
except (OSError, ValueError) as exc:
    print(f"FAIL: /app/registration.json missing or not JSON ({exc}); was Submit pressed?")
    sys.exit(10)
want = {"name": "Ada Lovelace", "email": "ada@example.org", "subscribe": True}
if data != want:
    print(f"FAIL: expected {want}, found {data}")
    sys.exit(10)
print("PASS")

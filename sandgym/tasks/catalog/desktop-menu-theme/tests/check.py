"""Verifier of desktop-menu-theme: the saved settings name the dark theme.

Exit 0 = solved, 10 = not solved; any other exit means the checker could not run
(tasks/catalog/README.md).
"""

import json
import sys

try:
    with open("/app/settings.json", encoding="utf-8") as f:
        data = json.load(f)
except (OSError, ValueError) as exc:
    print(f"FAIL: /app/settings.json missing or not JSON ({exc}); was File > Save settings used?")
    sys.exit(10)
if data != {"theme": "dark"}:
    print(f"FAIL: expected {{'theme': 'dark'}}, found {data}")
    sys.exit(10)
print("PASS")

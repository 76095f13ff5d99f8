"""Verifier of desktop-set-slider: the applied volume is exactly 73.

Exit 0 = solved, 10 = not solved; any other exit means the checker could not run
(tasks/catalog/README.md).
"""

import json
import sys

try:
    with open("/app/volume.json", encoding="utf-8") as f:
        data = json.load(f)
except (OSError, ValueError) as exc:
    print(f"FAIL: /app/volume.json missing or not JSON ({exc}); was Apply pressed?")
    sys.exit(10)
if data != {"volume": 73}:
    print(f"FAIL: expected {{'volume': 73}}, found {data}")
    sys.exit(10)
print("PASS")

"""Verifier of desktop-press-button: exactly one press, of the button labelled 42.

Exit 0 = solved, 10 = not solved; any other exit means the checker could not run
(tasks/catalog/README.md).
"""

import sys

try:
    with open("/app/presses.log", encoding="utf-8") as f:
        presses = f.read().split()
except OSError as exc:
    print(f"FAIL: no button was pressed ({exc})")
    sys.exit(10)
if presses != ["42"]:
    print(f"FAIL: expected exactly one press of 42, found presses {presses}")
    sys.exit(10)
print("PASS")

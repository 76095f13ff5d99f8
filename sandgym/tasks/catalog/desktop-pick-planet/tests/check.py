"""Verifier of desktop-pick-planet: the last planet opened is Neptune.

Exit 0 = solved, 10 = not solved; any other exit means the checker could not run
(tasks/catalog/README.md).
"""

import sys

try:
    with open("/app/choice.txt", encoding="utf-8") as f:
        got = f.read().strip()
except OSError as exc:
    print(f"FAIL: no planet was opened ({exc})")
    sys.exit(10)
if got != "Neptune":
    print(f"FAIL: expected Neptune, found {got!r}")
    sys.exit(10)
print("PASS")

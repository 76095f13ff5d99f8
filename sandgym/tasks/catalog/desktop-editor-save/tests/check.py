"""Verifier of desktop-editor-save: the saved note holds exactly the two asked lines.

Exit 0 = solved, 10 = not solved; any other exit means the checker could not run
(tasks/catalog/README.md).
"""

import sys

try:
    with open("/app/notes.txt", encoding="utf-8") as f:
        body = f.read()
except OSError as exc:
    print(f"FAIL: /app/notes.txt was not saved ({exc})")
    sys.exit(10)
lines = [line.rstrip() for line in body.strip("\n").split("\n")]
want = ["Meeting at 10:30", "Bring the quarterly report"]
if lines != want:
    print(f"FAIL: expected lines {want}, found {lines}")
    sys.exit(10)
print("PASS")

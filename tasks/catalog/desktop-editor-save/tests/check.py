"""Verifier of desktop-editor-save: the saved note holds exactly the two asked lines."""

import sys

try:
    with open("/app/notes.txt", encoding="utf-8") as f:
        body = f.read()
except OSError as exc:
    print(f"FAIL: /app/notes.txt was not saved ({exc})")
    sys.exit(1)
lines = [line.rstrip() for line in body.strip("\n").split("\n")]
want = ["Meeting at 10:30", "Bring the quarterly report"]
if lines != want:
    print(f"FAIL: expected lines {want}, found {lines}")
    sys.exit(1)
print("PASS")

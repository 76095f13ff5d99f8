#!/bin/bash
# Oracle solution: reads the instance's instruction ($SANDGYM_INSTRUCTION), lists the directory
# to find the file, then does what was asked.
set -euo pipefail
python3 - <<'PY'
import os, re
text = os.environ["SANDGYM_INSTRUCTION"]
quoted = re.findall(r"`([^`]+)`", text)
src_dir, prefix = quoted[0], quoted[1]
name = next(n for n in os.listdir(src_dir) if n.startswith(prefix))
src = os.path.join(src_dir, name)
lines = open(src).read().splitlines()
if "the line `" in text:
    open(src, "a").write(quoted[2] + "\n")
elif "first line" in text:
    open(quoted[2], "w").write(lines[0] + "\n")
else:
    open(quoted[2], "w").write(f"{len(lines)}\n")
PY

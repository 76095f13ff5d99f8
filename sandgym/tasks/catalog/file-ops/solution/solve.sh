#!/bin/bash
# Oracle solution: reads the instance's instruction ($SANDGYM_INSTRUCTION), lists the directory
# to find the file, then does what was asked.
set -euo pipefail
python3 - <<'PY'
import os, re, shutil
text = os.environ["SANDGYM_INSTRUCTION"]
paths = re.findall(r"`([^`]+)`", text)
if os.path.isfile(paths[0]):  # the file named in full
    src = paths[0]
    src_dir, name = os.path.split(src)
    paths.insert(1, name)
else:  # a directory and the prefix of the file's name: look first
    src_dir, prefix = paths[0], paths[1]
    name = next(n for n in os.listdir(src_dir) if n.startswith(prefix))
    src = os.path.join(src_dir, name)
if re.match(r"(Copy|Make a copy)", text):
    shutil.copyfile(src, paths[2])
elif text.startswith("Move"):
    shutil.move(src, os.path.join(paths[2].rstrip("/"), name))
elif re.match(r"(Rename|Give)", text):
    os.rename(src, os.path.join(src_dir, paths[2]))
else:
    os.remove(src)
PY

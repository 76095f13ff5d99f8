#!/bin/bash
# Oracle: reads the instance's instruction ($SANDGYM_INSTRUCTION) and does what it asks.
set -euo pipefail
python3 - <<'PY'
import os, re, stat
text = os.environ["SANDGYM_INSTRUCTION"]
paths = re.findall(r"`([^`]*)`", text)
if "folder called" in text:
    os.makedirs(os.path.join(paths[1], paths[0]), exist_ok=True)
elif "folder at" in text:
    os.makedirs(paths[0], exist_ok=True)
elif "Store the single word" in text or "just that word" in text:
    open(paths[1], "w").write(paths[0] + "\n")
elif "execute" in text:
    os.chmod(paths[0], os.stat(paths[0]).st_mode | stat.S_IXUSR)
else:
    os.remove(paths[0])
PY

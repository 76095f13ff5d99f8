#!/bin/bash
# Oracle solution: reads the instance's instruction ($SANDGYM_INSTRUCTION), lists the directory
# when only a name prefix is given, then does what was asked.
set -euo pipefail
python3 - <<'PY'
import os, re, shutil
text = os.environ["SANDGYM_INSTRUCTION"]
quoted = re.findall(r"`([^`]+)`", text)
if "whose name" in text:  # a directory and the prefix of the file's name: look first
    d, prefix = quoted
    os.remove(os.path.join(d, next(n for n in os.listdir(d) if n.startswith(prefix))))
elif "directory" in text and text.startswith(("Delete", "Remove")):
    shutil.rmtree(quoted[0])
elif text.startswith(("Delete", "Remove")):
    os.remove(quoted[0])
elif "directory" in text:
    os.makedirs(quoted[0])
elif "word" in text:
    word, path = (quoted[0], quoted[1]) if text.startswith("Write") else (quoted[1], quoted[0])
    with open(path, "w") as f:
        f.write(word + "\n")
else:
    open(quoted[0], "w").close()
PY

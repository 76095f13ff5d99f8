#!/bin/bash
# Oracle solution.
set -euo pipefail
cat > /app/wc.py <<'EOF'
import sys

text = open(sys.argv[1], encoding="utf-8").read()
print(text.count("\n"), len(text.split()), len(text))
EOF

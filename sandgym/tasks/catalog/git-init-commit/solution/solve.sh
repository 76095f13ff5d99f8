#!/bin/bash
# Oracle solution.
set -euo pipefail
cd /app/project
git init -q -b main
echo 'build/' > .gitignore
git add -A
git -c user.name=Oracle -c user.email=oracle@example.com commit -q -m 'initial commit'

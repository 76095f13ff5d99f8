#!/bin/bash
# Oracle solution.
set -euo pipefail
cd /app/repo
git checkout -q main
git -c user.name=Oracle -c user.email=oracle@example.com merge -q --no-edit feature

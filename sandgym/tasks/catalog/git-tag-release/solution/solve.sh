#!/bin/bash
# Oracle solution.
set -euo pipefail
cd /app/repo
sha=$(git log --format='%H %s' | awk '$2 == "release:" && $3 == "1.0" {print $1}')
git -c user.name=Oracle -c user.email=oracle@example.com tag -a v1.0 -m 'Version 1.0' "$sha"

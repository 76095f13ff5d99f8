#!/bin/bash
# Oracle solution.
set -euo pipefail
cd /app/repo
bad=$(git log --format='%H %s' main | awk '$2 == "bump" && $3 == "timeout" {print $1}')
git -c user.name=Oracle -c user.email=oracle@example.com revert --no-edit "$bad"

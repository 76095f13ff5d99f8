#!/bin/bash
# Oracle solution.
set -euo pipefail
sed -i 's/\bcat\b/dog/g' /app/story.txt

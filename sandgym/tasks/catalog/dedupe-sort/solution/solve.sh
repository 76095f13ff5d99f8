#!/bin/bash
# Oracle solution.
set -euo pipefail
LC_ALL=C sort -u /app/names.txt > /app/unique.txt

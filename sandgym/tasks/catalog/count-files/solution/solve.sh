#!/bin/bash
# Oracle solution.
set -euo pipefail
find /app/tree -type f -name '*.log' | wc -l > /app/log_count.txt

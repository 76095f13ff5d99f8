#!/bin/bash
# Oracle solution.
set -euo pipefail
awk '{print $1}' /app/access.log | sort | uniq -c | sort -rn | head -3 | awk '{print $2}' > /app/top.txt

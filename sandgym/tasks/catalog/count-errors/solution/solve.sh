#!/bin/bash
# Oracle solution.
set -euo pipefail
grep -c 'ERROR' /app/logs/app.log > /app/error_count.txt

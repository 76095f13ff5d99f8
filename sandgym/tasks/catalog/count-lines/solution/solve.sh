#!/bin/bash
# Oracle solution.
set -euo pipefail
wc -l < /app/data.txt > /app/count.txt

#!/bin/bash
# Oracle solution.
set -euo pipefail
sort -n /app/numbers.txt > /app/sorted.txt

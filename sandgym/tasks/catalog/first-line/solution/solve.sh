#!/bin/bash
# Oracle solution.
set -euo pipefail
head -n 1 /app/data.txt > /app/first.txt

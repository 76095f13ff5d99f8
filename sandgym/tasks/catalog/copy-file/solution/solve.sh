#!/bin/bash
# Oracle solution.
set -euo pipefail
cp /app/input.txt /app/backup.txt

#!/bin/bash
# Oracle solution.
set -euo pipefail
chmod 750 /app/bin/deploy.sh

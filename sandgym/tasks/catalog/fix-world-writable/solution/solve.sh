#!/bin/bash
# Oracle solution.
set -euo pipefail
chmod -R o-w /app/www

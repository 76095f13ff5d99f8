#!/bin/bash
# Oracle solution.
set -euo pipefail
jq '[.[] | select(.active and .age > 30) | .name] | sort' /app/users.json > /app/result.json

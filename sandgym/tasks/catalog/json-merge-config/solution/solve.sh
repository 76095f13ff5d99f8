#!/bin/bash
# Oracle solution.
set -euo pipefail
jq -s '.[0] * .[1]' /app/defaults.json /app/override.json > /app/config.json

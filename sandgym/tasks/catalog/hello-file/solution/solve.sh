#!/bin/bash
# Oracle solution.
set -euo pipefail
printf 'Hello, world!\n' > /app/hello.txt

#!/bin/bash
# Oracle solution.
set -euo pipefail
awk -F: '$7 == "/bin/bash" {print $1}' /app/users.passwd | sort > /app/bash_users.txt

#!/bin/bash
# Oracle solution.
set -euo pipefail
python3 - <<'EOF'
import csv
from decimal import Decimal
with open("/app/sales.csv", newline="") as f:
    total = sum(Decimal(row["amount"]) for row in csv.DictReader(f))
open("/app/total.txt", "w").write(f"{total:.2f}\n")
EOF

#!/bin/bash
# Oracle solution.
set -euo pipefail
python3 - <<'EOF'
import csv, json
with open("/app/inventory.csv", newline="") as f:
    rows = [{"sku": r["sku"], "name": r["name"], "qty": int(r["qty"]), "price": float(r["price"])}
            for r in csv.DictReader(f)]
json.dump(rows, open("/app/inventory.json", "w"), indent=2)
EOF

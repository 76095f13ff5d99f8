#!/bin/bash
# Oracle solution.
set -euo pipefail
sed -i 's/range(1, n)/range(1, n + 1)/' /app/fizzbuzz.py
python3 - <<'EOF'
import re
src = open("/app/fizzbuzz.py").read()
src = src.replace('if i % 3 == 0:\n            out.append("Fizz")\n        elif i % 5 == 0:\n            out.append("Buzz")\n        elif i % 15 == 0:\n            out.append("FizzBuzz")',
                  'if i % 15 == 0:\n            out.append("FizzBuzz")\n        elif i % 3 == 0:\n            out.append("Fizz")\n        elif i % 5 == 0:\n            out.append("Buzz")')
open("/app/fizzbuzz.py", "w").write(src)
EOF

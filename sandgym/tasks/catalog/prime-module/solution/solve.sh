#!/bin/bash
# Oracle solution.
set -euo pipefail
cat > /app/mathutil.py <<'EOF'
def is_prime(n: int) -> bool:
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def primes_up_to(n: int) -> list[int]:
    return [k for k in range(2, n + 1) if is_prime(k)]
EOF

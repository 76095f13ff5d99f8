#!/bin/bash
# Oracle solution.
set -euo pipefail
cat > /app/with_timeout.sh <<'EOF'
#!/bin/bash
secs="$1"; shift
timeout "$secs" "$@"
rc=$?
if [ "$rc" -eq 124 ]; then echo TIMEOUT >&2; fi
exit "$rc"
EOF
chmod +x /app/with_timeout.sh

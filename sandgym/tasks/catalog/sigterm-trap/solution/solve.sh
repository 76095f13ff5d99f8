#!/bin/bash
# Oracle solution.
set -euo pipefail
cat > /app/worker.sh <<'EOF'
#!/bin/bash
trap 'echo "clean shutdown" >> /app/worker.log; exit 0' TERM
while true; do sleep 0.2; done
EOF
chmod +x /app/worker.sh

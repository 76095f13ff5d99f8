#!/bin/bash
# Oracle solution.
set -euo pipefail
cat > /app/start.sh <<'EOF'
#!/bin/bash
PORT="${PORT:-8080}"
cd /app/public
nohup python3 -m http.server "$PORT" --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &
echo $! > /app/server.pid
EOF
chmod +x /app/start.sh

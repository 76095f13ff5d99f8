#!/bin/bash
# Oracle solution.
set -euo pipefail
cat > /app/procinfo.sh <<'EOF'
#!/bin/bash
[ -r "/proc/$1/status" ] || exit 1
name=$(cat "/proc/$1/comm")
ppid=$(awk '/^PPid:/ {print $2}' "/proc/$1/status")
echo "$name $ppid"
EOF
chmod +x /app/procinfo.sh

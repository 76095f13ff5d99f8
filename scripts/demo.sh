#!/usr/bin/env bash
# Quickstart 1: set up, start the env server on the local backend, play one demo episode.
#   bash scripts/demo.sh [TASK_ID]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TASK=${1:-builtin/hello-file}
PORT=${SANDGYM_PORT:-8765}
LOG=$(mktemp /tmp/sandgym-serve.XXXX.log)
.venv/bin/sandgym serve --port "$PORT" --backend local >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.2
done
echo "== env server up on ws://127.0.0.1:$PORT/v1/env (log: $LOG)" >&2
echo "== tasks served: $(curl -fsS http://127.0.0.1:$PORT/v1/tasks | .venv/bin/python -c 'import json,sys; print(len(json.load(sys.stdin)["tasks"]))')" >&2
echo "== oracle episode on $TASK" >&2
.venv/bin/sandgym run --task "$TASK" --agent oracle --server "ws://127.0.0.1:$PORT/v1/env"
echo "== no-op episode on $TASK" >&2
.venv/bin/sandgym run --task "$TASK" --agent noop --server "ws://127.0.0.1:$PORT/v1/env"

#!/usr/bin/env bash
# How lab/bench/results/harbor_compat_tb1.json was made (resumable): the Terminal-Bench 1 task set
# as CAMEL stores it (94 tasks, which CAMEL fetched from laude-institute/terminal-bench at
# 3313fc54adb58a0260a02de7db19fabb4bd31867), brought in by hand (never committed) into $TB1:
#   git --git-dir=<camel-ai/camel> ls-tree -r 7955886894c2051654d09f7fc0478382b455cb45 \
#     examples/workforce/terminal_bench/tasks   (then `git cat-file blob` each file)
# $TB1.absent.json lists the files that copy lacks ({task: [paths]}).
#   TB1=/tmp/tb1 bash lab/bench/harbor_compat_tb1_run.sh [more options, e.g. --rerun TASK]
set -euo pipefail
cd "$(dirname "$0")/.."
TB1="${TB1:?set TB1 to the folder holding the 94 task directories}"
WORK="${WORK:-/tmp/hc-tb1}"
OUT="${OUT:-bench/results/harbor_compat_tb1}"
mkdir -p "$WORK"
absent=""; [ -f "$TB1.absent.json" ] && absent="$TB1.absent.json"
exec .venv/bin/sandgym bench harbor_compat \
  --tasks-dir "$TB1" --source-name terminal-bench-1 \
  --source-repo camel-ai/camel --source-commit 7955886894c2051654d09f7fc0478382b455cb45 \
  --source-path examples/workforce/terminal_bench/tasks \
  --source-note "all 94 Terminal-Bench 1 task directories CAMEL stores (fetched by CAMEL from laude-institute/terminal-bench at 3313fc54adb58a0260a02de7db19fabb4bd31867; 5 of its files are absent from the stored copy: see absent_files)" \
  --source-sample "" --source-absent "$absent" \
  --substitute --work-dir "$WORK/work" --jsonl "$OUT.jsonl" --resume \
  --out "$OUT.json" \
  --task-timeout-s 0 --concurrency 1 --infra-retries 1 --prune-images --dns-log "$@"

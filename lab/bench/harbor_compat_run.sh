#!/usr/bin/env bash
# How lab/bench/results/harbor_compat.json was made (resumable): the task sets are brought in by hand
# (never committed) from the repositories and commits named below, into $SETS/tb2 (every
# terminal-bench-2/ task directory) and $SETS/termigen (a seeded sample of 50 of
# environments_harbor/: the task names sorted, random.Random(17).shuffle, the first 50).
#   SETS=/path/to/sets bash lab/bench/harbor_compat_run.sh [more options, e.g. --rerun TASK]
set -euo pipefail
cd "$(dirname "$0")/.."
SETS="${SETS:?set SETS to the folder holding tb2/ and termigen/}"
WORK="${WORK:-/tmp/hc}"
mkdir -p "$WORK"
absent=""; [ -f "$SETS/tb2.absent.json" ] && absent="$SETS/tb2.absent.json"
exec .venv/bin/sandgym bench harbor_compat \
  --tasks-dir "$SETS/tb2" --source-name terminal-bench-2.0 \
  --source-repo yujianll/skill-usage --source-commit f9f89fadc42150d0b3de9dfa8ff31da31607ca89 \
  --source-path terminal-bench-2 \
  --source-note "all 89 Terminal-Bench 2.0 task directories of the public copy (4 of its files, in 3 tasks, are absent from the stored copy: see absent_files)" \
  --source-sample "" --source-absent "$absent" \
  --tasks-dir "$SETS/termigen" --source-name termigen \
  --source-repo zjysteven/terminal-bench-env --source-commit aaad6aeff9b58ab7504a7d239f01f8b11c7174ef \
  --source-path environments_harbor \
  --source-note "seeded sample of 50: the 3566 task names sorted, random.Random(17).shuffle, first 50" \
  --source-sample "" --source-absent "" \
  --image-map debian:13.0-slim=debian:13 \
  --image-map python:3.11=python:3.11-slim \
  --substitute --work-dir "$WORK/work" --jsonl lab/bench/results/harbor_compat.jsonl --resume \
  --out lab/bench/results/harbor_compat.json \
  --task-timeout-s 600 --concurrency 3 --infra-retries 1 --prune-images "$@"

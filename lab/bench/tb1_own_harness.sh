#!/usr/bin/env bash
# Terminal-Bench 1's own harness on the tasks of lab/bench/results/harbor_compat_tb1.json, for a
# task-by-task comparison with sandgym's run (lab/bench/results/tb1_own_harness.json):
#   TB1=/tmp/tb1 bash lab/bench/tb1_own_harness.sh oracle TASK ...   (then: nop TASK ...)
#   .venv/bin/python -m lab.bench.tb1_own_harness report --runs "$WORK/runs" ...
# What runs, and on what:
# - the released harness: terminal-bench 0.2.18 from the package index (`tb run`, its oracle or
#   nop agent, its test parser, its limits: max_test_timeout_sec x 1.0), run in a container of
#   images/terminal-bench-harness (`sandgym/terminal-bench-harness:0.2.18`, built here when the
#   engine lacks it: the package installed on the python:3.13-slim stand-in, Debian trixie's
#   CPython 3.13; the harness needs >= 3.12, this host has 3.11; the same image the parser
#   parity test runs), driving this host's engine through its socket and the host's docker CLI;
# - `docker compose` v2 and buildx, which the harness calls and which Debian bookworm does not
#   package: Debian trixie's docker-compose 2.26.1-4 and docker-buildx 0.13.1+ds1-3, unpacked
#   from Debian's mirror into $WORK/docker/cli-plugins (DOCKER_CONFIG for this run only), so
#   the tasks build with BuildKit, as the harness builds them;
# - the tasks: copies with the same substitutions sandgym's run made (`prepare`), on the same
#   local stand-in images (ghcr.io/laude-institute/t-bench/... by name).
# A trial the harness stopped before its tests (no verdict) may be run again by naming its task
# in a later run; `report --runs` takes the runs in order (lab/bench/tb1_own_harness.py).
# DOCKER_SOCK: the engine the harness drives (default: this host's, /var/run/docker.sock); a
# second engine's socket runs the trials there (the runner container itself, the re-tagging
# and the stand-ins stay on this host's engine; load the images a task needs into the second).
set -euo pipefail
cd "$(dirname "$0")/.."
agent="${1:?usage: tb1_own_harness.sh oracle|nop TASK ...}"; shift
TB1="${TB1:?set TB1 to the folder holding the 94 task directories}"
WORK="${WORK:-/tmp/tbpeer}"
TB_VERSION=0.2.18
RUNNER_IMAGE="${RUNNER_IMAGE:-sandgym/terminal-bench-harness:$TB_VERSION}"
DOCKER_SOCK="${DOCKER_SOCK:-/var/run/docker.sock}"
mirror=http://deb.debian.org/debian/pool/main/d
mkdir -p "$WORK/docker/cli-plugins" "$WORK/runs" "$WORK/debs"
for deb in docker-compose/docker-compose_2.26.1-4_amd64.deb \
           docker-buildx/docker-buildx_0.13.1+ds1-3_amd64.deb; do
  f="$WORK/debs/$(basename "$deb")"
  [ -s "$f" ] || curl -fsSL -o "$f" "$mirror/$deb"
  tmp=$(mktemp -d); dpkg-deb -x "$f" "$tmp"
  cp "$tmp"/usr/libexec/docker/cli-plugins/* "$WORK/docker/cli-plugins/"; rm -rf "$tmp"
done
.venv/bin/python -m lab.bench.tb1_own_harness prepare --tasks-dir "$TB1" --out "$WORK/tasks" \
  --work-dir "$WORK/subst" "$@"
# The harness ends each trial with `docker compose down --rmi all`, which untags the images its
# services ran, a stand-in's public name too (postgres:15, jpillora/dnsmasq): tag them again
# before the run (a later trial needs them) and after it (sandgym's runs do).
retag() { .venv/bin/python -m lab.images_cli build --no-progress >/dev/null; }
retag
docker image inspect "$RUNNER_IMAGE" >/dev/null 2>&1 ||
  DOCKER_BUILDKIT=0 docker build -q -t "$RUNNER_IMAGE" images/terminal-bench-harness >/dev/null
ids=(); for t in "$@"; do ids+=(--task-id "$t"); done
run_id="$agent-$(date -u +%Y%m%d-%H%M%S)"  # compose wants lower case
docker run --rm --network host \
  -v "$DOCKER_SOCK":/var/run/docker.sock -v /usr/bin/docker:/usr/bin/docker:ro \
  -v "$WORK:$WORK" -w "$WORK" -e DOCKER_CONFIG="$WORK/docker" -e HOME="$WORK/home" -e LITELLM_LOCAL_MODEL_COST_MAP=True \
  "$RUNNER_IMAGE" bash -euc "
    test \"\$(python3 -c 'import importlib.metadata as m; print(m.version(\"terminal-bench\"))')\" = $TB_VERSION
    tb run --dataset-path $WORK/tasks --agent $agent ${ids[*]} \
      --n-concurrent 1 --output-path $WORK/runs --run-id $run_id --no-upload-results \
      --no-livestream
  "
retag
# the engine the trials ran on, beside the harness's own files (the report keeps it per run)
docker -H "unix://$DOCKER_SOCK" version --format '{{json .Server}}' >"$WORK/runs/$run_id/engine.json"
echo "$WORK/runs/$run_id"

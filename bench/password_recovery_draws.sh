#!/usr/bin/env bash
# Terminal-Bench 1's password-recovery, drawn again and again: how often its own oracle passes.
# Its image build runs setup.sh, which writes 4 MB of /dev/urandom as the "disk" and puts the
# two halves of the password's zip at 1 MB and 3 MB; its solution.sh takes the FIRST "8XD" and
# the FIRST "W54" in that disk, so a draw whose random bytes hold either sequence earlier fails.
# Each trial here runs the task's own setup.sh in an empty /app, then its own solution.sh there,
# and scores it by the task's own test rule (the password is one of the lines of
# /app/recovered_passwords.txt), in a container of the task's base image (its local stand-in
# where no registry answers) with the two packages setup.sh needs.
#   TASK=<the task directory> bash bench/password_recovery_draws.sh [N] > OUT.json
set -euo pipefail
cd "$(dirname "$0")/.."
TASK="${TASK:?set TASK to the password-recovery task directory}"
N="${1:-200}"
IMAGE=ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
trials='set -u
apt-get update -qq >/dev/null && apt-get install -y -qq zip binutils >/dev/null 2>&1 || exit 9
ok=0; nofile=0
for i in $(seq 1 "$0"); do
  rm -rf /app; mkdir -p /app
  bash /task/setup.sh >/dev/null 2>&1
  (cd /app && bash /task/solution.sh >/dev/null 2>&1)
  if [ ! -f /app/recovered_passwords.txt ]; then nofile=$((nofile+1))
  elif grep -qx 8XDP5Q2RT9ZK7VB3BV4WW54 /app/recovered_passwords.txt; then ok=$((ok+1)); fi
done
echo "$ok $nofile"'
read -r ok nofile < <(docker run --rm -v "$(realpath "$TASK")":/task:ro "$IMAGE" bash -c "$trials" "$N")
image_id="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
stand_in="$(docker image inspect -f '{{index .Config.Labels "sandgym.stand-in-from"}}' "$IMAGE")"
cat <<JSON
{
 "bench": "password_recovery_draws",
 "task": "terminal-bench-1/password-recovery",
 "task_files_sha256": {"setup.sh": "$(sha256sum "$TASK/setup.sh" | cut -d' ' -f1)", "solution.sh": "$(sha256sum "$TASK/solution.sh" | cut -d' ' -f1)"},
 "image": "$IMAGE",
 "image_id": "$image_id",
 "image_stand_in_from": "$stand_in",
 "trials": $N,
 "oracle_passes": $ok,
 "no_recovery_file": $nofile,
 "provenance": {"command": "TASK=$TASK bash bench/password_recovery_draws.sh $N", "git_commit": "$(git rev-parse HEAD)", "git_dirty": $( [ -z "$(git status --porcelain --untracked-files=no -- . ':!bench/results')" ] && echo false || echo true ), "started_at": "$started", "written_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
}
JSON

"""Terminal-Bench 1's password-recovery drawn again and again: how often its own oracle passes.

    python -m lab.bench.password_recovery_draws --task DIR [--trials 400] [--out FILE]

The task's image build runs its setup.sh, which writes 4 MB of /dev/urandom as a "disk" and puts
the two halves of the password's zip at 1 MB and 3 MB. Its solution.sh takes the FIRST "8XD"
and the FIRST "W54" in that disk, so a draw whose random bytes hold either sequence earlier
recovers no password: the oracle then fails under any harness. Each trial here runs the task's
own setup.sh in an empty /app, then its own solution.sh there, and scores it by the task's own
test rule (the password is one of the lines of /app/recovered_passwords.txt), in one container
of the task's base image (its local stand-in where no registry answers) with the two packages
setup.sh needs (zip, binutils). Prints the result as JSON (`--out` also writes it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab.bench.report import save_json, start_run
from lab.images import LABEL_STANDIN_FROM, ImageEngine

IMAGE = "ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"
PASSWORD = "8XDP5Q2RT9ZK7VB3BV4WW54"  # what the task's setup.sh writes and its test looks for

#: the trials, inside the container: `bash -c TRIALS N`; prints "<passes> <no recovery file>"
TRIALS = f"""set -u
apt-get update -qq >/dev/null && apt-get install -y -qq zip binutils >/dev/null 2>&1 || exit 9
ok=0; nofile=0
for i in $(seq 1 "$0"); do
  rm -rf /app; mkdir -p /app
  bash /task/setup.sh >/dev/null 2>&1
  (cd /app && bash /task/solution.sh >/dev/null 2>&1)
  if [ ! -f /app/recovered_passwords.txt ]; then nofile=$((nofile+1))
  elif grep -qx {PASSWORD} /app/recovered_passwords.txt; then ok=$((ok+1)); fi
done
echo "$ok $nofile"
"""


def draws(task: Path, trials: int) -> dict[str, Any]:
    """Run `trials` draws of `task` (its directory) and count the passes."""
    proc = subprocess.run(
        ["docker", "run", "--rm", "-v", f"{task.resolve()}:/task:ro", IMAGE,
         "bash", "-c", TRIALS, str(trials)],
        capture_output=True, text=True, timeout=60 + 10 * trials, check=False,
    )  # fmt: skip
    fields = proc.stdout.split()
    if proc.returncode != 0 or len(fields) != 2:
        raise RuntimeError(f"the trials failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    passes, no_file = int(fields[0]), int(fields[1])
    image = ImageEngine().info(IMAGE)
    if image is None:
        raise RuntimeError(f"{IMAGE} is gone from the engine after the trials ran on it")
    return {
        "bench": "password_recovery_draws",
        "task": "terminal-bench-1/password-recovery",
        "task_files_sha256": {
            name: hashlib.sha256((task / name).read_bytes()).hexdigest()
            for name in ("setup.sh", "solution.sh")
        },
        "image": IMAGE,
        "image_id": image.id,
        "image_stand_in_from": image.labels.get(LABEL_STANDIN_FROM, ""),
        "trials": trials,
        "oracle_passes": passes,
        "oracle_pass_share": round(passes / trials, 3),
        "no_recovery_file": no_file,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", type=Path, required=True, help="the password-recovery directory")
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    start_run(shlex.join(["python", "-m", "lab.bench.password_recovery_draws", *sys.argv[1:]]))
    doc = draws(args.task, args.trials)
    save_json(doc, args.out)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

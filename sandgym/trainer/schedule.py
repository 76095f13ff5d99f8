"""The run's schedule across restarts: which task and seed each group gets, the engines' sampling
seeds, what a checkpoint records of the schedule, and how many checkpoints are kept.

- Training seeds never meet evaluation seeds, by construction: group g gets the g-th integer at or
  above `env.seed_start` that is not one of `env.eval_seeds` (`training_seed`), so no amount of
  training reaches a held-out seed; the config refuses duplicate evaluation seeds at load.
- A checkpoint holds `schedule.json`: the next group to dispatch and the version, so a resumed run
  continues the task/seed schedule where the run stopped instead of starting again at group 0
  (groups that were in flight when the checkpoint was taken are skipped, not replayed).
- Engine sampling seeds (`engine_seed`) differ per worker, per restart of the run (its start
  version) and per replacement of a worker, so a resumed run or a replaced actor does not
  re-draw the samples the first one drew.
- `prune_checkpoints` keeps the newest `run.keep_checkpoints` step directories (never the one
  `latest.json` names).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEDULE_NAME = "schedule.json"


def training_seed(seed_start: int, eval_seeds: list[int], group: int) -> int:
    """The seed of training group `group`: the `group`-th integer >= `seed_start` that is not an
    evaluation seed."""
    s = seed_start + group
    for e in sorted({e for e in eval_seeds if e >= seed_start}):
        if e <= s:
            s += 1
        else:
            break
    return s


def engine_seed(run_seed: int, worker_index: int, start_version: int, restarts: int) -> int:
    """A sampling seed for rollout worker `worker_index` of a run (re)started at
    `start_version`, the `restarts`-th actor in that slot: distinct for every combination (a
    31-bit hash), stable for the same one."""
    key = f"{run_seed}/{worker_index}/{start_version}/{restarts}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


def write_schedule(checkpoint: str | Path, next_group: int, version: int) -> None:
    """Record in a checkpoint directory where the schedule stands."""
    path = Path(checkpoint) / SCHEDULE_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"next_group": next_group, "version": version}))
    tmp.replace(path)


def read_schedule(checkpoint: str | Path, version: int, groups_per_update: int) -> int:
    """The next group to dispatch after resuming from `checkpoint`. A checkpoint without a
    schedule (written before schedules were recorded, or cut off between the weights and the
    schedule) resumes after the groups its `version` updates consumed at least, with a warning."""
    path = Path(checkpoint) / SCHEDULE_NAME
    if path.is_file():
        data: dict[str, Any] = json.loads(path.read_text())
        return int(data["next_group"])
    guess = version * groups_per_update
    log.warning(
        "%s has no %s: resuming the task/seed schedule at group %d (%d updates x %d groups)",
        checkpoint, SCHEDULE_NAME, guess, version, groups_per_update,
    )  # fmt: skip
    return guess


def prune_checkpoints(checkpoints: str | Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` `step_*` directories under `checkpoints` (0 keeps all);
    the one `latest.json` names is always kept. Returns the removed paths."""
    root = Path(checkpoints)
    if keep <= 0 or not root.is_dir():
        return []
    latest = None
    if (root / "latest.json").is_file():
        latest = Path(json.loads((root / "latest.json").read_text())["path"]).name
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    steps = [p for p in steps if not p.name.endswith(".tmp")]
    removed = []
    for p in steps[: max(0, len(steps) - keep)]:
        if p.name == latest:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(str(p))
    return removed

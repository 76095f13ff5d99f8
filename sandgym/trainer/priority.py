"""CPU priority of sandgym's Ray actors: ordinary processes, not Ray's niced workers.

Ray starts its worker processes at nice 15 (Ray's `worker_niceness`), below every ordinary
process on the node. On a node that is busy with anything else (the sandboxes' own commands,
docker containers, another job) sandgym's actors (env servers, rollout workers, learners) then
get a small share of a core: with two CPU hogs on 2 cores, two env server actors took 3 minutes
to start instead of seconds (measured, `tests/e2e/test_cluster_train.py`). Ray's own job
manager starts job drivers with `RAY_worker_niceness=0` for the same reason.

- `RAY_ENV`: set in the environment of whatever starts a raylet (`ray start`, or `ray.init`
  starting a local instance; `local_ray_env()` does so for sandgym's own), its workers start at
  nice 0;
- `normal_priority()`: an actor started niced all the same (a cluster started without it) lifts
  itself to nice 0 where it may (root, or CAP_SYS_NICE), and says so once where it may not.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

#: the raylet's setting for its workers' nice value
RAY_ENV = "RAY_worker_niceness"


def local_ray_env() -> None:
    """Before `ray.init` starts a local Ray: its workers at nice 0 (unless the caller set it)."""
    os.environ.setdefault(RAY_ENV, "0")


def normal_priority() -> int:
    """Lift every thread of this process below nice 0 to nice 0 (on Linux each thread has its
    own nice value); returns the calling thread's nice value afterwards."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    refused = False
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > 0:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
        except PermissionError:
            refused = True
        except OSError:  # the thread ended meanwhile
            continue
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if refused:
        log.warning(
            "this process runs at nice %d and may not lower it (no CAP_SYS_NICE): start the Ray "
            "nodes with %s=0 so that sandgym's actors are not starved on a busy node",
            now,
            RAY_ENV,
        )
    return now

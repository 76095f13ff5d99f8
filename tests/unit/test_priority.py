"""sandgym/trainer/priority.py: sandgym's Ray actors run as ordinary processes, not at Ray's nice 15
(where a busy node starves them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, env: dict[str, str] | None = None, nice: int = 0) -> str:
    argv = [sys.executable, "-c", textwrap.dedent(code)]
    if nice:
        argv = ["nice", "-n", str(nice), *argv]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice value needs root")
def test_normal_priority_lifts_every_thread_of_a_niced_process() -> None:
    code = """
        import os, threading
        started = threading.Event(); stop = threading.Event()
        t = threading.Thread(target=lambda: (started.set(), stop.wait())); t.start(); started.wait()
        from sandgym.trainer.priority import normal_priority
        before = sorted({os.getpriority(os.PRIO_PROCESS, int(x)) for x in os.listdir("/proc/self/task")})
        now = normal_priority()
        after = sorted({os.getpriority(os.PRIO_PROCESS, int(x)) for x in os.listdir("/proc/self/task")})
        stop.set(); t.join()
        print(before, now, after)
    """
    assert _run(code, nice=15) == "[15] 0 [0]"


def test_a_local_ray_started_by_sandgym_runs_its_workers_at_nice_0() -> None:
    pytest.importorskip("ray")
    code = """
        import os, ray
        from sandgym.trainer.priority import local_ray_env
        local_ray_env()
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        @ray.remote(num_cpus=0)
        class A:
            def nice(self):
                return os.nice(0)
        print(ray.get(A.remote().nice.remote()))
        ray.shutdown()
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    assert _run(code, env=env) == "0"

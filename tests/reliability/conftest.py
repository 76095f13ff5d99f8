"""Shared helpers of the reliability suite: a small task directory, Docker probes, and ways to
count the containers one server process owns.

The suite drives real servers: `ServerProcess` (`sandgym serve` as a child process, so it can be
SIGKILLed and its RSS read) or `BackgroundServer` (in a thread, so tests can look inside). The
task `rel-task` runs on `sandgym/terminal:latest` by name (no build), with small limits so the
abuse tests hit them quickly: 256 MiB memory, 128 pids, 1 CPU, 64 MiB storage where supported.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lab.bench.reliability import IMAGE, REL_TASK, write_rel_task

__all__ = ["IMAGE", "REL_TASK", "write_rel_task"]


@pytest.fixture(scope="session")
def rel_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rel_task(tmp_path_factory.mktemp("reltasks"))


def docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.images.get(IMAGE)
        client.close()
        return True
    except Exception:
        return False


def local_ready() -> bool:
    return shutil.which("bwrap") is not None


needs_docker = pytest.mark.skipif(not docker_ready(), reason=f"no Docker engine or no {IMAGE}")
needs_local = pytest.mark.skipif(not local_ready(), reason="bubblewrap (bwrap) not installed")


def containers_of_pid(pid: int) -> list[str]:
    """Names of the sandgym containers (any state) whose owner label is process `pid`."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "-q",
            "--filter",
            "label=sandgym.managed=1",
            "--filter",
            f"label=sandgym.owner_pid={pid}",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return out.split()

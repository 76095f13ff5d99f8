"""Sandboxes with a hard lifetime end by themselves when their server is gone
(`sandboxes.lifetime`): no server, no reaper, nothing on the host removes them.

- docker: the server is SIGKILLed with one episode leased and a ready sandbox in its pool; the
  containers keep running under the engine (nothing stops them), then each ends itself once its
  deadline passes (the ready one `sandbox_grace_s` after the last refresh, the leased one at the
  end of its episode's limits): its own init exits.
- local: a killed server's sandboxes die with it (bwrap's --die-with-parent), so the case left is
  a server that hangs: SIGSTOPped, it neither refreshes nor ends anything, and the sandboxes'
  own init ends them at their deadline.

Ends are polled with a generous bound; how fast is not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from envserver.client import AsyncEnvClient
from envserver.runner import ServerProcess
from tests.reliability.conftest import (
    IMAGE,
    containers_of_pid,
    needs_docker,
    needs_local,
    wait_until,
)

TASK = "life-task"
#: short limits, so a leased sandbox's deadline (time limit + verifier timeout) comes soon
ENV = {
    "SANDGYM_INCLUDE_BUILTIN": "false",
    "SANDGYM_SANDBOX_GRACE_S": "5",
    "SANDGYM_EPISODE_TIME_LIMIT_S": "10",
}


def write_task(root: Path) -> Path:
    t = root / TASK
    (t / "tests").mkdir(parents=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 5\n[environment]\n'
        f'docker_image = "{IMAGE}"\nnetwork_mode = "no-network"\n'
    )
    (t / "instruction.md").write_text("Do nothing.\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def running_containers(pid: int) -> list[str]:
    names = containers_of_pid(pid)
    if not names:
        return []
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}}", *names],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()
    return [n for n, running in zip(names, out, strict=False) if running == "true"]


async def lease_one_and_fill_pool(srv: ServerProcess, live: Any) -> AsyncEnvClient:
    """One episode leased, then wait for the pool's replacement (a ready sandbox)."""
    client = AsyncEnvClient(srv.url, request_timeout_s=120)
    await client.reset(TASK)
    await wait_until(lambda: len(live()) >= 2, 120.0, 0.2, "a leased and a ready sandbox")
    return client


@pytest.mark.docker
@needs_docker
async def test_docker_sandboxes_end_themselves_after_server_is_killed(tmp_path: Path) -> None:
    tasks = write_task(tmp_path / "tasks")
    srv = await asyncio.to_thread(
        ServerProcess,
        "docker",
        args=["--tasks", str(tasks), "--pool-size", "1"],
        env={**ENV, "SANDGYM_REAP_ON_START": "false"},
        startup_timeout_s=120,
    )
    pid = srv.pid
    client = None
    try:
        client = await lease_one_and_fill_pool(srv, lambda: running_containers(pid))
        srv.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(srv.proc.wait, 30)
        with contextlib.suppress(Exception):
            await client.drop_connection()
        # Nothing stopped them: the engine keeps a killed server's containers running.
        names = await asyncio.to_thread(running_containers, pid)
        assert len(names) >= 2, names
        await wait_until(
            lambda: not running_containers(pid), 120.0, 1.0, "every sandbox ended by itself"
        )
        for name in names:  # each still there, exited: its init ended it (status 0), no reaper
            state = await asyncio.to_thread(
                subprocess.run,
                ["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert state.stdout.strip() == "exited 0", (name, state.stdout)
    finally:
        await asyncio.to_thread(srv.stop)
        names = await asyncio.to_thread(containers_of_pid, pid)
        if names:
            await asyncio.to_thread(
                subprocess.run, ["docker", "rm", "-f", *names], capture_output=True, timeout=120
            )


def local_sandbox_pids(root: Path) -> dict[str, list[int]]:
    """The bwrap processes of the local sandbox trees under `root`, by tree: bwrap stays as
    long as the namespace's pid 1 (the sandbox's init) lives, and ends with it."""
    found: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"bwrap"):
            continue
        for arg in argv:
            path = arg.decode(errors="replace")
            if path.startswith(str(root) + "/sg-") and path.endswith("/fs"):
                found.setdefault(Path(path).parent.name, []).append(int(proc.name))
                break
    return found


@needs_local
async def test_local_sandboxes_end_themselves_when_server_hangs(tmp_path: Path) -> None:
    from sandboxes.reaper import reap

    tasks = write_task(tmp_path / "tasks")
    root = tmp_path / "local"
    srv = await asyncio.to_thread(
        ServerProcess,
        "local",
        args=["--tasks", str(tasks), "--pool-size", "1"],
        env={
            **ENV,
            "SANDGYM_REAP_ON_START": "false",
            "SANDGYM_BACKEND_OPTIONS": json.dumps({"root": str(root)}),
        },
    )
    stopped = False
    try:
        await lease_one_and_fill_pool(srv, lambda: local_sandbox_pids(root))
        srv.proc.send_signal(signal.SIGSTOP)  # hung: no refresh, no cleanup, still its parent
        stopped = True
        assert len(local_sandbox_pids(root)) >= 2
        await wait_until(
            lambda: not local_sandbox_pids(root), 120.0, 1.0, "every sandbox ended by itself"
        )
        assert srv.proc.poll() is None  # the server did not end them: it is still there, stopped
    finally:
        if stopped:
            srv.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(srv.proc.wait, 30)
        await asyncio.to_thread(srv.stop)
        await reap(["local"], local_root_dir=root, everything=True)

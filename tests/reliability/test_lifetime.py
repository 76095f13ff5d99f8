"""Sandboxes with a hard lifetime end by themselves when their server is gone
(`sandgym.sandboxes.lifetime`): no server, no reaper, nothing on the host removes them.

- docker: the server is SIGKILLed with one episode leased and a ready sandbox in its pool; the
  containers keep running under the engine (nothing stops them), then each ends itself once its
  deadline passes (the ready one `sandbox_grace_s` after the last refresh, the leased one at the
  end of its episode's limits): its own init exits.
- local: a killed server's sandboxes die with it (bwrap's --die-with-parent), so the case left is
  a server that hangs: SIGSTOPped, it neither refreshes nor ends anything, and the sandboxes'
  own init ends them at their deadline.

- made outside a pool (`sandgym.sandboxes.lifetime.OwnLifetimes`): a separate verifier's sandbox, made
  by the server while it scores, ends by itself after the server is SIGKILLed mid-verification
  (its verifier's timeout plus the grace after it was made); `sandgym tasks check`'s sandbox
  ends by itself after the command is SIGKILLed mid-oracle (the task's limits plus the grace);
  the private verifier's container beside a docker sandbox ends by itself after the server is
  SIGKILLed mid-verification (its timeout plus the grace after it started).
- the services beside a docker sandbox (a compose task): after the server is SIGKILLed, each
  ends by itself at the sandbox's deadline (its pid 1 keeper, `sandgym.sandboxes.docker.service_life`).

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

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import ServerProcess
from tests.reliability.conftest import (
    IMAGE,
    containers_of_pid,
    needs_docker,
    needs_local,
)
from tests.waiting import wait_until

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


async def start_docker_server(tasks: Path, pool_size: int, startup_s: float = 120) -> ServerProcess:
    """A docker-backend `sandgym serve` process on `tasks`, with no reap at its start (the test
    counts what a killed one left)."""
    return await asyncio.to_thread(
        ServerProcess,
        "docker",
        args=["--tasks", str(tasks), "--pool-size", str(pool_size)],
        env={**ENV, "SANDGYM_REAP_ON_START": "false"},
        startup_timeout_s=startup_s,
    )


async def kill_server(
    srv: ServerProcess, client: AsyncEnvClient | None, scoring: asyncio.Task[Any] | None = None
) -> None:
    """SIGKILL the server (its reaper with it), then end this side: the submit it left waiting
    (`scoring`) and the client's connection."""
    srv.proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(srv.proc.wait, 30)
    if scoring is not None:
        scoring.cancel()
        with contextlib.suppress(BaseException):
            await scoring
    if client is not None:
        with contextlib.suppress(Exception):
            await client.drop_connection()


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
    srv = await start_docker_server(tasks, pool_size=1)
    pid = srv.pid
    client = None
    try:
        client = await lease_one_and_fill_pool(srv, lambda: running_containers(pid))
        await kill_server(srv, client)
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
    from sandgym.sandboxes.reaper import reap

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


def container_state(name: str) -> str:
    """`<status> <exit code>` of container `name`, as the engine reports it."""
    return subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()


def containers_labelled(pid: int, label: str) -> list[str]:
    """Ids of the containers (any state) of server `pid` that carry `label` (key=value)."""
    return subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=sandgym.owner_pid={pid}"]
        + ["--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()


async def remove_containers(pid: int) -> None:
    names = await asyncio.to_thread(containers_of_pid, pid)
    if names:
        await asyncio.to_thread(
            subprocess.run, ["docker", "rm", "-f", *names], capture_output=True, timeout=120
        )
    await asyncio.to_thread(
        subprocess.run,
        ["docker", "network", "prune", "-f", "--filter", f"label=sandgym.owner_pid={pid}"],
        capture_output=True,
        timeout=120,
    )


SEP_TASK = "life-sep-task"


def write_separate_verifier_task(root: Path) -> Path:
    """A task whose tests run in a sandbox of their own (Harbor's separate verifier) and hang
    there: the server is still scoring when it is killed."""
    t = root / SEP_TASK
    (t / "tests").mkdir(parents=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[environment]\n'
        f'docker_image = "{IMAGE}"\nnetwork_mode = "no-network"\n'
        '[verifier]\ntimeout_sec = 8\nenvironment_mode = "separate"\n'
        f'[verifier.environment]\ndocker_image = "{IMAGE}"\n'
    )
    (t / "instruction.md").write_text("Do nothing.\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 600\n")
    return root


@pytest.mark.docker
@needs_docker
async def test_separate_verifier_sandbox_ends_itself_after_server_is_killed(
    tmp_path: Path,
) -> None:
    tasks = write_separate_verifier_task(tmp_path / "tasks")
    srv = await start_docker_server(tasks, pool_size=0)
    pid = srv.pid
    client = AsyncEnvClient(srv.url, request_timeout_s=120)
    scoring = None
    try:
        await client.reset(SEP_TASK)
        (leased,) = await asyncio.to_thread(running_containers, pid)
        scoring = asyncio.create_task(client.step({"kind": "submit"}))
        # the server made the verifier's own sandbox (outside its pool) and runs the tests there
        await wait_until(
            lambda: len(running_containers(pid)) >= 2, 120.0, 0.2, "the verifier's sandbox"
        )
        await kill_server(srv, client, scoring)
        verifier = [n for n in await asyncio.to_thread(running_containers, pid) if n != leased]
        assert len(verifier) == 1, verifier  # nothing stopped it with the server
        await wait_until(
            lambda: not running_containers(pid), 120.0, 1.0, "the verifier's sandbox ended"
        )
        # still there, exited: its own init ended it (status 0), no server or reaper did
        assert await asyncio.to_thread(container_state, verifier[0]) == "exited 0"
    finally:
        if scoring is not None and not scoring.done():
            scoring.cancel()
        await asyncio.to_thread(srv.stop)
        await remove_containers(pid)


COMPOSE_TASK = "life-compose-task"


def write_compose_task(root: Path) -> Path:
    """A task with one service beside main, running a command of the compose file's."""
    t = root / COMPOSE_TASK
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "environment" / "Dockerfile").write_text(f"FROM {IMAGE}\n")
    (t / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main: {}\n  side:\n"
        f"    image: {IMAGE}\n"
        '    command: ["sh", "-c", "echo up > /tmp/up; exec sleep infinity"]\n'
    )
    (t / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 5\n[environment]\nnetwork_mode = "no-network"\n'
    )
    (t / "instruction.md").write_text("Do nothing.\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


@pytest.mark.docker
@needs_docker
async def test_compose_service_ends_itself_after_server_is_killed(tmp_path: Path) -> None:
    tasks = write_compose_task(tmp_path / "tasks")
    srv = await start_docker_server(tasks, pool_size=0, startup_s=180)
    pid = srv.pid
    client = AsyncEnvClient(srv.url, request_timeout_s=180)
    try:
        await client.reset(COMPOSE_TASK)
        (side,) = await asyncio.to_thread(containers_labelled, pid, "sandgym.service=side")
        # the service runs the compose file's command (through the deadline's wrapper)
        up = await asyncio.to_thread(
            subprocess.run,
            ["docker", "exec", side, "cat", "/tmp/up"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert up.stdout == "up\n", up
        await kill_server(srv, client)
        # nothing stopped it with the server
        assert side in await asyncio.to_thread(running_containers, pid)
        await wait_until(
            lambda: container_state(side).startswith("exited"),
            120.0,
            1.0,
            "the service ended by itself",
        )
        # its keeper (pid 1) sent SIGTERM at the deadline: `sleep` died of it (128 + 15)
        assert await asyncio.to_thread(container_state, side) == "exited 143"
        await wait_until(
            lambda: not running_containers(pid), 60.0, 1.0, "the sandbox ended by itself"
        )
    finally:
        await asyncio.to_thread(srv.stop)
        await remove_containers(pid)


CHECK_TASK = "life-check-task"


def write_check_task(root: Path) -> Path:
    """A task whose oracle hangs: `sandgym tasks check` is still running it when it is killed.
    Its limits (agent 10 s, verifier 5 s) make the check sandbox's deadline 15 s + grace."""
    t = root / CHECK_TASK
    (t / "tests").mkdir(parents=True)
    (t / "solution").mkdir()
    (t / "task.toml").write_text(
        'version = "1.0"\n[agent]\ntimeout_sec = 10\n[verifier]\ntimeout_sec = 5\n'
        f'[environment]\ndocker_image = "{IMAGE}"\nnetwork_mode = "no-network"\n'
    )
    (t / "instruction.md").write_text("Do nothing.\n")
    (t / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 600\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return t


@pytest.mark.docker
@needs_docker
async def test_tasks_check_sandbox_ends_itself_after_the_command_is_killed(
    tmp_path: Path,
) -> None:
    import os
    import sys

    task = write_check_task(tmp_path / "tasks")
    cli = Path(sys.executable).with_name("sandgym")
    proc = await asyncio.create_subprocess_exec(
        *[str(cli), "tasks", "check", "--backend", "docker", str(task)],
        env={**os.environ, "SANDGYM_SANDBOX_GRACE_S": "5"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # the oracle phase's sandbox, made by the command (no server, no pool)
        await wait_until(lambda: running_containers(proc.pid), 120.0, 0.2, "the check's sandbox")
        proc.kill()
        await asyncio.wait_for(proc.wait(), 30)
        (name,) = await asyncio.to_thread(running_containers, proc.pid)  # nothing stopped it
        await wait_until(
            lambda: not running_containers(proc.pid), 120.0, 1.0, "the check's sandbox ended"
        )
        # still there, exited: its own init ended it (status 0)
        assert await asyncio.to_thread(container_state, name) == "exited 0"
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 30)
        await remove_containers(proc.pid)


HANG_TASK = "life-hang-task"


def write_hanging_verifier_task(root: Path) -> Path:
    """A task whose tests hang in the sandbox's private verifier container (docker)."""
    t = root / HANG_TASK
    (t / "tests").mkdir(parents=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 8\n[environment]\n'
        f'docker_image = "{IMAGE}"\nnetwork_mode = "no-network"\n'
    )
    (t / "instruction.md").write_text("Do nothing.\n")
    (t / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 600\n")
    return root


@pytest.mark.docker
@needs_docker
async def test_private_verifier_container_ends_itself_after_server_is_killed(
    tmp_path: Path,
) -> None:
    tasks = write_hanging_verifier_task(tmp_path / "tasks")
    srv = await start_docker_server(tasks, pool_size=0)
    pid = srv.pid
    client = AsyncEnvClient(srv.url, request_timeout_s=120)
    scoring = None
    try:
        await client.reset(HANG_TASK)
        scoring = asyncio.create_task(client.step({"kind": "submit"}))

        # the verifier's container beside the sandbox (a snapshot of it), running the tests
        def verifier_running() -> bool:
            found = containers_labelled(pid, "sandgym.verifier_of")
            return bool(found) and container_state(found[0]).startswith("running")

        await wait_until(verifier_running, 120.0, 0.2, "the verifier running")
        await kill_server(srv, client, scoring)
        (verifier,) = await asyncio.to_thread(containers_labelled, pid, "sandgym.verifier_of")
        assert verifier in await asyncio.to_thread(running_containers, pid)  # nothing stopped it
        await wait_until(
            lambda: container_state(verifier).startswith("exited"), 120.0, 1.0, "verifier ended"
        )
        # its watcher killed the tests at its timeout plus the grace (SIGKILL: 128 + 9)
        assert await asyncio.to_thread(container_state, verifier) == "exited 137"
    finally:
        if scoring is not None and not scoring.done():
            scoring.cancel()
        await asyncio.to_thread(srv.stop)
        await remove_containers(pid)

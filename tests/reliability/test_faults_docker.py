"""Faults on the Docker backend, against `sandgym serve --backend docker` as a child process.

- the server SIGKILLed with 20 live episodes leaves 20 orphaned containers; a restarted server
  removes them at startup (reap by labels) within 10 s;
- a container killed mid-episode (`docker kill`) gives that client `sandbox_lost`, leaves every
  other session working, and the pool refills;
- a dropped connection resumed within the grace keeps its shell state; after the grace the
  episode is swept and its container removed;
- dockerd killed and restarted under load: the same server process serves new episodes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.server.runner import ServerProcess
from tests.docker_engine import process_running
from tests.reliability.conftest import REL_TASK, containers_of_pid, needs_docker
from tests.waiting import wait_until, wait_until_in_thread

pytestmark = [pytest.mark.docker, needs_docker]

BASE_ENV = {"SANDGYM_INCLUDE_BUILTIN": "false"}


async def start_server(rel_tasks: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return await asyncio.to_thread(
        ServerProcess,
        "docker",
        args=["--tasks", str(rel_tasks), *args],
        env={**BASE_ENV, **(env or {})},
        startup_timeout_s=120,
    )


async def open_sessions(url: str, n: int) -> list[tuple[AsyncEnvClient, dict[str, Any]]]:
    async def one() -> tuple[AsyncEnvClient, dict[str, Any]]:
        c = AsyncEnvClient(url, request_timeout_s=120, reconnect_backoff_s=0.05)
        _, info = await c.reset(REL_TASK)
        return c, info

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def drop_all(clients: list[AsyncEnvClient]) -> None:
    for c in clients:
        with contextlib.suppress(Exception):
            await c.drop_connection()


async def test_sigkilled_server_restart_reaps_all_orphans(rel_tasks: Path) -> None:
    srv = await start_server(rel_tasks, "--max-sessions", "32")
    restarted = None
    try:
        sessions = await open_sessions(srv.url, 20)
        ids = {info["sandbox_id"] for _, info in sessions}
        assert len(ids) == 20
        live = set(await asyncio.to_thread(containers_of_pid, srv.pid))
        assert len(live) >= 20, live
        old_pid = srv.pid
        srv.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(srv.proc.wait, 30)
        await drop_all([c for c, _ in sessions])
        # SIGKILL ran no cleanup: every container is still there, owned by a dead process.
        orphans = await asyncio.to_thread(containers_of_pid, old_pid)
        assert len(orphans) >= 20, orphans
        restarted = await start_server(rel_tasks)
        # Polled with a generous bound (how fast the reaper is, is lab/bench/reliability.py's).
        await wait_until(
            lambda: not containers_of_pid(old_pid), 120.0, 0.2, "zero orphans after restart"
        )
        # The restarted server serves.
        async with AsyncEnvClient(restarted.url, request_timeout_s=120) as c:
            await c.reset(REL_TASK)
            assert (await c.step("echo ok")).observation["output"] == "ok\n"
    finally:
        await asyncio.to_thread(srv.stop)
        if restarted is not None:
            await asyncio.to_thread(restarted.stop)
    assert not await asyncio.to_thread(containers_of_pid, old_pid)


async def test_container_killed_mid_episode(rel_tasks: Path) -> None:
    srv = await start_server(rel_tasks, "--pool-size", "2")
    try:
        sessions = await open_sessions(srv.url, 4)
        victim, victim_info = sessions[0]
        others = [c for c, _ in sessions[1:]]
        for i, c in enumerate(others):
            await c.step(f"export MARK=m{i}")
        running = asyncio.create_task(victim.step({"kind": "command", "command": "sleep 60"}))
        await wait_until_in_thread(
            lambda: process_running(victim_info["sandbox_id"], "sleep 60"),
            60.0, 0.1, "sleep 60 running",
        )  # fmt: skip
        assert not running.done()
        await asyncio.to_thread(
            subprocess.run, ["docker", "kill", victim_info["sandbox_id"]], check=True, timeout=60
        )
        with pytest.raises(EnvError) as err:
            await asyncio.wait_for(running, 60)
        assert err.value.code == "sandbox_lost", err.value
        assert not victim.in_episode
        # Every other session is unaffected: its shell state is intact.
        for i, c in enumerate(others):
            assert (await c.step("echo $MARK")).observation["output"] == f"m{i}\n"
        # The lost client starts over on a fresh sandbox.
        await victim.reset(REL_TASK)
        assert (await victim.step("echo again")).observation["output"] == "again\n"

        async def pool_refilled() -> bool:
            async with httpx.AsyncClient(base_url=srv.http_url) as http:
                snap = (await http.get("/v1/pool")).json()
            return bool(snap["totals"]["ready"] >= 2)

        await wait_until(pool_refilled, 60.0, 0.5, "pool refilled to 2 ready")
        for c, _ in sessions:
            await c.close()
    finally:
        await asyncio.to_thread(srv.stop)


async def test_resume_within_grace_keeps_state_after_grace_sandbox_is_gone(
    rel_tasks: Path,
) -> None:
    env = {"SANDGYM_RESUME_GRACE_S": "3", "SANDGYM_SWEEP_INTERVAL_S": "0.2"}
    srv = await start_server(rel_tasks, env=env)
    try:
        # Within the grace: the client reconnects and resumes; the shell kept its variable.
        async with AsyncEnvClient(srv.url, reconnect_backoff_s=0.01) as c:
            await c.reset(REL_TASK)
            await c.step("export KEPT=yes; cd /tmp")
            await c.drop_connection()
            res = await c.step("echo $KEPT $PWD")
            assert res.observation["output"] == "yes /tmp\n"
            assert c.reconnects >= 1
        # After the grace: the episode is swept and its container removed.
        c = AsyncEnvClient(srv.url)
        _, info = await c.reset(REL_TASK)
        sid, token, container = c.session_id, c.resume_token, info["sandbox_id"]
        await c.drop_connection()

        def container_gone() -> bool:
            return (
                subprocess.run(
                    ["docker", "inspect", container], capture_output=True, timeout=60
                ).returncode
                != 0
            )

        await wait_until(container_gone, 30.0, 0.2, "container removed after the grace")
        async with connect(srv.url) as ws:
            msg = {"type": "resume", "request_id": "r", "session_id": sid, "resume_token": token}
            await ws.send(json.dumps(msg))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert reply["type"] == "error" and reply["code"] == "no_episode", reply
    finally:
        await asyncio.to_thread(srv.stop)


# -- dockerd restart -------------------------------------------------------------------------------


def dockerd_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def docker_info_ok() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def dockerd_argv() -> list[str]:
    """The running engine's command line: a restart keeps its storage driver and data-root
    (scripts/setup.sh's SANDGYM_DOCKER_STORAGE=btrfs-quota engine is not overlay2's default)."""
    for pid in dockerd_pids():
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    return []


def start_dockerd(log_path: Path, argv: list[str] | None = None) -> None:
    cmd = shlex.join(argv) if argv else "dockerd --storage-driver=overlay2"
    subprocess.run(
        f"nohup {cmd} >{log_path} 2>&1 &",
        shell=True,
        check=True,
        start_new_session=True,
    )


def ensure_dockerd(log_path: Path, argv: list[str] | None = None) -> None:
    """Leave a working Docker engine behind, whatever happened in the test."""
    if docker_info_ok():
        return
    if not dockerd_pids():
        start_dockerd(log_path, argv)
    deadline = time.monotonic() + 60
    while not docker_info_ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"dockerd did not come back within 60 s; see {log_path}")
        time.sleep(0.5)


def kill_orphaned_shims() -> list[str]:
    """Containers whose engine was SIGKILLed keep running under their containerd-shim, and the
    restarted engine (with a fresh containerd) does not know them: `docker ps -a` and every
    reaper are blind to them. Kill each shim whose container id the engine does not list, and
    its processes. Returns the container ids."""
    known = set(
        subprocess.run(
            ["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True, timeout=60
        ).stdout.split()
    )
    orphans: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"containerd-shim-runc-v2") or b"-id" not in argv:
            continue
        # only shims of this engine's own containerd (dockerd started by hand runs one under
        # /var/run/docker), in Docker's namespace: never another runtime's containers
        if b"moby" not in argv or not any(a.startswith(b"/var/run/docker/") for a in argv):
            continue
        cid = argv[argv.index(b"-id") + 1].decode()
        if cid in known:
            continue
        orphans.append(cid)
        children = subprocess.run(
            ["pgrep", "-P", proc.name], capture_output=True, text=True
        ).stdout.split()
        for pid in [*children, proc.name]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    return orphans


async def test_server_recovers_after_dockerd_restart(rel_tasks: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not dockerd_pids():
        pytest.skip("needs root and a dockerd started by hand on this machine")
    log_path = tmp_path / "dockerd.log"
    argv: list[str] = []
    srv = await start_server(rel_tasks)
    stop_load = asyncio.Event()
    codes: list[str] = []
    messages: list[str] = []
    played: list[int] = []

    async def load() -> None:
        # Episodes back to back while the engine goes away and comes back.
        while not stop_load.is_set():
            try:
                async with AsyncEnvClient(srv.url, request_timeout_s=120) as c:
                    await c.reset(REL_TASK)
                    for _ in range(3):
                        await c.step("echo x")
                played.append(1)
            except EnvError as exc:
                codes.append(exc.code)
                messages.append(exc.message[:300])
                await asyncio.sleep(0.2)

    loaders = [asyncio.create_task(load()) for _ in range(3)]
    try:
        await wait_until(lambda: played, 120.0, 0.1, "an episode of the load played")
        argv = dockerd_argv()
        for pid in dockerd_pids():
            os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: not dockerd_pids(), 30.0, 0.1, "dockerd dead")
        met = len(codes)
        await wait_until(lambda: len(codes) > met, 120.0, 0.1, "the load meeting the dead engine")
        await asyncio.to_thread(start_dockerd, log_path, argv)
        await wait_until(docker_info_ok, 60.0, 0.5, "docker info answers again")
        stop_load.set()
        await asyncio.wait_for(asyncio.gather(*loaders, return_exceptions=True), 180)
        assert srv.proc.poll() is None, "the server died with dockerd"
        # New episodes work on the same server process. The pool marked the image's key
        # failing while the engine was away and fails fast until its cooldown ends, so this
        # waits out the cooldown (bounded) instead of expecting the very next reset to work.
        ok = False
        deadline = time.monotonic() + 90
        while not ok and time.monotonic() < deadline:
            try:
                async with AsyncEnvClient(srv.url, request_timeout_s=120) as c:
                    await c.reset(REL_TASK)
                    await c.step("echo hello > /app/hello.txt")
                    final = await c.step({"kind": "submit"})
                ok = final.reward == 1.0
            except EnvError as exc:
                codes.append(exc.code)
                messages.append(exc.message[:300])
                await asyncio.sleep(1.0)
        assert ok, f"no episode worked after dockerd came back; errors: {codes} {messages[-3:]}"
        from sandgym.wire.protocol import ERROR_CODES

        assert set(codes) <= set(ERROR_CODES), codes
    finally:
        stop_load.set()
        for t in loaders:
            t.cancel()
        await asyncio.to_thread(ensure_dockerd, log_path, argv)
        await asyncio.to_thread(srv.stop)
        # Creations in flight when the engine died left containers the stopped server never
        # learnt of (its owner pid is dead now: `sandgym reap` takes them), and what the
        # killed engine was running still runs under shims no engine lists.
        from sandgym.sandboxes.reaper import reap

        await reap(["docker"])
        await asyncio.to_thread(kill_orphaned_shims)

"""Abuse inside a sandbox, on `local` (bubblewrap) and `docker`, through a real server process.

Each abuse runs as one episode's action while a neighbouring episode keeps stepping. What must
hold: the abusive action comes back (a result or a named error, never a hang), the neighbour's
steps all succeed, the server stays up, and the abuse is contained by a limit (pids, memory,
file size, output cap, action timeout, no network, no Docker socket). Latency figures under
abuse are measured by `lab/bench/reliability.py`, never asserted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgym.client.env_client import AsyncEnvClient, EnvError, StepResult
from sandgym.server.runner import ServerProcess
from tests.reliability.conftest import REL_TASK, docker_ready, local_ready
from tests.waiting import wait_until

BACKENDS = [
    pytest.param(
        "local", marks=pytest.mark.skipif(not local_ready(), reason="bubblewrap not installed")
    ),
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(not docker_ready(), reason="no Docker engine or image"),
        ],
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def abuse_server(request: pytest.FixtureRequest, rel_tasks: Path) -> Iterator[ServerProcess]:
    env = {"SANDGYM_INCLUDE_BUILTIN": "false", "SANDGYM_MAX_OUTPUT_BYTES": "65536"}
    with ServerProcess(
        request.param, args=["--tasks", str(rel_tasks)], env=env, startup_timeout_s=120
    ) as srv:
        srv.backend_name = request.param  # type: ignore[attr-defined]
        yield srv
        assert srv.proc.poll() is None, "the server process died during the abuse tests"


@contextlib.asynccontextmanager
async def episode(url: str) -> AsyncIterator[AsyncEnvClient]:
    c = AsyncEnvClient(url, request_timeout_s=180)
    await c.reset(REL_TASK)
    try:
        yield c
    finally:
        with contextlib.suppress(EnvError, OSError):
            await c.close()


async def abuse_with_neighbour(
    url: str, action: dict[str, Any] | str
) -> tuple[StepResult | EnvError, AsyncEnvClient]:
    """Run `action` in one episode while a neighbour episode steps; all neighbour steps must
    succeed. Returns the abusive step's result (or its error) and the abuser's client (open)."""
    abuser = AsyncEnvClient(url, request_timeout_s=180)
    await abuser.reset(REL_TASK)
    async with episode(url) as neighbour:
        await neighbour.step("export N=1")
        task = asyncio.create_task(abuser.step(action))
        n = 0
        while not task.done() or n < 3:
            res = await neighbour.step("echo $N ok")
            assert res.observation["output"] == "1 ok\n", res
            n += 1
            await asyncio.sleep(0.05)
        try:
            outcome: StepResult | EnvError = task.result()
        except EnvError as exc:
            outcome = exc
    return outcome, abuser


async def still_works(abuser: AsyncEnvClient) -> None:
    """The abuser's own sandbox is usable again once the abusive action is over."""
    res = await abuser.step({"kind": "command", "command": "echo alive", "timeout_s": 60})
    # A fork bomb's leftovers may still print "fork: retry" onto the shared terminal for a
    # moment: the command's own line must be there, stray lines around it are allowed.
    assert "alive" in res.observation["output"].splitlines(), res
    await abuser.close()


def server_healthy(srv: ServerProcess) -> None:
    assert srv.proc.poll() is None
    assert httpx.get(f"{srv.http_url}/healthz", timeout=10).status_code == 200


async def test_fork_bomb_is_contained(abuse_server: ServerProcess) -> None:
    bomb = {"kind": "command", "command": "b(){ b|b& }; b; sleep 3", "timeout_s": 8}
    outcome, abuser = await abuse_with_neighbour(abuse_server.url, bomb)
    # The command comes back (at its `sleep 3`, or killed at its timeout), and the pids limit
    # is what stopped the bomb: the kernel refused its forks (EAGAIN), and bash said so.
    assert isinstance(outcome, StepResult), outcome
    assert "fork: retry: Resource temporarily unavailable" in outcome.observation["output"], (
        outcome.observation["output"][-500:]
    )
    await still_works(abuser)
    server_healthy(abuse_server)


async def test_memory_hog_is_killed_by_the_memory_limit(abuse_server: ServerProcess) -> None:
    # `tail` holds its whole input: 2 GiB against a 256 MiB limit.
    hog = {
        "kind": "command",
        "command": "head -c 2000m /dev/zero | tail >/dev/null; echo rc=$?",
        "timeout_s": 60,
    }
    outcome, abuser = await abuse_with_neighbour(abuse_server.url, hog)
    assert isinstance(outcome, StepResult), outcome
    rc = outcome.observation["output"].strip().rpartition("rc=")[2]
    assert rc == "137", outcome.observation  # SIGKILLed by the OOM killer (128 + 9)
    await still_works(abuser)
    server_healthy(abuse_server)


async def test_disk_fill_is_capped_by_the_storage_limit(abuse_server: ServerProcess) -> None:
    # The task's storage_mb is 64: a 512 MiB file must not get written in full.
    fill = {
        "kind": "command",
        "command": "dd if=/dev/zero of=/app/fill bs=1M count=512 status=none; echo rc=$?; "
        "wc -c < /app/fill",
        "timeout_s": 120,
    }
    outcome, abuser = await abuse_with_neighbour(abuse_server.url, fill)
    assert isinstance(outcome, StepResult), outcome
    lines = outcome.observation["output"].split()
    rc = next(x for x in lines if x.startswith("rc="))
    size = int(lines[-1])
    assert rc != "rc=0" and size <= 64 * 2**20, outcome.observation
    await still_works(abuser)
    server_healthy(abuse_server)


async def test_endless_output_is_capped(abuse_server: ServerProcess) -> None:
    flood = {"kind": "command", "command": "yes sandgym-flood", "timeout_s": 3}
    outcome, abuser = await abuse_with_neighbour(abuse_server.url, flood)
    # Killed at its timeout, its output cut at SANDGYM_MAX_OUTPUT_BYTES=65536 (+ the markers).
    assert isinstance(outcome, StepResult), outcome
    assert outcome.info.get("output_truncated") is True, outcome.info
    assert outcome.info.get("timed_out") is True, outcome.info
    assert 65536 <= len(outcome.observation["output"].encode()) <= 65536 + 1024
    await still_works(abuser)
    server_healthy(abuse_server)


async def test_sigterm_ignoring_process_is_killed(abuse_server: ServerProcess) -> None:
    stubborn = {
        "kind": "command",
        "command": "trap '' TERM; while :; do sleep 0.2; done",
        "timeout_s": 2,
    }
    outcome, abuser = await abuse_with_neighbour(abuse_server.url, stubborn)
    # It ran into its timeout and was killed in spite of its trap: nothing of the loop is left.
    assert isinstance(outcome, StepResult), outcome
    assert outcome.info.get("timed_out") is True and outcome.observation["exit_code"] is None
    # Polled (an orphaned last `sleep 0.2` may outlive the loop by 0.2 s): none at two looks
    # 0.3 s apart, which a live loop, never without its sleep for longer than a fork, fails.
    count = "$(ps -eo args | grep -c '^sleep 0.2$')"
    left = await abuser.step(
        f"for i in $(seq 30); do a={count}; sleep 0.3; b={count}; "
        '[ "$a$b" = 00 ] && break; done; echo "left=$a$b"'
    )
    assert "left=00" in left.observation["output"], left.observation
    await still_works(abuser)
    server_healthy(abuse_server)


async def test_killing_every_process_does_not_lose_the_sandbox(abuse_server: ServerProcess) -> None:
    """`kill -9 -1` (and `kill -9 1`) inside the sandbox end the agent's own processes, never the
    sandbox: a lost sandbox is masked as infrastructure by the trainer, so an agent able to cause
    one could drop its failed episodes from training instead of being scored on them."""
    killer = {"kind": "command", "command": "kill -9 -1; kill -9 1; echo survived", "timeout_s": 20}
    outcome, abuser = await abuse_with_neighbour(abuse_server.url, killer)
    # The command's own shell is among what it kills: its output may be cut short, but the step
    # is not an error, let alone `sandbox_lost`.
    assert isinstance(outcome, StepResult), outcome
    await still_works(abuser)
    server_healthy(abuse_server)


@pytest.mark.parametrize("command", ["exit 7", "kill -9 $$", "exec true"])
async def test_a_command_that_ends_its_shell_is_scored_not_lost(
    abuse_server: ServerProcess, command: str
) -> None:
    """`exit`, `kill $$` or `exec` end the persistent shell, not the sandbox: the step is the
    command's result (the agent's doing, scored), never `sandbox_lost` (masked), and the next
    command runs in a new shell."""
    async with episode(abuse_server.url) as c:
        res = await c.step({"kind": "command", "command": command, "timeout_s": 20})
        assert "this command ended the shell" in res.observation["output"], res.observation
        if command == "exit 7":
            assert res.observation["exit_code"] == 7, res.observation
        again = await c.step("echo alive")
        assert again.observation["output"] == "alive\n", again.observation
    server_healthy(abuse_server)


async def test_a_shell_ending_command_past_the_output_cap_says_it_was_cut(
    abuse_server: ServerProcess,
) -> None:
    """Output cut to the cap (64 KiB here) is flagged as cut even when the command then ends
    its shell."""
    async with episode(abuse_server.url) as c:
        res = await c.step(
            {
                "kind": "command",
                "command": "head -c 300000 /dev/zero | tr '\\0' a; exit 3",
                "timeout_s": 30,
            }
        )
        assert "this command ended the shell" in res.observation["output"], res.observation
        assert res.observation["exit_code"] == 3 and res.info.get("output_truncated"), res.info
        assert len(res.observation["output"]) < 100_000
    server_healthy(abuse_server)


def host_processes(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return out.split()


async def test_daemon_left_behind_is_gone_after_close(abuse_server: ServerProcess) -> None:
    # Sandbox processes are visible from the host (same kernel): find them by a unique argv.
    marker = f"4{abuse_server.port}"
    async with episode(abuse_server.url) as c:
        await c.step(
            f"(trap '' TERM HUP; setsid nohup sleep {marker} >/dev/null 2>&1 &); "
            f"nohup sh -c 'trap \"\" TERM; exec sleep {marker}' >/dev/null 2>&1 &"
        )
        await c.step("sleep 0.5")
        assert len(host_processes(f"sleep {marker}")) >= 2
    await wait_until(
        lambda: not host_processes(f"sleep {marker}"), 20.0, 0.2, "daemons gone after close"
    )
    server_healthy(abuse_server)


def host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


async def test_network_server_port_and_docker_socket_are_refused(
    abuse_server: ServerProcess,
) -> None:
    port = abuse_server.port
    targets = ["127.0.0.1", host_ip(), "172.17.0.1"]
    probes = [
        f"timeout 5 bash -c 'echo > /dev/tcp/{h}/{port}' 2>/dev/null && echo OPEN-{h} || "
        f"echo refused-{h}"
        for h in targets
    ]
    probes.append(
        "for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock; do "
        "[ -e $s ] && echo SOCKET-$s; done; echo checked-sockets"
    )
    async with episode(abuse_server.url) as c:
        for probe in probes:
            res = await c.step({"kind": "command", "command": probe, "timeout_s": 20})
            out = res.observation["output"]
            assert "OPEN" not in out and "SOCKET" not in out, (probe, out)
            assert "refused-" in out or "checked-sockets" in out, (probe, out)
    server_healthy(abuse_server)

"""GRPO groups from one prepared state (`reset.options.group`), through real servers on local
and docker: members start from identical prepared state (a nonce only one preparation could
have made) and diverge on their own; a failed preparation is every member's error; a group's
snapshot is removed after its last member, after a group whose members never came, and by the
reaper after a SIGKILLed server. Docker runs both ways: by changes (its default: no snapshot,
the members' sandboxes made while member 0 prepares) and from a `docker commit` snapshot."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.sandboxes.local import local_root
from sandgym.server.runner import BackgroundServer, ServerProcess
from sandgym.server.settings import ServerSettings
from tests.e2e.conftest import REAL_BACKENDS
from tests.waiting import wait_until_in_thread

GEN = """\
import argparse, pathlib, uuid
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int); a = p.parse_args()
pathlib.Path("/app/nonce").write_text(uuid.uuid4().hex)  # only one preparation makes this
pathlib.Path("/app/seeded").write_text(str(a.seed * 7))
if {fail}:
    raise SystemExit("generator failed on purpose")
print(a.seed * 7)
"""


def _task(root: Path, name: str, fail: bool) -> None:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    (d / "environment" / "generate.py").write_text(GEN.format(fail=fail))
    (d / "instruction.md").write_text("Write the number in /app/seeded to /app/answer\n")
    (d / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ngenerator = "environment/generate.py"\n'
        '[environment]\nnetwork_mode = "no-network"\n'
    )
    (d / "tests" / "test.sh").write_text(
        textwrap.dedent(
            """\
            #!/bin/bash
            mkdir -p /logs/verifier
            if [ "$(cat /app/answer 2>/dev/null)" = "$(cat /tests/secret/expected)" ]; then
              echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
            """
        )
    )


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("groups")
    _task(root, "grp", fail=False)
    _task(root, "grp-broken", fail=True)
    return root


BACKENDS = REAL_BACKENDS
#: docker's fallback way: members started from a `docker commit` of member 0
SNAPSHOT_FORK = {"group_fork": "snapshot"}
DOCKER_SNAPSHOT = pytest.param("docker-snapshot", marks=REAL_BACKENDS[1].marks)
#: (backend, its options) of each way a server is run here
WAYS = {
    "local": ("local", {}),
    "docker": ("docker", {}),
    "docker-snapshot": ("docker", SNAPSHOT_FORK),
}


@pytest.fixture(scope="module", params=[*BACKENDS, DOCKER_SNAPSHOT])
def server(request: pytest.FixtureRequest, task_root: Path) -> Iterator[BackgroundServer]:
    backend, options = WAYS[request.param]
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        backend=backend,
        backend_options=options,
        task_dirs=[task_root],
        include_builtin=False,
        pool_size=0,
        group_ttl_s=2.0,
        sweep_interval_s=0.2,
    )
    with BackgroundServer(settings) as srv:
        srv.backend_name = backend  # type: ignore[attr-defined]
        srv.way = request.param  # type: ignore[attr-defined]
        yield srv


def forks_by_changes(server: BackgroundServer) -> bool:
    return server.way == "docker"  # type: ignore[attr-defined]


async def pool_totals(server: BackgroundServer) -> dict[str, int]:
    import httpx

    async with httpx.AsyncClient() as h:
        r = await h.get(f"{server.http_url}/v1/pool", timeout=30)
        return {k: int(v) for k, v in r.json()["totals"].items()}


async def wait_none_leased(server: BackgroundServer, bound_s: float = 60.0) -> None:
    """Poll the server's pool until no sandbox is leased or being made for a reset (ready
    ones the pool keeps for the next episode are its policy, not a leak; a generous bound: a
    hang guard)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while True:
        totals = await pool_totals(server)
        if totals["leased"] == 0 and totals["creating"] == 0:
            return
        assert loop.time() < deadline, f"sandboxes left: {totals}"
        await asyncio.sleep(0.1)


def _group(gid: str, size: int) -> dict[str, Any]:
    return {"group": {"id": gid, "size": size}}


def snapshots_of(backend: str, sandbox_id: str) -> list[str]:
    """The group snapshots taken of `sandbox_id` that still exist."""
    if backend == "docker":
        out = subprocess.run(
            ["docker", "images", "-q", "--filter", f"label=sandgym.snapshot_of={sandbox_id}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout.split()
    found = []
    for d in local_root().glob("snap-*"):
        try:
            if json.loads((d / "labels.json").read_text()).get("sandgym.snapshot_of") == sandbox_id:
                found.append(d.name)
        except (OSError, ValueError):
            continue
    return found


async def snapshots_removed(backend: str, sandbox_id: str) -> None:
    """Wait until no snapshot of the sandbox is left (a generous bound: a hang guard, not a
    timing claim)."""
    await wait_until_in_thread(
        lambda: not snapshots_of(backend, sandbox_id), 60.0, 0.1, "the snapshots removed"
    )


async def test_members_start_identical_and_diverge(server: BackgroundServer) -> None:
    clients = [AsyncEnvClient(server.url, request_timeout_s=300) for _ in range(3)]
    for c in clients:
        await c.connect()
    try:
        resets = await asyncio.gather(
            *(c.reset("grp", seed=4, options=_group("g-same", 3)) for c in clients)
        )
        infos = [info["group"] for _, info in resets]
        assert sorted(i["member"] for i in infos) == [0, 1, 2]
        assert [i["forked"] for i in sorted(infos, key=lambda i: i["member"])] == [
            False,
            True,
            True,
        ]
        nonces = [(await c.step("cat /app/nonce")).observation["output"] for c in clients]
        assert len(set(nonces)) == 1 and len(nonces[0]) == 32  # one preparation, three copies
        # each diverges on its own
        for i, c in enumerate(clients):
            await c.step(f"echo {i} > /app/mine")
        seen = [(await c.step("cat /app/mine")).observation["output"].strip() for c in clients]
        assert seen == ["0", "1", "2"]
        # the secret (the generator's answer) reached every member's verifier
        await clients[1].step("cp /app/seeded /app/answer")
        rewards = [(await c.step({"kind": "submit"})).reward for c in clients]
        assert rewards == [0.0, 1.0, 0.0]
        leader = next(info for _, info in resets if info["group"]["member"] == 0)
        if forks_by_changes(server):  # copied from member 0's changes: no snapshot made
            assert not snapshots_of(server.backend_name, leader["sandbox_id"])  # type: ignore[attr-defined]
    finally:
        for c in clients:
            await c.close()
    backend = server.backend_name  # type: ignore[attr-defined]
    # the last member released: the snapshot goes
    await snapshots_removed(backend, leader["sandbox_id"])


async def test_a_failed_preparation_is_every_members_error(server: BackgroundServer) -> None:
    clients = [AsyncEnvClient(server.url, request_timeout_s=300) for _ in range(3)]
    for c in clients:
        await c.connect()
    try:
        results = await asyncio.gather(
            *(c.reset("grp-broken", seed=1, options=_group("g-broken", 3)) for c in clients),
            return_exceptions=True,
        )
    finally:
        for c in clients:
            await c.close()
    assert all(isinstance(r, EnvError) for r in results), results
    assert len({(r.code, r.message) for r in results}) == 1  # type: ignore[union-attr]
    assert "generator failed on purpose" in results[0].message  # type: ignore[union-attr]
    # members that took their sandbox while member 0 prepared (docker) gave it back
    await wait_none_leased(server)


async def test_a_member_must_match_its_group(server: BackgroundServer) -> None:
    async with AsyncEnvClient(server.url) as a, AsyncEnvClient(server.url) as b:
        await a.reset("grp", seed=1, options=_group("g-match", 2))
        with pytest.raises(EnvError) as exc:
            await b.reset("grp", seed=2, options=_group("g-match", 2))
        assert exc.value.code == "invalid_message" and "seed" in exc.value.message
        with pytest.raises(EnvError) as exc:
            await b.reset("grp", seed=1, options={"group": {"id": "x", "size": 0}})
        assert exc.value.code == "invalid_message"


async def test_a_group_whose_members_never_came_is_removed(server: BackgroundServer) -> None:
    async with AsyncEnvClient(server.url) as c:
        _, info = await c.reset("grp", seed=2, options=_group("g-lonely", 4))
        await c.step({"kind": "submit"})
    backend = server.backend_name  # type: ignore[attr-defined]
    # 3 members never reset: after the group's ttl (2 s here) with no member live, it goes
    await snapshots_removed(backend, info["sandbox_id"])


@pytest.mark.parametrize("way", [BACKENDS[0], DOCKER_SNAPSHOT])
async def test_the_reaper_removes_a_killed_servers_snapshots(way: str, task_root: Path) -> None:
    backend, options = WAYS[way]
    env = {"SANDGYM_BACKEND_OPTIONS": json.dumps(options)}
    args = ["--tasks", str(task_root)]
    srv = ServerProcess(backend, args=args, env=env, startup_timeout_s=120)
    restarted = None
    try:
        async with AsyncEnvClient(srv.url, request_timeout_s=300) as c:
            _, info = await c.reset("grp", seed=3, options=_group("g-killed", 2))
        assert snapshots_of(backend, info["sandbox_id"])
        srv.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(srv.proc.wait, 30)
        assert snapshots_of(backend, info["sandbox_id"])  # SIGKILL cleaned up nothing
        restarted = ServerProcess(backend, args=args, env=env, startup_timeout_s=120)
        await snapshots_removed(backend, info["sandbox_id"])
    finally:
        await asyncio.to_thread(srv.stop)
        if restarted is not None:
            await asyncio.to_thread(restarted.stop)

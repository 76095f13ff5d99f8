"""Every sandbox creation obeys the creation limits the pool uses (sandgym.sandboxes.createlimit),
not only the pool's own: while a creation of the pool's holds the one slot (`max_starting=1`),
`sandgym tasks check`'s sandboxes (made through `OwnLifetimes.create`, as a separate or pristine
verifier's are) and a docker sandbox's private verifier container wait for it, with nothing
created meanwhile; a compose service takes a token of the same rate. Real backends: bubblewrap
(local) and the Docker engine."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.sandboxes import get_backend
from sandgym.sandboxes.base import Sandbox, SandboxBackend
from sandgym.sandboxes.createlimit import CreateLimitSettings, HostCreateLimiter, shared_limiter
from sandgym.sandboxes.errors import BackendUnavailableError
from sandgym.sandboxes.lifetime import LifetimeSettings, OwnLifetimes
from sandgym.sandboxes.pool import PoolSettings, SandboxPool
from sandgym.sandboxes.services import ServiceSpec
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.sandboxes.usage import CGROUP_ROOT
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.tasks import load_task_dir
from sandgym.tasks.check import check_task
from sandgym.tasks.registry import CATALOG_DIR
from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until

BASE = "sandgym/base:bookworm"
docker_only = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(BASE), reason=f"{BASE} not built"),
]


def _backend(name: str) -> SandboxBackend:
    try:
        return get_backend(name)
    except BackendUnavailableError as exc:
        pytest.skip(f"{name} backend unavailable: {exc}")


@contextlib.asynccontextmanager
async def _limited_pool(
    backend: SandboxBackend, directory: Path, **limits: float
) -> AsyncIterator[HostCreateLimiter]:
    """A pool (not started) with host limits: its limiter is the process's for the backend."""
    settings = CreateLimitSettings(directory=directory, **limits)  # type: ignore[arg-type]
    pool = SandboxPool(backend, PoolSettings(min_ready=0, host_limits=settings))
    try:
        limiter = shared_limiter(backend.name)
        assert limiter is not None and limiter is pool._host_limiter
        yield limiter
    finally:
        await pool.close()
        await backend.aclose()
    assert shared_limiter(backend.name) is None  # the pool's limiter left with it


def _containers(name_part: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name={name_part}"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout.split()


async def test_tasks_check_waits_for_the_pools_slot(tmp_path: Path) -> None:
    backend = _backend("local")
    async with _limited_pool(backend, tmp_path, max_starting=1) as lim:
        task = load_task_dir(CATALOG_DIR / "hello-file")
        async with lim.starting():  # a creation of the pool's holds the one slot
            check = asyncio.create_task(check_task(task, backend, {}, 0))
            await wait_until(lambda: lim.waiting == 1 or check.done(), 60, what="a wait or an end")
            assert lim.waiting == 1 and not check.done() and lim.granted == 1
        result = await asyncio.wait_for(check, 180)
        assert (result.oracle_reward, result.noop_reward) == (1.0, 0.0), result
        assert lim.granted == 3  # the oracle's and the no-op's sandboxes, each through it


@pytest.mark.parametrize("_", [pytest.param(None, marks=docker_only)])
async def test_private_verifier_container_waits_for_the_pools_slot(_: None, tmp_path: Path) -> None:
    backend = _backend("docker")
    async with _limited_pool(backend, tmp_path, max_starting=1) as lim:
        async with OwnLifetimes(LifetimeSettings(enabled=False)) as own:
            sb: Sandbox = await own.create(backend, SandboxSpec(image=BASE), 60)
        try:
            assert lim.granted == 1  # the sandbox itself, made outside the pool
            async with lim.starting():
                run = asyncio.create_task(sb.exec_private(["sh", "-c", "echo verified"], b""))
                await wait_until(
                    lambda: lim.waiting == 1 or run.done(), 60, what="a wait or an end"
                )
                assert lim.waiting == 1
                assert not run.done()
                assert _containers(f"{sb.id}-verifier") == []  # nothing created meanwhile
            result = await asyncio.wait_for(run, 120)
            assert result.exit_code == 0 and result.stdout.strip() == "verified"
            assert lim.granted == 3
        finally:
            await sb.close()


@pytest.mark.parametrize("_", [pytest.param(None, marks=docker_only)])
async def test_compose_service_takes_a_token_of_the_same_rate(_: None, tmp_path: Path) -> None:
    backend = _backend("docker")
    async with _limited_pool(backend, tmp_path, rate_per_s=1000.0, burst=100) as lim:
        svc = ServiceSpec(name="svc", image=BASE, command=("sleep", "infinity"))
        spec = SandboxSpec(image=BASE, services=(svc,))
        async with OwnLifetimes(LifetimeSettings(enabled=False)) as own:
            sb = await own.create(backend, spec, 60)
        try:
            assert lim.granted == 1  # one creation: the group, under one slot
            assert lim.tokens_taken == 2  # its main container and its service, one token each
        finally:
            await sb.close()


@pytest.mark.parametrize("_", [pytest.param(None, marks=docker_only)])
async def test_usage_counts_the_service_and_the_verifier_container(_: None) -> None:
    """What the cost ledger reads (`Sandbox.usage`): the compose service's seconds, CPU and peak
    memory beside the main container's, and the private verifier container's, read from its own
    parent group after it ended (48 MiB held in its /dev/shm: charged to its cgroup)."""
    backend = _backend("docker")
    svc = ServiceSpec(name="svc", image=BASE, command=("sleep", "infinity"))
    async with OwnLifetimes(LifetimeSettings(enabled=False)) as own:
        sb = await own.create(backend, SandboxSpec(image=BASE, services=(svc,)), 60)
    try:
        fill = "dd if=/dev/zero of=/dev/shm/x bs=1M count=48 2>/dev/null && echo held"
        result = await sb.exec_private(["sh", "-c", fill], b"")
        assert result.stdout.strip() == "held", result
        used = await sb.usage()
        assert used.peak_memory_bytes is not None and used.peak_memory_unavailable is None
        by_kind = {c.kind: c for c in used.companions}
        assert sorted(by_kind) == ["service", "verifier"] and len(used.companions) == 2
        service, verifier = by_kind["service"], by_kind["verifier"]
        assert service.name == "svc" and (service.seconds or 0) > 0
        assert service.cpu_s is not None and (service.peak_memory_bytes or 0) > 0
        assert verifier.name.startswith(f"{sb.id}-verifier-") and (verifier.seconds or 0) > 0
        assert verifier.peak_memory_bytes is not None, verifier
        assert verifier.peak_memory_bytes >= 48 * 2**20 and (verifier.cpu_s or 0) > 0
        group = CGROUP_ROOT / "memory" / f"sandgym-verifier-{verifier.name}"
        assert not await asyncio.to_thread(group.exists)  # its parent group, removed once read
    finally:
        await sb.close()
        await backend.aclose()


async def test_pristine_verifier_waits_on_the_servers_limits(tmp_path: Path) -> None:
    """Through a real server: its pool's limits (`create_limits`) also hold back the sandbox a
    pristine verify makes at submit. The test holds the one slot from outside the server, as
    another server process on the host would (the slot files' locks), and the server's
    `/metrics` shows the submit's creation waiting for it."""
    backend = _backend("local")
    await backend.aclose()
    task = tmp_path / "tasks" / "hello"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30\n')
    (task / "instruction.md").write_text("Write hello to /app/hello.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        '[ "$(cat /app/hello.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt'
        " || echo 0 > /logs/verifier/reward.txt\n"
    )
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    limits = CreateLimitSettings(max_starting=1, directory=tmp_path / "limits")
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend="local", task_dirs=[tmp_path / "tasks"],
        include_builtin=False, pool_size=0, create_limits={"local": limits},
    )  # fmt: skip
    srv = BackgroundServer(settings, None)
    srv.start()
    other = HostCreateLimiter("local", limits)  # another process's view of the same slots

    async def waiting() -> float:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"{srv.http_url}/metrics")).text
        line = next(
            x for x in text.splitlines() if x.startswith("sandgym_pool_create_limits_waiting")
        )
        return float(line.split()[-1])

    try:
        async with AsyncEnvClient(srv.url, request_timeout_s=120) as env:
            await env.reset("hello", seed=0, options={"verify": "pristine"})
            await env.step("echo hello > /app/hello.txt")
            async with other.starting():
                submit = asyncio.create_task(env.step({"kind": "submit"}))
                await wait_until(
                    lambda: submit.done() or waiting(), 60, what="the pristine sandbox waiting"
                )
                assert not submit.done()
            res = await asyncio.wait_for(submit, 120)
        assert res.terminated and res.reward == 1.0, res.info.get("verifier_output")
        assert await waiting() == 0
    finally:
        srv.stop()

"""Integration test of the warm pool on the real Docker backend.

Hits, never-reuse, health replacement of a killed container, the global cap under a burst, and
close() with creations in flight; it ends by asserting that no container labelled with the
backend's owner id is left (`docker ps -a --filter label=sandgym.owner=...`).

Skipped, with the reason, when the docker backend module, the Docker engine or the
`sandgym/terminal:latest` image (built by images/bootstrap-base.sh) is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sandgym.sandboxes import PoolSettings, SandboxFileNotFoundError, SandboxPool, SandboxSpec
from sandgym.sandboxes.labels import LABEL_OWNER
from tests.waiting import wait_until

pytestmark = pytest.mark.docker

IMAGE = "sandgym/terminal:latest"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("sandgym.sandboxes.docker") is None:
        return "the docker backend (sandgym/sandboxes/docker.py) does not exist yet"
    if importlib.util.find_spec("docker") is None:
        return "the Docker SDK is not installed (pip install 'sandgym[docker]')"
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        return "no Docker engine answers `docker info`"
    image = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, timeout=30)
    if image.returncode != 0:
        return f"image {IMAGE} is missing; build it with images/bootstrap-base.sh"
    return None


_REASON = _skip_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)


def _docker_sync(*args: str) -> str:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    return out.stdout


async def _docker(*args: str) -> str:
    # Off the event loop: the pool's background creations and destroys keep running meanwhile.
    return await asyncio.to_thread(_docker_sync, *args)


async def _containers_of(owner_id: str) -> list[str]:
    out = await _docker("ps", "-a", "-q", "--filter", f"label={LABEL_OWNER}={owner_id}")
    return out.split()


@pytest.fixture
async def backend() -> AsyncIterator[Any]:
    from sandgym.sandboxes.docker import DockerBackend

    b = DockerBackend(owner_id="pooltest-" + uuid.uuid4().hex[:10])
    try:
        yield b
    finally:
        await b.aclose()
        left = await _containers_of(b.owner_id)
        if left:  # clean up for the next run, then fail: the pool leaked
            await _docker("rm", "-f", *left)
        assert left == [], f"containers of owner {b.owner_id} left behind: {left}"


async def test_pool_on_docker_hits_replaces_caps_and_cleans_up(backend: Any) -> None:
    spec = SandboxSpec(image=IMAGE, memory_mb=256)
    pool = SandboxPool(
        backend,
        PoolSettings(min_ready=2, max_total=4, max_concurrent_creates=2, acquire_timeout_s=120),
    )
    try:
        await pool.start()
        await pool.prewarm([spec], count=2)
        await pool.wait_idle(timeout_s=120)
        assert len(await _containers_of(backend.owner_id)) == 2

        # A hit is a running container; what an episode leaves behind never reaches the next.
        first = await pool.acquire(spec)
        assert first.from_pool is True
        assert (await first.exec("echo hi")).stdout == "hi\n"
        await first.write_file("/app/dirty.txt", "used")
        await pool.release(first)
        second = await pool.acquire(spec)
        assert second.id != first.id
        with pytest.raises(SandboxFileNotFoundError):
            await second.read_file("/app/dirty.txt")
        await pool.release(second)
        await pool.wait_idle(timeout_s=120)

        # A ready container killed behind the pool's back is replaced silently.
        ready_before = set(await _containers_of(backend.owner_id))
        assert len(ready_before) == 2
        await _docker("kill", *ready_before)
        third = await pool.acquire(spec)
        assert await third.is_alive()
        assert (await third.exec("true")).exit_code == 0
        assert pool.stats.health_replaced >= 1
        await pool.release(third)

        # A burst larger than the cap: every acquire succeeds, the cap holds.
        async def episode() -> str:
            sb = await pool.acquire(spec)
            try:
                assert (await sb.exec("true")).exit_code == 0
            finally:
                await pool.release(sb)
            return sb.id

        # The cap is read from the engine, not from the pool's own counter: the containers of
        # this owner, in any state, listed over and over while the burst runs.
        burst_done = asyncio.Event()
        seen: list[int] = []

        async def watch_engine() -> None:
            while not burst_done.is_set():
                seen.append(len(await backend.owned_sandbox_ids()))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch_engine())
        try:
            ids = await asyncio.gather(*(episode() for _ in range(8)))
        finally:
            burst_done.set()
            await watcher
        assert len(set(ids)) == 8
        assert len(seen) >= 3 and max(seen) >= 2, seen  # the watcher saw the burst
        assert max(seen) <= 4, seen
        assert pool.stats.peak_total <= 4

        # Creations in flight at close() are destroyed too: close once one reached the engine.
        before = set(await backend.owned_sandbox_ids())
        await pool.prewarm([SandboxSpec(image=IMAGE, memory_mb=300)], count=2)

        async def reached_engine() -> bool:
            return bool(set(await backend.owned_sandbox_ids()) - before)

        await wait_until(reached_engine, 60.0, 0.01, "a creation reaching the engine")
    finally:
        await pool.close()
    assert await _containers_of(backend.owner_id) == []
    snap = pool.snapshot()
    assert snap.totals.total == 0
    assert snap.failures == 0


async def test_live_pool_sweeps_a_lost_creation_and_keeps_its_own(backend: Any) -> None:
    """Issue 8: a container labelled with the live pool's owner id that the pool never learnt
    of (made here straight through the Docker SDK, as a create whose answer was lost when the
    engine died) is removed by the pool's sweep; the pool's ready and leased containers and a
    live container of another owner are not."""
    import docker

    from sandgym.sandboxes.docker import DockerBackend

    spec = SandboxSpec(image=IMAGE, memory_mb=256)
    client = docker.from_env()
    other = DockerBackend(owner_id="pooltest-other-" + uuid.uuid4().hex[:8])
    pool = SandboxPool(
        backend,
        PoolSettings(min_ready=1, max_total=4, sweep_interval_s=0.2, sweep_grace_s=0.0),
    )
    made: list[Any] = []
    try:
        await pool.start()
        await pool.prewarm([spec], count=1)
        await pool.wait_idle(timeout_s=120)
        leased = await pool.acquire(spec)
        await pool.wait_idle(timeout_s=120)  # the refill behind the hit
        own = set(await _containers_of(backend.owner_id))
        assert len(own) == 2

        def lost_create(labels: dict[str, str]) -> Any:
            c = client.containers.create(
                IMAGE,
                command=["sleep", "600"],
                name="sg-" + uuid.uuid4().hex[:12],
                labels=labels,
                network_mode="none",
            )
            c.start()
            return c

        lost = await asyncio.to_thread(lost_create, backend.labels_for(spec))
        foreign = await asyncio.to_thread(lost_create, other.labels_for(spec))
        made += [lost, foreign]

        await wait_until(lambda: pool.stats.swept >= 1, 60.0, 0.1, "the sweep removing it")
        assert pool.stats.swept == 1 and pool.snapshot().swept == 1
        assert pool.stats.sweep_errors == 0
        ids_now = set(await _containers_of(backend.owner_id))
        assert lost.id[:12] not in ids_now and len(ids_now) == 2
        assert ids_now == own  # the pool's own, untouched
        assert (await leased.exec("echo alive")).stdout == "alive\n"
        foreign_ids = await _docker("ps", "-q", "--filter", f"label={LABEL_OWNER}={other.owner_id}")
        assert foreign_ids.split() == [foreign.id[:12]]
        await pool.release(leased)
    finally:
        await pool.close()
        for c in made:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(c.remove, force=True)
        await asyncio.to_thread(client.close)
    assert await _containers_of(backend.owner_id) == []

"""Ready means ready: the pool starts a sandbox's shell as part of creating it, counts a failed
start as a failed creation (the sandbox is closed, never handed out), and a ready sandbox whose
shell died fails the health check."""

from __future__ import annotations

import pytest

from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.null import NullSandbox
from sandgym.sandboxes.pool import PoolSettings, SandboxPool


async def test_the_pool_warms_every_sandbox_before_handing_it_out(monkeypatch) -> None:
    warmed: list[str] = []

    async def warm_up(self: NullSandbox) -> None:
        warmed.append(self.id)

    monkeypatch.setattr(NullSandbox, "warm_up", warm_up)
    pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=2))
    await pool.start()
    try:
        await pool.prewarm([SandboxSpec()])
        await pool.wait_idle()
        sb = await pool.acquire(SandboxSpec())
        assert sb.from_pool and sb.id in warmed
        await pool.release(sb)
    finally:
        await pool.close()


async def test_a_failed_warm_up_is_a_failed_creation(monkeypatch) -> None:
    calls = {"n": 0}

    async def warm_up(self: NullSandbox) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("shell did not start")

    monkeypatch.setattr(NullSandbox, "warm_up", warm_up)
    backend = get_backend("null")
    pool = SandboxPool(backend, PoolSettings(min_ready=0, create_backoff_s=0.01))
    await pool.start()
    try:
        sb = await pool.acquire(SandboxSpec())
        assert pool.stats.failures == 1 and calls["n"] == 2
        assert backend.destroyed == 1  # the one whose shell failed was closed, not handed out
        assert len(backend.live) == 1 and sb.id in backend.live
        await pool.release(sb)
    finally:
        await pool.close()


async def test_a_dead_shell_fails_the_health_check(monkeypatch) -> None:
    pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=0))
    sb = await pool.backend.create(SandboxSpec())
    try:
        assert await pool._healthy(sb)
        monkeypatch.setattr(NullSandbox, "shell_alive", lambda self: False)
        assert not await pool._healthy(sb)
    finally:
        await sb.close()


@pytest.mark.parametrize("alive", [None, True])
async def test_no_shell_or_a_live_one_is_healthy(monkeypatch, alive) -> None:
    pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=0))
    sb = await pool.backend.create(SandboxSpec())
    monkeypatch.setattr(NullSandbox, "shell_alive", lambda self: alive)
    try:
        assert await pool._healthy(sb)
    finally:
        await sb.close()

"""Hard lifetimes (`sandboxes.lifetime`): which deadline a sandbox carries and when it moves, and
on E2B that the provider's own timeout is that deadline (set at create, moved by `set_timeout`,
whose signature is checked against the released SDK). The sandboxes ending by themselves on
docker and local is tests/reliability/test_lifetime.py."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import time
from pathlib import Path

import pytest

from sandboxes import SandboxSpec
from sandboxes.lifetime import LifetimeSettings, desired_deadline, needs_write
from sandboxes.null import NullBackend
from sandboxes.pool import PoolSettings, SandboxPool


async def test_deadline_is_the_later_of_heartbeat_and_episode_limits() -> None:
    sb = await NullBackend().create(SandboxSpec())
    now = 1000.0
    assert desired_deadline(sb, now, 60) == 1060  # waiting in the pool: heartbeat only
    sb.episode_end = 2000.0
    assert desired_deadline(sb, now, 60) == 2000  # leased: its episode's limits
    assert desired_deadline(sb, 1990.0, 60) == 2050  # active past them, server alive: extended
    sb.deadline = 1060.0
    assert not needs_write(sb, 1060.0, now, 60)
    assert needs_write(sb, 1060.0, 1031.0, 60)  # less than half the grace left
    assert needs_write(sb, 2000.0, now, 60)  # the episode's end is much later


async def test_null_sandboxes_carry_no_deadline_to_move() -> None:
    async with SandboxPool(NullBackend(), PoolSettings(maintenance_interval_s=0.01)) as pool:
        sb = await pool.acquire(SandboxSpec())
        await asyncio.sleep(0.05)
        assert sb.deadline is None and pool.snapshot().lifetime.writes == 0


@pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None,
    reason="the fake E2B cloud runs its sandboxes with bubblewrap + nsenter, not installed",
)
async def test_e2b_timeout_is_the_deadline_and_moves_with_it(tmp_path: Path) -> None:
    from sandboxes.e2b import E2BBackend
    from tests.fakes.e2b_fake import FakeE2BCloud

    e2b = pytest.importorskip("e2b")
    # the released SDK's call, as the backend makes it
    params = inspect.signature(e2b.AsyncSandbox.set_timeout).parameters
    assert list(params)[:2] == ["self", "timeout"]

    cloud = FakeE2BCloud(root=tmp_path / "cloud")
    backend = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, request_timeout_s=10)
    settings = PoolSettings(
        maintenance_interval_s=0.02, lifetime=LifetimeSettings(grace_s=120.0), sweep_interval_s=None
    )
    try:
        async with SandboxPool(backend, settings) as pool:
            sb = await pool.acquire(SandboxSpec())
            create = next(kw for name, kw in cloud.calls if name == "create")
            assert create["timeout"] in (120, 121)  # the first deadline: E2B ends it then
            rec = cloud.records[sb.e2b_id]  # type: ignore[attr-defined]
            sb.episode_end = time.time() + 3600  # leased for an episode of an hour
            deadline = time.monotonic() + 30
            while not any(name == "set_timeout" for name, _ in cloud.calls):
                assert time.monotonic() < deadline, "the pool never moved the deadline"
                await asyncio.sleep(0.02)
            moved = next(kw for name, kw in cloud.calls if name == "set_timeout")
            assert moved["sandbox_id"] == sb.e2b_id  # type: ignore[attr-defined]
            assert 3590 <= moved["timeout"] <= 3601
            assert 3590 <= rec.end_at - time.time() <= 3601  # E2B's own end moved with it
            await pool.release(sb)
    finally:
        await backend.aclose()
        await cloud.aclose()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
@pytest.mark.parametrize("grace", ["off", "30"])
async def test_server_setting_gives_local_sandboxes_their_deadline_or_none(
    grace: str, tmp_path: Path
) -> None:
    from envserver.settings import ServerSettings
    from sandboxes.lifetime import read_deadline_file
    from sandboxes.local import LocalBackend

    settings = ServerSettings(sandbox_grace_s=grace)  # as SANDGYM_SANDBOX_GRACE_S gives it
    life = LifetimeSettings(
        enabled=settings.sandbox_grace_s is not None, grace_s=settings.sandbox_grace_s or 300
    )
    backend = LocalBackend(root=tmp_path)
    async with SandboxPool(backend, PoolSettings(lifetime=life, sweep_interval_s=None)) as pool:
        sb = await pool.acquire(SandboxSpec())
        written = read_deadline_file(tmp_path / sb.id / "life")
        if grace == "off":
            assert sb.deadline is None and written is None
        else:
            assert sb.deadline is not None and written == pytest.approx(sb.deadline, abs=1)
            assert 0 < written - time.time() <= 31
        await pool.release(sb)

"""Hard lifetimes (`sandgym.sandboxes.lifetime`): which deadline a sandbox carries and when it moves, and
on E2B that the provider's own timeout is that deadline (set at create, moved by `set_timeout`,
whose signature is checked against the released SDK). The sandboxes ending by themselves on
docker and local is tests/reliability/test_lifetime.py."""

from __future__ import annotations

import inspect
import shutil
import time
from pathlib import Path

import pytest

from sandgym.sandboxes import Sandbox, SandboxSpec
from sandgym.sandboxes.lifetime import LifetimeSettings, desired_deadline, needs_write
from sandgym.sandboxes.null import NullBackend
from sandgym.sandboxes.pool import PoolSettings, SandboxPool
from tests.waiting import wait_until


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
        rounds_with_sb = 0
        refresh = pool._keeper.refresh

        def counting_refresh(sandboxes: list[Sandbox], now: float | None = None) -> None:
            nonlocal rounds_with_sb
            refresh(sandboxes, now)
            rounds_with_sb += any(x is sb for x in sandboxes)

        pool._keeper.refresh = counting_refresh  # type: ignore[method-assign]
        # two maintenance rounds saw it: the first one's writes are done
        await wait_until(lambda: rounds_with_sb >= 2, 10.0, 0.005, "two refreshes of it")
        assert sb.deadline is None and pool.snapshot().lifetime.writes == 0


@pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None,
    reason="the fake E2B cloud runs its sandboxes with bubblewrap + nsenter, not installed",
)
async def test_e2b_timeout_is_the_deadline_and_moves_with_it(tmp_path: Path) -> None:
    from sandgym.sandboxes.e2b import E2BBackend
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
            await wait_until(
                lambda: any(name == "set_timeout" for name, _ in cloud.calls),
                30.0, 0.02, "the pool moving the deadline",
            )  # fmt: skip
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
    from sandgym.sandboxes.lifetime import read_deadline_file
    from sandgym.sandboxes.local import LocalBackend
    from sandgym.server.settings import ServerSettings

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


def test_service_argv_is_what_the_engine_would_run() -> None:
    from sandgym.sandboxes.docker.service_life import run_with_deadline, service_argv
    from sandgym.sandboxes.services import ServiceSpec

    image = {"Entrypoint": ["/entry.sh"], "Cmd": ["serve", "--port", "80"]}
    svc = ServiceSpec(name="db", image="x")
    assert service_argv(svc, image) == ["/entry.sh", "serve", "--port", "80"]  # the image's
    cmd = svc.model_copy(update={"command": ("run", "fast")})
    assert service_argv(cmd, image) == ["/entry.sh", "run", "fast"]  # compose command: CMD's place
    ep = svc.model_copy(update={"entrypoint": ("/other",)})
    assert service_argv(ep, image) == ["/other"]  # a compose entrypoint drops the image's CMD
    both = ep.model_copy(update={"command": ("a",)})
    assert service_argv(both, image) == ["/other", "a"]
    cleared = svc.model_copy(update={"entrypoint": ()})
    assert service_argv(cleared, image) == ["serve", "--port", "80"]  # `entrypoint: []` clears
    life = Path("/tmp/life")
    wrapped = run_with_deadline(svc, image, life)
    assert wrapped.wrapped and wrapped.command is None
    assert wrapped.entrypoint is not None and wrapped.entrypoint[4:] == service_argv(svc, image)
    assert wrapped.binds == {"/tmp/life": {"bind": "/run/sandgym-life", "mode": "ro"}}
    # no deadline, or nothing to run (the engine's own error): exactly as written
    assert not run_with_deadline(svc, image, None).wrapped
    assert not run_with_deadline(svc, {}, life).wrapped


def test_grace_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandgym.sandboxes.lifetime import settings_from_env

    monkeypatch.delenv("SANDGYM_SANDBOX_GRACE_S", raising=False)
    assert settings_from_env() == LifetimeSettings()
    monkeypatch.setenv("SANDGYM_SANDBOX_GRACE_S", "7")
    assert settings_from_env() == LifetimeSettings(grace_s=7.0)
    monkeypatch.setenv("SANDGYM_SANDBOX_GRACE_S", "off")
    assert not settings_from_env().enabled
    monkeypatch.setenv("SANDGYM_SANDBOX_GRACE_S", "soon")
    with pytest.raises(ValueError, match="expected a number of seconds"):
        settings_from_env()


@pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None,
    reason="the fake E2B cloud runs its sandboxes with bubblewrap + nsenter, not installed",
)
async def test_a_sandbox_made_outside_a_pool_gets_its_own_limits(tmp_path: Path) -> None:
    """`OwnLifetimes`: the creator's limit plus the grace, as E2B's own timeout; none when off."""
    from sandgym.sandboxes.e2b import E2BBackend
    from sandgym.sandboxes.lifetime import OwnLifetimes
    from tests.fakes.e2b_fake import FakeE2BCloud

    cloud = FakeE2BCloud(root=tmp_path / "cloud")
    backend = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, request_timeout_s=10)
    try:
        async with OwnLifetimes(LifetimeSettings(grace_s=120.0)) as lifetimes:
            sb = await lifetimes.create(backend, SandboxSpec(), limit_s=600.0)
            create = next(kw for name, kw in cloud.calls if name == "create")
            assert create["timeout"] in (720, 721)  # E2B ends it then, whoever is alive
            assert sb.deadline is not None and sb.episode_end == sb.deadline - 120.0
            await sb.close()
        cloud.calls.clear()
        async with OwnLifetimes(LifetimeSettings(enabled=False)) as lifetimes:
            sb = await lifetimes.create(backend, SandboxSpec(), limit_s=600.0)
            assert sb.deadline is None  # no deadline asked: the backend's lease only
            create = next(kw for name, kw in cloud.calls if name == "create")
            assert create["timeout"] == 3600  # the backend's lease (lease_s), as before
            await sb.close()
    finally:
        await backend.aclose()
        await cloud.aclose()

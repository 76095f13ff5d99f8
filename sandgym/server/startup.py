"""Bringing the server's parts up: the task registry, a backend checked usable, the orphans a
crashed server left reaped, and the warm pool with the server's settings. `EnvService.start`
(sandgym/server/sessions.py) calls these in that order."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sandgym.sandboxes import SandboxBackend
from sandgym.sandboxes.lifetime import LifetimeSettings, configure_own_lifetimes
from sandgym.sandboxes.pool import PoolSettings, SandboxPool
from sandgym.server.settings import ServerSettings
from sandgym.tasks import TaskRegistry

if TYPE_CHECKING:
    from sandgym.tasks import TaskRegistry

log = logging.getLogger(__name__)


async def load_tasks(settings: ServerSettings) -> TaskRegistry:
    """Every task the server serves (reading the task directories off the event loop)."""

    return await asyncio.to_thread(
        TaskRegistry, list(settings.task_dirs), include_builtin=settings.include_builtin
    )


async def ensure_usable(backend: SandboxBackend) -> None:
    """A backend that cannot work (no E2B key or SDK, no Docker engine) stops the server at
    startup with the reason, instead of failing every reset later."""
    ensure = getattr(backend, "ensure_available", None)
    if ensure is None:
        return
    try:
        await ensure()
    except Exception as exc:
        log.error("backend %s is not usable: %s", backend.name, exc)
        raise


async def reap_orphans(backend: SandboxBackend) -> None:
    """Remove the expired sandboxes a crashed server left; a failure is logged, not raised."""
    try:
        removed = await backend.reap(only_expired=True)
    except Exception:  # a failed cleanup must not keep the server from serving
        log.exception("reaping orphaned sandboxes at startup failed")
        return
    if removed:
        log.info("removed %d orphaned sandboxes at startup: %s", len(removed), removed[:10])


def make_pool(settings: ServerSettings, backend: SandboxBackend) -> SandboxPool:
    """The warm pool (not started): `pool_size` ready, room for every episode, and each
    sandbox's hard lifetime kept `sandbox_grace_s` ahead while the server lives (the same
    for the sandboxes the server makes outside its pool: `sandgym.sandboxes.lifetime.OwnLifetimes`)."""
    grace = settings.sandbox_grace_s
    lifetime = LifetimeSettings(enabled=grace is not None, grace_s=grace or 300.0)
    configure_own_lifetimes(lifetime)
    return SandboxPool(
        backend,
        PoolSettings(
            min_ready=settings.pool_size,
            max_total=max(settings.pool_max_total, settings.max_sessions),
            max_concurrent_creates=settings.pool_max_concurrent_creates
            or backend.default_concurrent_creates,
            min_available_memory_mb=settings.min_available_memory_mb,
            lifetime=lifetime,
            host_limits=settings.create_limits.get(backend.name),
        ),
    )

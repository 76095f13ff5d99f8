"""What a docker sandbox's compose services consumed, for its episode's cost ledger: each
service container's CPU seconds and peak memory, read from the engine's stats (and, on cgroup
v2, its group's `memory.peak`) as the main container's are, while they still run. A service
lives as long as its sandbox, so its seconds are the sandbox's so far."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.usage import CompanionUsage, SandboxUsage

if TYPE_CHECKING:
    from sandgym.sandboxes.docker.group import DockerGroup


async def service_usage(group: DockerGroup | None, since: float) -> list[CompanionUsage]:
    """One `CompanionUsage` per service container of `group` (none without one); a service
    whose figures cannot be read has them None, with the reason `not_read`."""
    if group is None:
        return []
    seconds = max(0.0, time.time() - since)

    async def one(service: str, container_id: str) -> CompanionUsage:
        try:
            used = await Container(group.engine, container_id, group.sandbox_id).usage()
        except Exception:  # a service gone or an engine error: unknown, not 0
            used = SandboxUsage(peak_memory_unavailable="not_read")
        return CompanionUsage(
            kind="service",
            name=service,
            seconds=seconds,
            cpu_s=used.cpu_s,
            peak_memory_bytes=used.peak_memory_bytes,
            peak_memory_unavailable=used.peak_memory_unavailable,
        )

    return list(await asyncio.gather(*(one(s, c) for s, c in group.containers.items())))

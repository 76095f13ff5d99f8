"""An ended episode's sandbox handed back: its gateway bridge closed, its cost recorded (when
the server keeps a cost ledger), the sandbox released to the pool (which destroys it) and its
group told that a member left."""

from __future__ import annotations

import asyncio
import logging

from sandgym.sandboxes.pool import SandboxPool
from sandgym.server.cost import CostMetrics, episode_cost
from sandgym.server.episode_table import Session
from sandgym.server.groups import GroupRegistry

log = logging.getLogger(__name__)


async def release_episode(
    s: Session,
    *,
    pool: SandboxPool | None,
    groups: GroupRegistry | None,
    backend: str | None,
    cost_metrics: CostMetrics | None,
) -> None:
    """Release what episode `s` holds; `cost_metrics` None: no cost ledger."""
    if s.bridge is not None:
        await s.bridge.close()
        s.bridge = None
    if pool is None:
        return
    if cost_metrics is not None:
        s.cost = await episode_cost(
            s.sandbox,
            backend=backend,
            leased_at=s.leased_at,
            prepare_s=s.prepare_s,
            verifier_s=s.verifier_s,
            commands=s.commands,
        )
        cost_metrics.add(s.cost)
    try:
        await asyncio.shield(pool.release(s.sandbox))
    except Exception:
        log.exception("releasing sandbox %s failed", s.sandbox.id)
    if s.group is not None and groups is not None:
        group, s.group = s.group, None
        groups.left(group)

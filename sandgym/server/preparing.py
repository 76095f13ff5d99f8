"""A reset's episode made ready: a sandbox (from the warm pool, or for a group's member after the
first a copy of member 0's: sandgym/server/groups.py) given its hard lifetime, the task's set-up run in
it (`sandgym.tasks.episode_start.prepare_episode`, or member 0's copied in), member 0's preparation shared with
its group, and a gateway bridge when the reset asked for one. On error the sandbox goes back to
the pool."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandgym.sandboxes import Sandbox, SandboxBackend
from sandgym.sandboxes.pool import SandboxPool
from sandgym.server.gateway_bridge import GatewayBridge
from sandgym.server.groups import Group, GroupRegistry
from sandgym.server.metrics import ServerMetrics
from sandgym.server.settings import ServerSettings
from sandgym.server.specs import SpecCache
from sandgym.tasks.episode_start import prepare_episode
from sandgym.wire.protocol import ResetInfo, ResetMsg

if TYPE_CHECKING:
    from sandgym.server.gateway_bridge import GatewayBridge
    from sandgym.tasks.episode_models import EpisodeSetup, VerifyMode
    from sandgym.tasks.models import TaskSpec


@dataclass
class Ready:
    """A prepared episode, before it has a session."""

    sandbox: Sandbox
    setup: EpisodeSetup
    forked: bool  # a group member that started from a copy of member 0
    acquire_s: float
    prepare_s: float
    bridge: GatewayBridge | None

    def info(
        self,
        msg: ResetMsg,
        settings: ServerSettings,
        backend: str | None,
        group: Group | None,
        member: int,
    ) -> ResetInfo:
        """The reset reply's `info` for this episode."""
        setup = self.setup
        return ResetInfo(
            task_id=msg.task_id,
            seed=msg.seed,
            acquire_s=self.acquire_s,
            prepare_s=self.prepare_s,
            from_pool=self.sandbox.from_pool,
            desktop=setup.desktop is not None,
            sandbox_id=self.sandbox.id,
            backend=backend,
            max_steps=settings.max_steps,
            time_limit_s=settings.episode_time_limit_s,
            **({"gateway_socket": "/run/sandgym/gateway.sock"} if self.bridge else {}),
            **({"network": setup.network.describe()} if setup.network is not None else {}),
            **({"group": group.describe(member, self.forked)} if group is not None else {}),
            verify=setup.verify,
        )


class Preparer:
    """Makes the episodes of resets ready."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics, specs: SpecCache) -> None:
        self.settings = settings
        self.metrics = metrics
        self.specs = specs

    async def prepare(
        self,
        task: TaskSpec,
        msg: ResetMsg,
        verify: VerifyMode | None,
        *,
        pool: SandboxPool,
        groups: GroupRegistry,
        backend: SandboxBackend | None,
        group: Group | None,
        member: int,
    ) -> Ready:
        """The sandbox of `msg`'s episode, acquired and set up (`member` of `group`, if any)."""

        spec = self.specs.spec_for(task, backend)
        prepared = None
        if group is not None and member > 0:  # a copy of member 0's prepared sandbox
            sandbox, prepared, acquire_s = await groups.member_sandbox(group, spec)
        else:
            t0 = time.perf_counter()
            sandbox = await pool.acquire(spec)
            acquire_s = time.perf_counter() - t0
        forked = prepared is not None and prepared.forked
        self.metrics.acquire_latency.observe(acquire_s)
        # Its hard lifetime: the episode's limits (sandgym.sandboxes.lifetime), kept by the pool.
        sandbox.episode_end = time.time() + self.episode_limit_s(task)
        try:
            t1 = time.perf_counter()
            if prepared is not None and forked:
                setup = await groups.fork_setup(task, sandbox, prepared, verify)
            else:
                setup = await prepare_episode(
                    task,
                    sandbox,
                    msg.seed,
                    network_ceiling=self.specs.network_ceiling,
                    verify=verify,
                )
            if group is not None and member == 0:
                await groups.share(group, sandbox, spec, setup)
            bridge = None
            if msg.options.gateway_url is not None:  # a harness in the sandbox calls a gateway
                bridge = await GatewayBridge.open(sandbox, msg.options.gateway_url)
            prepare_s = time.perf_counter() - t1
        except BaseException:
            await asyncio.shield(pool.release(sandbox))
            raise
        return Ready(sandbox, setup, forked, acquire_s, prepare_s, bridge)

    def episode_limit_s(self, task: TaskSpec) -> float:
        """The longest an episode of `task` can hold its sandbox: the time limit and a verifier
        run per step of the task (the last may start just before the limit). While the server
        lives, the pool's refresh keeps `sandbox_grace_s` ahead of now on top of it."""
        timeouts = getattr(task, "timeouts", None)
        verifier_s = float(getattr(timeouts, "verifier_timeout_s", 120.0))
        steps = max(1, len(getattr(task, "steps", None) or ()))
        return self.settings.episode_time_limit_s + steps * verifier_s

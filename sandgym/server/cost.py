"""The cost ledger of one episode, on the server's side: the seconds its sandbox lived, by phase
(in the pool before its lease, preparing, the agent's turns, verifier runs), and what the
sandbox's own accounting says it consumed (`Sandbox.usage`: CPU seconds, peak memory, bytes
written); the commands it ran; and the containers that ran beside it (`companions`: its compose
services, its private verifier runs), each with its seconds, CPU seconds and peak memory. A peak
memory that cannot be read says why (`peak_memory_unavailable`), never a silent null. Sent as `info.cost` on the reply that ends the episode (the
trainer keeps it in the episode record) and summed into Prometheus counters."""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from sandgym.sandboxes import Sandbox
from sandgym.sandboxes.companions import counted_beside
from sandgym.sandboxes.usage import SandboxUsage
from sandgym.wire.protocol import CompanionCost, EpisodeCost

log = logging.getLogger(__name__)

#: an episode's sandbox usage read for longer than this is left out (None), not waited for
USAGE_TIMEOUT_S = 10.0

PHASES = ("pool", "prepare", "agent", "verifier")


async def episode_cost(
    sandbox: Sandbox,
    *,
    backend: str | None,
    leased_at: float,
    prepare_s: float,
    verifier_s: float,
    commands: int,
    now: float | None = None,
) -> EpisodeCost:
    """The ledger of an episode ending now (before its sandbox is released)."""
    now = time.time() if now is None else now
    try:
        used = await asyncio.wait_for(sandbox.usage(), USAGE_TIMEOUT_S)
    except Exception as exc:  # a lost sandbox, a slow engine: the figures are unknown, not 0
        log.info("cost: reading the usage of sandbox %s failed: %s", sandbox.id, exc)
        used = SandboxUsage(peak_memory_unavailable="not_read")
    pool_s = max(0.0, leased_at - sandbox.created_at)
    leased_s = max(0.0, now - leased_at)
    prepare_s = min(prepare_s, leased_s)
    verifier_s = min(verifier_s, leased_s - prepare_s)
    agent_s = leased_s - prepare_s - verifier_s
    return EpisodeCost(
        backend=backend,
        pool_s=pool_s,
        prepare_s=prepare_s,
        agent_s=agent_s,
        verifier_s=verifier_s,
        sandbox_s=pool_s + leased_s,
        cpu_s=used.cpu_s,
        peak_memory_bytes=used.peak_memory_bytes,
        bytes_written=used.bytes_written,
        commands=commands,
        peak_memory_unavailable=_why(used),
        companions=[
            CompanionCost.model_validate(c.model_dump())
            for c in [*used.companions, *counted_beside(sandbox)]
        ],
    )


def _why(used: SandboxUsage) -> str | None:
    """Why the peak memory is unknown: the backend's reason, else `unsupported` (a backend that
    keeps no such figure says nothing)."""
    if used.peak_memory_bytes is not None:
        return None
    return used.peak_memory_unavailable or "unsupported"


class CostMetrics:
    """`sandgym_sandbox_seconds_total{phase}`, `sandgym_sandbox_cpu_seconds_total`,
    `sandgym_sandbox_bytes_written_total`, `sandgym_commands_total`,
    `sandgym_episode_peak_memory_bytes` (histogram), `sandgym_companion_seconds_total{kind}`,
    `sandgym_companion_cpu_seconds_total`, in the server's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.seconds = Counter(
            "sandgym_sandbox_seconds", "sandbox seconds of ended episodes, by phase", ["phase"],
            registry=r,
        )  # fmt: skip
        self.by_phase = {p: self.seconds.labels(p) for p in PHASES}
        self.cpu = Counter(
            "sandgym_sandbox_cpu_seconds", "CPU seconds of ended episodes' sandboxes", registry=r
        )
        self.written = Counter(
            "sandgym_sandbox_bytes_written", "bytes ended episodes' sandboxes wrote", registry=r
        )
        self.commands = Counter("sandgym_commands", "command actions of ended episodes", registry=r)
        self.companion_seconds = Counter(
            "sandgym_companion_seconds",
            "seconds of the containers beside ended episodes' sandboxes, by kind",
            ["kind"],
            registry=r,
        )
        self.companion_cpu = Counter(
            "sandgym_companion_cpu_seconds",
            "CPU seconds of the containers beside ended episodes' sandboxes",
            registry=r,
        )
        self.peak = Histogram(
            "sandgym_episode_peak_memory_bytes",
            "peak memory of ended episodes' sandboxes",
            buckets=tuple(float(2**k) for k in range(24, 38, 2)) + (float("inf"),),
            registry=r,
        )

    def add(self, cost: EpisodeCost) -> None:
        for phase in PHASES:
            self.by_phase[phase].inc(getattr(cost, f"{phase}_s"))
        if cost.cpu_s is not None:
            self.cpu.inc(cost.cpu_s)
        if cost.bytes_written is not None:
            self.written.inc(cost.bytes_written)
        if cost.peak_memory_bytes is not None:
            self.peak.observe(cost.peak_memory_bytes)
        self.commands.inc(cost.commands)
        for c in cost.companions:
            if c.seconds is not None:
                self.companion_seconds.labels(c.kind).inc(c.seconds)
            if c.cpu_s is not None:
                self.companion_cpu.inc(c.cpu_s)

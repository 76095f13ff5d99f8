"""The warm sandbox pool: hands out ready sandboxes per environment fingerprint.

One job per module: `core` (the pool itself, `SandboxPool`: one state machine on one event loop;
its docstring holds the rules it keeps), `settings` (`PoolSettings`), `stats` (counters, latency
histograms, the typed `PoolSnapshot`), `sweep` (the sweep of untracked sandboxes and the idle
recycling), `keys` (per-fingerprint state, the creation token bucket), `errors` (named errors),
`memory` (the host's memory floor).
This package re-exports the names callers import.
"""

from sandgym.sandboxes.pool.core import SandboxPool
from sandgym.sandboxes.pool.errors import (
    HostMemoryError,
    PoolClosedError,
    PoolKeyFailingError,
    PoolTimeoutError,
)
from sandgym.sandboxes.pool.settings import PoolSettings
from sandgym.sandboxes.pool.stats import (
    LATENCY_BUCKETS_S,
    AcquireLatencySnapshot,
    LatencyBucket,
    LatencyHistogram,
    LatencyQuantiles,
    PoolKeySnapshot,
    PoolSnapshot,
    PoolStats,
    PoolTotals,
)

__all__ = [
    "HostMemoryError",
    "LATENCY_BUCKETS_S",
    "AcquireLatencySnapshot",
    "LatencyBucket",
    "LatencyHistogram",
    "LatencyQuantiles",
    "PoolClosedError",
    "PoolKeyFailingError",
    "PoolKeySnapshot",
    "PoolSettings",
    "PoolSnapshot",
    "PoolStats",
    "PoolTimeoutError",
    "PoolTotals",
    "SandboxPool",
]

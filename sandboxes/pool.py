"""The warm sandbox pool: hands out ready sandboxes per environment fingerprint.

Creating a sandbox costs hundreds of milliseconds on Docker; the pool hides that by keeping
ready sandboxes per key (`spec.fingerprint(backend.name)`) and creating replacements in the
background. Rules it keeps:

- A sandbox is used for one episode only: `release()` destroys it (off the hot path) and never
  puts it back. Freshness is the point; a reset that cleans a used sandbox is never trusted.
- `max_total` bounds every sandbox the pool is responsible for (ready + creating + leased +
  being destroyed): a slot is reserved before `backend.create()` starts and freed only after
  the sandbox's `close()` returned, so the backend never holds more than `max_total` of ours.
- Creation is gated by a semaphore (`max_concurrent_creates`) and a token bucket
  (`create_rate_per_s`), retried with bounded exponential backoff, and a key whose creations
  keep failing is marked failing for a cooldown: acquires fail fast with the last error.
- When capped, capacity is shared fairly: a waiting acquire gets the next freed slot before any
  background refill, waiting keys are served by fewest-slots-held first, an idle ready sandbox
  of another key is evicted for a starved one, and refill goes round-robin by deficit.
- `close()` destroys everything, including sandboxes still being created, even when the task
  calling it is cancelled.
- Every `sweep_interval_s` the live pool lists the sandboxes labelled with its owner id on the
  backend and removes those it does not hold: what a creation left when its answer was lost
  (the engine died or the call was cancelled mid-create) and what an abandoned destroy left.
  A sandbox the pool tracks (any created and not yet destroyed) or one an in-flight creation
  may still return is never touched (`sandboxes.labels.sweep_untracked` decides).

Example:
    >>> import asyncio
    >>> from sandboxes import SandboxSpec, get_backend
    >>> from sandboxes.pool import PoolSettings, SandboxPool
    >>> async def demo():
    ...     pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=1))
    ...     await pool.start()
    ...     spec = SandboxSpec()
    ...     await pool.prewarm([spec])
    ...     await pool.wait_idle()
    ...     sb = await pool.acquire(spec)
    ...     hit = sb.from_pool
    ...     await pool.release(sb)
    ...     await pool.close()
    ...     return hit
    >>> asyncio.run(demo())
    True

Why over 500 lines: the rules above (cap, fair sharing, refill, backoff, sweep, shielded close)
act on one shared state on one event loop; the settings, stats and histogram at the
top are small and could move out, the `SandboxPool` class itself is one state machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import Histogram
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandboxes.base import Sandbox, SandboxBackend
from sandboxes.createlimit import CreateLimitSettings, HostCreateLimiter
from sandboxes.errors import SandboxCreateError, SandboxError
from sandboxes.labels import Sighting, sweep_untracked
from sandboxes.lifetime import LifetimeKeeper, LifetimeSettings, set_first_deadline
from sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
class PoolTimeoutError(SandboxError, TimeoutError):
    """No sandbox became available within the acquire timeout."""


class PoolKeyFailingError(SandboxCreateError):
    """Creations for this key kept failing; acquires fail fast until the cooldown ends.

    `last_error` holds the most recent creation error (also chained as `__cause__`).
    """

    def __init__(self, message: str, key: str, last_error: BaseException | None) -> None:
        super().__init__(message)
        self.key = key
        self.last_error = last_error


class PoolClosedError(SandboxError, RuntimeError):
    """The pool was closed (or is closing); it hands out no more sandboxes."""


# ---------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------
class PoolSettings(BaseModel):
    """How the warm pool sizes, paces and guards sandbox creation."""

    model_config = ConfigDict(extra="forbid")

    min_ready: int = Field(
        default=0, ge=0, description="ready sandboxes kept per key while the key is in demand"
    )
    max_total: int = Field(
        default=32,
        ge=1,
        description="global cap on sandboxes held: ready + creating + leased + being destroyed",
    )
    max_concurrent_creates: int = Field(
        default=4, ge=1, description="backend.create() calls allowed to run at the same time"
    )
    create_rate_per_s: float | None = Field(
        default=None,
        gt=0,
        description="token-bucket rate of backend.create() calls; None = unlimited",
    )
    create_burst: int = Field(
        default=1, ge=1, description="token-bucket capacity: creations allowed back to back"
    )
    max_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="a ready sandbox older than this is destroyed (and replaced)",
    )
    acquire_timeout_s: float = Field(
        default=120.0, gt=0, description="default time acquire() waits before PoolTimeoutError"
    )
    create_retries: int = Field(
        default=2, ge=0, description="extra attempts after a failed creation before giving up"
    )
    create_backoff_s: float = Field(
        default=0.5, ge=0, description="backoff before the first retry; doubles on each retry"
    )
    create_backoff_max_s: float = Field(
        default=10.0, ge=0, description="upper bound of the backoff"
    )
    failing_after: int = Field(
        default=3,
        ge=1,
        description="consecutive failed creations after which a key is marked failing",
    )
    failing_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        description="how long a failing key fails fast before creation is retried",
    )
    demand_window_s: float = Field(
        default=300.0,
        ge=0,
        description="a key acquired or prewarmed within this window is kept at its target",
    )
    health_check: bool = Field(
        default=True, description="check a ready sandbox with is_alive() before handing it out"
    )
    health_check_timeout_s: float = Field(
        default=5.0, gt=0, description="an is_alive() check slower than this counts as dead"
    )
    destroy_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a sandbox close() slower than this is abandoned to the reaper",
    )
    close_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="close() waits this long for in-flight creations, then cancels",
    )
    maintenance_interval_s: float = Field(
        default=1.0, gt=0, description="period of the background loop (idle recycling, refill)"
    )
    latency_window: int = Field(
        default=10_000, ge=10, description="recent acquire latencies kept for the p50/p99 figures"
    )
    sweep_interval_s: float | None = Field(
        default=60.0,
        gt=0,
        description="period of the sweep that removes sandboxes labelled with this pool's owner "
        "id that the pool does not hold (creations whose answer was lost); None = no sweep",
    )
    sweep_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="an untracked sandbox is removed no sooner than this after a sweep first "
        "saw it (and only once every creation in flight then has ended)",
    )
    host_limits: CreateLimitSettings | None = Field(
        default=None,
        description="a creation rate and a cap on sandboxes being started, shared with every "
        "other process on the host using the same directory (sandboxes.createlimit)",
    )
    lifetime: LifetimeSettings = Field(
        default_factory=LifetimeSettings,
        description="deadlines after which the started pool's sandboxes end themselves, moved "
        "on while the pool lives (sandboxes.lifetime)",
    )

    @model_validator(mode="after")
    def _check(self) -> PoolSettings:
        if self.create_backoff_max_s < self.create_backoff_s:
            raise ValueError(
                f"create_backoff_max_s ({self.create_backoff_max_s}) must be >= "
                f"create_backoff_s ({self.create_backoff_s})"
            )
        return self


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------
#: Upper bounds (seconds) of every latency histogram's buckets: the pool's own and the server's
#: /metrics ones (envserver/metrics.py) share this one set (Prometheus style, +Inf last).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, math.inf,
)  # fmt: skip


class LatencyHistogram:
    """A prometheus_client histogram (in no registry) plus a window of recent samples whose
    quantiles numpy computes exactly."""

    def __init__(self, window: int = 10_000, buckets: tuple[float, ...] = LATENCY_BUCKETS_S):
        self.bounds = buckets
        self._hist = Histogram(
            "sandgym_pool_latency_seconds", "pool latency", buckets=buckets, registry=None
        )
        self._recent: deque[float] = deque(maxlen=window)

    def observe(self, value_s: float) -> None:
        self._hist.observe(value_s)
        self._recent.append(value_s)

    def _samples(self) -> list[Any]:
        return list(self._hist.collect())[0].samples

    @property
    def count(self) -> int:
        return int(next(s.value for s in self._samples() if s.name.endswith("_count")))

    @property
    def sum_s(self) -> float:
        return float(next(s.value for s in self._samples() if s.name.endswith("_sum")))

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count of samples <= bound) pairs, as Prometheus `_bucket` wants."""
        return [
            (float(s.labels["le"]), int(s.value))
            for s in self._samples()
            if s.name.endswith("_bucket")
        ]

    def quantile(self, q: float) -> float | None:
        """The q-quantile (nearest rank: one of the samples) of the recent window; None
        without samples."""
        if not self._recent:
            return None
        return float(np.quantile(self._recent, q, method="inverted_cdf"))

    def to_dict(self) -> dict[str, Any]:
        samples = self._samples()
        value = {s.name.rsplit("_", 1)[-1]: s.value for s in samples if "le" not in s.labels}
        return {
            "count": int(value["count"]),
            "sum_s": float(value["sum"]),
            "p50_s": self.quantile(0.5),
            "p99_s": self.quantile(0.99),
            "buckets": [
                {"le": "+Inf" if math.isinf(b) else b, "count": c} for b, c in self.cumulative()
            ],
        }


@dataclass
class PoolStats:
    """Counters the pool keeps; the server's /metrics reads these (all monotonic but peak)."""

    hits: int = 0
    misses: int = 0
    timeouts: int = 0
    fail_fast: int = 0  # acquires refused because the key was failing
    created: int = 0
    failures: int = 0  # failed backend.create() attempts
    destroyed: int = 0
    destroy_failures: int = 0
    health_replaced: int = 0  # ready sandboxes found dead at acquire and replaced
    idle_recycled: int = 0
    evicted: int = 0  # ready sandboxes destroyed to give a starved key a slot
    reaped: int = 0  # the backend's expired leftovers removed by start()
    swept: int = 0  # sandboxes of our owner id the pool did not hold, removed by the sweep
    sweep_errors: int = 0  # failed sweep listings and removals (retried next round)
    peak_total: int = 0
    acquire_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    hit_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    miss_latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def counters(self) -> dict[str, int]:
        """The plain counters, by name (for Prometheus `sandgym_pool_<name>_total`)."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "timeouts": self.timeouts,
            "fail_fast": self.fail_fast,
            "created": self.created,
            "failures": self.failures,
            "destroyed": self.destroyed,
            "destroy_failures": self.destroy_failures,
            "health_replaced": self.health_replaced,
            "idle_recycled": self.idle_recycled,
            "evicted": self.evicted,
            "reaped": self.reaped,
            "swept": self.swept,
            "sweep_errors": self.sweep_errors,
        }


# ---------------------------------------------------------------------------------------------
# internal state
# ---------------------------------------------------------------------------------------------
class _TokenBucket:
    """Async token bucket; callers wait for a token (only creators, behind the semaphore)."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.last = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return
            await asyncio.sleep((1.0 - self.tokens) / self.rate)


@dataclass
class _Ready:
    sandbox: Sandbox
    since: float  # monotonic time it became ready


@dataclass
class _Key:
    """Everything the pool knows about one fingerprint."""

    key: str
    spec: SandboxSpec
    ready: deque[_Ready] = field(default_factory=deque)
    creating: int = 0
    leased: int = 0
    waiters: deque[asyncio.Future[Sandbox]] = field(default_factory=deque)
    last_demand: float = -math.inf
    prewarm_target: int = 0
    replace_credit: int = 0  # releases not yet followed by a hit: replacements owed
    consecutive_failures: int = 0
    failing_until: float = -math.inf
    last_error: BaseException | None = None
    last_served: int = 0  # dispatch sequence number, for round-robin tie breaks
    forgotten: bool = False  # `forget`: make no more, destroy what comes ready unasked

    def in_demand(self, now: float, window_s: float) -> bool:
        return now - self.last_demand <= window_s

    def failing(self, now: float) -> bool:
        return now < self.failing_until

    def unserved(self) -> int:
        """Waiters that no in-flight creation will serve. Every future in `waiters` is
        pending: a waiter is popped before it is handed a result, and removed when its
        acquire gives up; so this is O(1), not a scan per dispatch."""
        return max(0, len(self.waiters) - self.creating)

    def held(self) -> int:
        return len(self.ready) + self.creating + self.leased


class _OwnerLedger:
    """What the pools on one backend owner id know of its sandboxes, for the sweep: shared by
    every pool of that (backend kind, owner id), so pools sharing it never sweep each other's."""

    def __init__(self) -> None:
        self.tracked: set[str] = set()  # created and not yet destroyed, by any of these pools
        self.in_flight: set[int] = set()  # tokens of backend.create() calls running now
        self.seen: dict[str, Sighting] = {}  # untracked ids a sweep saw, for the next round
        self.sweeping = False  # one round at a time

    def track(self, sandbox_id: str) -> None:
        self.tracked.add(sandbox_id)
        self.seen.pop(sandbox_id, None)


#: (backend name, owner id) -> its ledger, while some pool holds it
_LEDGERS: weakref.WeakValueDictionary[tuple[str, str], _OwnerLedger] = weakref.WeakValueDictionary()
_CREATE_TOKENS = itertools.count(1)


def _ledger_for(backend: SandboxBackend) -> _OwnerLedger:
    key = (backend.name, backend.owner_id)
    ledger = _LEDGERS.get(key)
    if ledger is None:
        ledger = _LEDGERS[key] = _OwnerLedger()
    return ledger


# ---------------------------------------------------------------------------------------------
# the pool
# ---------------------------------------------------------------------------------------------
class SandboxPool:
    """Warm pool of fresh sandboxes for one backend. See the module docstring for the rules."""

    def __init__(self, backend: SandboxBackend, settings: PoolSettings | None = None) -> None:
        self.backend = backend
        self.settings = settings or PoolSettings()
        self.stats = PoolStats(
            acquire_latency=LatencyHistogram(self.settings.latency_window),
            hit_latency=LatencyHistogram(self.settings.latency_window),
            miss_latency=LatencyHistogram(self.settings.latency_window),
        )
        self._keys: dict[str, _Key] = {}
        self._leased: dict[str, _Key] = {}  # sandbox id -> its key
        self._leased_sb: dict[str, Sandbox] = {}
        self._destroying = 0
        self._create_sem = asyncio.Semaphore(self.settings.max_concurrent_creates)
        self._bucket = (
            _TokenBucket(self.settings.create_rate_per_s, self.settings.create_burst)
            if self.settings.create_rate_per_s is not None
            else None
        )
        self._create_tasks: set[asyncio.Task[None]] = set()
        self._destroy_tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._in_backend_create: set[asyncio.Task[Any]] = set()
        self._close_event = asyncio.Event()
        self._seq = 0
        self._idle_event = asyncio.Event()
        self._idle_event.set()
        self._ledger = _ledger_for(backend)
        self._sweep_task: asyncio.Task[None] | None = None
        self._keeper = LifetimeKeeper(self.settings.lifetime)
        limits = self.settings.host_limits
        self._host_limiter = (
            HostCreateLimiter(backend.name, limits)
            if limits is not None and limits.active
            else None
        )

    # -- public API ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Reap the backend's expired leftovers, then start the background refill loop."""
        if self._closing:
            raise PoolClosedError("pool is closed; create a new SandboxPool")
        if self._loop_task is not None:
            return
        try:
            reaped = await self.backend.reap()
            self.stats.reaped += len(reaped)
            if reaped:
                log.info("pool: reaped %d leftover sandboxes of %s", len(reaped), self.backend.name)
        except Exception as exc:
            # A reap failure must not keep the server down; the next start or `sandgym reap` retries.
            log.warning("pool: reaping leftovers of backend %s failed: %s", self.backend.name, exc)
        self._loop_task = asyncio.create_task(self._maintenance_loop(), name="sandgym-pool-refill")
        if self.settings.sweep_interval_s is not None:
            self._sweep_task = asyncio.create_task(self._sweep_loop(), name="sandgym-pool-sweep")

    async def acquire(self, spec: SandboxSpec, timeout_s: float | None = None) -> Sandbox:
        """A fresh sandbox matching `spec`: a ready one when there is one, else a new one.

        Raises PoolTimeoutError after `timeout_s` (default `acquire_timeout_s`),
        PoolKeyFailingError while the key is failing, PoolClosedError after close().
        """
        started = time.perf_counter()
        timeout_s = self.settings.acquire_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self._check_open()
        k = await self._key_for(spec)
        now = time.monotonic()
        k.last_demand = now
        self._raise_if_failing(k, now)

        # Hit path: a ready sandbox, checked alive first; dead ones are replaced silently.
        while k.ready:
            item = k.ready.popleft()
            sb = item.sandbox
            if now - item.since > self.settings.max_idle_s:
                self.stats.idle_recycled += 1
                self._destroy_bg(sb)
                continue
            self._lease(k, sb)
            try:
                healthy = not self.settings.health_check or await self._healthy(sb)
            except asyncio.CancelledError:
                # The caller gave up mid-check: the sandbox is still fresh, keep it.
                self._unlease(sb)
                self._put_ready(k, sb)
                raise
            if not healthy:
                self._unlease(sb)
                self.stats.health_replaced += 1
                log.info("pool: ready sandbox %s was dead; replacing it", sb.id)
                self._destroy_bg(sb)
                self._dispatch()
                continue
            if self._closing:  # close() began during the health check
                self._unlease(sb)
                self._destroy_bg(sb)
                raise PoolClosedError("pool closed while acquiring")
            sb.from_pool = True
            k.replace_credit = max(0, k.replace_credit - 1)  # a replacement was used
            self.stats.hits += 1
            self._observe(started, hit=True)
            self._dispatch()  # refill behind the hit, off the caller's path
            return sb

        # Miss path: wait for a creation (ours, or one already in flight for this key). The
        # key may have turned failing during a health check above: no waiter for it then.
        self._raise_if_failing(k, time.monotonic())
        fut: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        k.waiters.append(fut)
        self._dispatch()
        try:
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.wait({fut}, timeout=remaining)
        except asyncio.CancelledError:
            self._abandon_waiter(k, fut)
            raise
        if not fut.done():
            self._abandon_waiter(k, fut)
            self.stats.timeouts += 1
            raise PoolTimeoutError(
                f"no sandbox for key {k.key} within {timeout_s:.3g}s "
                f"(pool holds {self.total()} of max_total {self.settings.max_total}; "
                f"{k.creating} creating for this key)"
            )
        if fut in k.waiters:  # normally popped by whoever handed it over
            k.waiters.remove(fut)  # (a failed deque.remove would format the future's repr)
        sb = fut.result()  # raises the creation error handed to this waiter
        if self._closing or sb.closed:
            # close() ran between the hand-off and now; it destroys leased sandboxes too.
            self._unlease(sb)
            if not sb.closed:
                self._destroy_bg(sb)
            raise PoolClosedError("pool closed while acquiring")
        sb.from_pool = False
        self.stats.misses += 1
        self._observe(started, hit=False)
        return sb

    async def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back: it is destroyed in the background and never reused."""
        k = self._leased.get(sandbox.id)
        if k is None:
            if not sandbox.closed:
                # Not ours (or already released): still never reuse it, but count nothing.
                log.warning("pool: release of sandbox %s the pool does not lease", sandbox.id)
                task = asyncio.create_task(self._close_quietly(sandbox))
                self._destroy_tasks.add(task)
                task.add_done_callback(self._destroy_tasks.discard)
            return
        self._unlease(sandbox)
        now = time.monotonic()
        if not self._closing and k.in_demand(now, self.settings.demand_window_s):
            k.replace_credit = min(k.replace_credit + 1, self.settings.max_total)
        self._destroy_bg(sandbox)
        self._dispatch()

    async def prewarm(
        self,
        specs: Mapping[SandboxSpec, int] | Iterable[SandboxSpec | tuple[SandboxSpec, int]],
        count: int = 1,
    ) -> None:
        """Mark keys in demand and fill them to `count` ready sandboxes (or the mapped count).

        `SandboxSpec` is not hashable (it holds dicts), so `(spec, count)` pairs are accepted
        alongside a mapping or plain specs. Returns once creations are scheduled; use
        `wait_idle()` to wait for them.
        """
        self._check_open()
        pairs: list[tuple[SandboxSpec, int]] = []
        if isinstance(specs, Mapping):
            pairs = [(s, int(n)) for s, n in specs.items()]
        else:
            for item in specs:
                if isinstance(item, tuple):
                    pairs.append((item[0], int(item[1])))
                else:
                    pairs.append((item, count))
        now = time.monotonic()
        for spec, n in pairs:
            if n < 0:
                raise ValueError(f"prewarm count must be >= 0, got {n}")
            k = await self._key_for(spec)
            k.last_demand = now
            k.prewarm_target = n
        self._dispatch()

    async def forget(self, spec: SandboxSpec, timeout_s: float = 60.0) -> None:
        """Stop keeping sandboxes of `spec` (what they start from is about to be removed: a
        group's snapshot): its ready ones are destroyed, no more are made, and one still being
        created is destroyed when done unless an acquire waits for it. Returns once none is
        being created (at most `timeout_s`)."""
        k = self._keys.get(spec.fingerprint(self.backend.name))
        if k is None:
            return
        k.forgotten = True
        k.prewarm_target = k.replace_credit = 0
        while k.ready:
            self._destroy_bg(k.ready.popleft().sandbox)
        deadline = time.monotonic() + timeout_s
        # a bounded poll of one counter; an Event per key would cost every creation
        while k.creating and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        self._dispatch()

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able picture of the pool (for `GET /v1/pool` and benchmarks)."""
        now = time.monotonic()
        keys = {}
        for k in self._keys.values():
            keys[k.key] = {
                "ready": len(k.ready),
                "creating": k.creating,
                "leased": k.leased,
                "waiting": sum(1 for w in k.waiters if not w.done()),
                "target": self._target(k, now),
                "in_demand": k.in_demand(now, self.settings.demand_window_s),
                "failing": k.failing(now),
                "consecutive_failures": k.consecutive_failures,
                "last_error": None if k.last_error is None else _describe(k.last_error),
                "image": k.spec.image,
            }
        s = self.stats
        return {
            "backend": self.backend.name,
            "owner_id": self.backend.owner_id,
            "closed": self._closing,
            "totals": {
                "ready": sum(len(k.ready) for k in self._keys.values()),
                "creating": sum(k.creating for k in self._keys.values()),
                "leased": sum(k.leased for k in self._keys.values()),
                "destroying": self._destroying,
                "total": self.total(),
                "max_total": self.settings.max_total,
                "peak_total": s.peak_total,
            },
            "keys": keys,
            "lifetime": self._keeper.stats(),
            **(
                {"create_limits": self._host_limiter.stats()}
                if self._host_limiter is not None
                else {}
            ),
            **s.counters(),
            "acquire_latency_s": {
                **s.acquire_latency.to_dict(),
                "hit": {
                    "p50_s": s.hit_latency.quantile(0.5),
                    "p99_s": s.hit_latency.quantile(0.99),
                },
                "miss": {
                    "p50_s": s.miss_latency.quantile(0.5),
                    "p99_s": s.miss_latency.quantile(0.99),
                },
            },
        }

    def total(self) -> int:
        """Sandboxes the pool holds now: ready + creating + leased + being destroyed."""
        return sum(k.held() for k in self._keys.values()) + self._destroying

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        """Wait until no creation or destruction is in flight and every target is met (or
        cannot be met now: capped, failing). Meant for tests, benchmarks and prewarm callers."""

        async def _wait() -> None:
            while True:
                await self._idle_event.wait()
                await asyncio.sleep(0)  # let done-callbacks that clear the event run
                if self._idle_event.is_set():
                    return

        await asyncio.wait_for(_wait(), timeout_s)

    async def close(self) -> None:
        """Destroy every sandbox the pool holds (ready, leased, being created). Idempotent.

        Runs to completion even if the calling task is cancelled; the cancellation is re-raised
        once everything is destroyed.
        """
        self._closing = True
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close_impl())
        cancelled = False
        while not self._close_task.done():
            try:
                await asyncio.shield(self._close_task)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        self._close_task.result()

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- keys, leases, failing -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closing:
            raise PoolClosedError("pool is closed; it hands out no more sandboxes")

    async def _key_for(self, spec: SandboxSpec) -> _Key:
        if spec.needs_hashing(self.backend.name):
            # Hashing a build context reads every file in it: keep that off the event loop.
            key = await asyncio.to_thread(spec.fingerprint, self.backend.name)
        else:
            key = spec.fingerprint(self.backend.name)
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = _Key(key=key, spec=spec)
        return k

    def _raise_if_failing(self, k: _Key, now: float) -> None:
        if not k.failing(now):
            return
        self.stats.fail_fast += 1
        raise self._failing_error(k, now)

    def _failing_error(self, k: _Key, now: float) -> PoolKeyFailingError:
        err = PoolKeyFailingError(
            f"sandbox key {k.key} (image {k.spec.image!r}) is failing after "
            f"{k.consecutive_failures} consecutive failed creations; retrying in "
            f"{max(0.0, k.failing_until - now):.1f}s; last error: {_describe(k.last_error)}",
            key=k.key,
            last_error=k.last_error,
        )
        err.__cause__ = k.last_error
        return err

    def _lease(self, k: _Key, sb: Sandbox) -> None:
        k.leased += 1
        self._leased[sb.id] = k
        self._leased_sb[sb.id] = sb

    def _unlease(self, sb: Sandbox) -> _Key | None:
        k = self._leased.pop(sb.id, None)
        self._leased_sb.pop(sb.id, None)
        if k is not None:
            k.leased -= 1
        return k

    def _abandon_waiter(self, k: _Key, fut: asyncio.Future[Sandbox]) -> None:
        """The acquire gave up (timeout/cancel): drop its waiter; a sandbox already handed to
        it is unused and fresh, so it goes back to the ready queue."""
        if fut in k.waiters:
            k.waiters.remove(fut)
        if fut.done():
            if not fut.cancelled() and fut.exception() is None:
                sb = fut.result()
                self._unlease(sb)
                self._put_ready(k, sb)
        else:
            fut.cancel()
        self._dispatch()

    async def _healthy(self, sb: Sandbox) -> bool:
        try:
            # asyncio.timeout, not wait_for: no extra task, so a check that never suspends
            # (local, null) does not hand the loop to whatever else is runnable.
            async with asyncio.timeout(self.settings.health_check_timeout_s):
                return await sb.is_alive() and sb.shell_alive() is not False
        except Exception as exc:  # a check that errors or hangs means "not usable"
            log.info("pool: health check of %s failed: %s", sb.id, exc)
            return False

    def _observe(self, started: float, hit: bool) -> None:
        elapsed = time.perf_counter() - started
        self.stats.acquire_latency.observe(elapsed)
        (self.stats.hit_latency if hit else self.stats.miss_latency).observe(elapsed)

    def _target(self, k: _Key, now: float) -> int:
        """Ready sandboxes the refill aims to keep for this key."""
        if k.forgotten or not k.in_demand(now, self.settings.demand_window_s):
            return 0
        # The credit is "episodes that just ended and will likely start again": it raises the
        # target only beyond what min_ready/prewarm already keep (max, not sum).
        return max(self.settings.min_ready, k.prewarm_target, k.replace_credit)

    def _put_ready(self, k: _Key, sb: Sandbox) -> None:
        """A fresh sandbox for key k: straight to its oldest waiter, else the ready queue."""
        if self._closing:
            self._destroy_bg(sb)
            return
        while k.waiters:
            fut = k.waiters.popleft()
            if fut.done():
                continue
            self._lease(k, sb)
            fut.set_result(sb)
            return
        if k.forgotten:
            self._destroy_bg(sb)
            return
        k.ready.append(_Ready(sb, time.monotonic()))

    # -- dispatch: who gets the next slot --------------------------------------------------------
    def _dispatch(self) -> None:
        """Start the creations that capacity allows: waiting acquires first, fairly across keys
        (fewest slots held first), evicting idle ready sandboxes of other keys for a starved
        waiter; then background refill round-robin by deficit. Synchronous: only reserves slots
        and spawns tasks."""
        if self._closing:
            self._update_idle()
            return
        cap = self.settings.max_total
        now = time.monotonic()

        # 1) waiting acquires.
        while True:
            starving = [k for k in self._keys.values() if k.unserved() > 0 and not k.failing(now)]
            if not starving:
                break
            k = min(starving, key=lambda x: (x.held(), x.last_served))
            if self.total() < cap:
                self._start_create(k)
                continue
            # Capped: slots being destroyed come back soon; evict only beyond those.
            blocked = sum(x.unserved() for x in starving)
            if self._destroying < blocked:
                victims = [x for x in self._keys.values() if x.ready and x.unserved() == 0]
                if victims:
                    victim = max(victims, key=lambda x: (len(x.ready), -x.last_served))
                    item = victim.ready.popleft()
                    self.stats.evicted += 1
                    self._destroy_bg(item.sandbox)
                    continue
            break

        # 2) refill towards targets, one sandbox per key per round (round-robin by deficit).
        if not any(k.unserved() > 0 and not k.failing(now) for k in self._keys.values()):
            while self.total() < cap:
                best: _Key | None = None
                best_rank: tuple[int, int] = (0, 0)
                for k in self._keys.values():
                    if k.failing(now):
                        continue
                    spare = max(0, k.creating - len(k.waiters))
                    deficit = self._target(k, now) - len(k.ready) - spare
                    if deficit <= 0:
                        continue
                    rank = (deficit, -k.last_served)
                    if best is None or rank > best_rank:
                        best, best_rank = k, rank
                if best is None:
                    break
                self._start_create(best)
        self._update_idle()

    def _start_create(self, k: _Key) -> None:
        self._seq += 1
        k.last_served = self._seq
        k.creating += 1
        self._note_peak()
        task = asyncio.create_task(self._create(k), name=f"sandgym-pool-create-{k.key}")
        self._create_tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        # The idle state can only be decided once the finished task left the sets.
        self._create_tasks.discard(task)
        self._destroy_tasks.discard(task)
        self._update_idle()

    def _note_peak(self) -> None:
        self.stats.peak_total = max(self.stats.peak_total, self.total())

    def _update_idle(self) -> None:
        busy = bool(self._create_tasks) or self._destroying > 0
        if not busy and not self._closing:
            now = time.monotonic()
            # Targets that can be met now but are not are "work pending" too.
            for k in self._keys.values():
                if k.failing(now):
                    continue
                if len(k.ready) < self._target(k, now) and self.total() < self.settings.max_total:
                    busy = True
                    break
        if busy:
            self._idle_event.clear()
        else:
            self._idle_event.set()

    # -- creation and destruction ----------------------------------------------------------------
    async def _create(self, k: _Key) -> None:
        """One slot's creation, with retries; the slot is held until success or final failure."""
        s = self.settings
        attempt = 0
        sb: Sandbox | None = None
        error: BaseException | None = None
        try:
            while not self._closing:
                try:
                    async with self._create_sem:
                        if self._bucket is not None:
                            await self._bucket.take()
                        if self._closing:
                            break
                        # close() waits for tasks inside backend.create() (so it can destroy
                        # what they make) and cancels the ones still queued or backing off.
                        me = asyncio.current_task()
                        if me is not None:
                            self._in_backend_create.add(me)
                        # The sweep never removes what a creation in flight may return.
                        token = next(_CREATE_TOKENS)
                        self._ledger.in_flight.add(token)
                        try:
                            async with self._host_start():
                                life = self.settings.lifetime
                                if life.enabled and self._loop_task is not None:
                                    # Only a started pool moves deadlines on (its loop does).
                                    set_first_deadline(time.time() + life.grace_s)
                                sb = await self.backend.create(k.spec)
                            self._ledger.track(sb.id)
                            try:
                                # Ready means ready: the shell is started (and counted in the
                                # creation) before the sandbox is handed out.
                                await sb.warm_up()
                            except BaseException:
                                failed, sb = sb, None
                                try:
                                    await asyncio.shield(self._close_quietly(failed))
                                finally:
                                    self._ledger.tracked.discard(failed.id)
                                raise
                        finally:
                            self._in_backend_create.discard(me)  # type: ignore[arg-type]
                            self._ledger.in_flight.discard(token)
                    error = None
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any backend failure counts; it is reported, not lost
                    error = exc
                    self.stats.failures += 1
                    k.consecutive_failures += 1
                    k.last_error = exc
                    log.warning(
                        "pool: creating a sandbox for key %s failed (attempt %d): %s",
                        k.key,
                        attempt + 1,
                        _describe(exc),
                    )
                    if k.consecutive_failures >= s.failing_after:
                        k.failing_until = time.monotonic() + s.failing_cooldown_s
                        break
                    if attempt >= s.create_retries:
                        break
                    backoff_s = min(s.create_backoff_s * 2**attempt, s.create_backoff_max_s)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._close_event.wait(), backoff_s)
                    attempt += 1
        finally:
            # Runs on success, failure and cancellation (close): the slot must be released
            # exactly once, and a sandbox created for a closing pool is destroyed here.
            k.creating -= 1
            if sb is not None:
                self.stats.created += 1
                k.consecutive_failures = 0
                k.failing_until = -math.inf
                if self._closing:
                    self._destroy_bg(sb)
                else:
                    self._put_ready(k, sb)
                    self._note_peak()
            elif error is not None:
                self._fail_waiters(k, error)
            self._dispatch()

    def _fail_waiters(self, k: _Key, error: BaseException) -> None:
        now = time.monotonic()
        if k.failing(now):
            # The key is failing: every waiter of it fails fast with the last error.
            while k.waiters:
                fut = k.waiters.popleft()
                if not fut.done():
                    fut.set_exception(self._failing_error(k, now))
            return
        # Otherwise this creation served (at most) one waiter: the oldest unserved one.
        if k.unserved() > 0:
            for fut in list(k.waiters):
                if not fut.done():
                    k.waiters.remove(fut)
                    err = SandboxCreateError(
                        f"could not create a sandbox for key {k.key} (image {k.spec.image!r}) "
                        f"after {self.settings.create_retries + 1} attempts: {_describe(error)}"
                    )
                    err.__cause__ = error
                    fut.set_exception(err)
                    break

    def _destroy_bg(self, sb: Sandbox) -> None:
        """Destroy `sb` in the background; its slot stays counted until close() returned."""
        self._destroying += 1
        self._idle_event.clear()
        task = asyncio.create_task(self._destroy(sb), name=f"sandgym-pool-destroy-{sb.id}")
        self._destroy_tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _destroy(self, sb: Sandbox) -> None:
        try:
            await asyncio.wait_for(
                asyncio.shield(sb.close()), timeout=self.settings.destroy_timeout_s
            )
            self.stats.destroyed += 1
        except asyncio.CancelledError:
            self.stats.destroy_failures += 1
            raise
        except Exception as exc:  # a failed destroy is logged; the reaper removes leftovers
            self.stats.destroy_failures += 1
            log.warning("pool: destroying sandbox %s failed: %s", sb.id, _describe(exc))
        finally:
            # Destroyed, or abandoned (failed, too slow): either way no longer ours to keep;
            # what an abandoned destroy leaves is the sweep's to remove.
            self._ledger.tracked.discard(sb.id)
            self._destroying -= 1
            self._dispatch()

    async def _close_quietly(self, sb: Sandbox) -> None:
        try:
            await sb.close()
        except Exception as exc:
            log.warning("pool: closing foreign sandbox %s failed: %s", sb.id, _describe(exc))

    # -- background loop -------------------------------------------------------------------------
    async def _maintenance_loop(self) -> None:
        while not self._closing:
            try:
                self._recycle_idle()
                self._dispatch()
                self._keeper.refresh(self._held())
            except Exception:  # the loop must survive a bug in one round; it is logged
                log.exception("pool: maintenance round failed")
            await asyncio.sleep(self.settings.maintenance_interval_s)

    async def sweep_untracked(self) -> list[str]:
        """One round of the sweep of untracked sandboxes (the background loop runs one every
        `sweep_interval_s`): list the backend's sandboxes under our owner id and remove those
        `sandboxes.labels.sweep_untracked` selects. A leftover is removed on the first round at
        least `sweep_grace_s` after the round that first saw it. Returns the removed ids
        (empty when another pool of the same owner is sweeping, or the backend cannot list).
        A failed listing raises; a failed removal is logged, counted and retried next round."""
        return await self._sweep_round() or []

    async def _sweep_round(self) -> list[str] | None:
        """`sweep_untracked`, but None when the backend cannot list its sandboxes."""
        self._check_open()
        led = self._ledger
        if led.sweeping:
            return []
        led.sweeping = True
        try:
            during = set(led.in_flight)
            listed = await self.backend.owned_sandbox_ids()
            if listed is None:
                return None
            during |= led.in_flight
            before = led.seen
            remove, led.seen = sweep_untracked(
                listed,
                led.tracked,
                before,
                in_flight_during=during,
                in_flight_now=led.in_flight,
                now=time.monotonic(),
                grace_s=self.settings.sweep_grace_s,
            )
            removed: list[str] = []
            for sid in remove:
                try:
                    await self.backend.remove_sandbox(sid)
                except Exception as exc:
                    self.stats.sweep_errors += 1
                    led.seen[sid] = before[sid]  # still a leftover: retried next round
                    log.warning("pool: sweep could not remove sandbox %s: %s", sid, _describe(exc))
                else:
                    removed.append(sid)
            if removed:
                self.stats.swept += len(removed)
                log.info(
                    "pool: swept %d sandboxes of owner %s on %s that the pool did not hold "
                    "(creations whose answer was lost, abandoned destroys): %s",
                    len(removed),
                    self.backend.owner_id,
                    self.backend.name,
                    removed[:10],
                )
            return removed
        finally:
            led.sweeping = False

    async def _sweep_loop(self) -> None:
        interval = self.settings.sweep_interval_s
        assert interval is not None
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._close_event.wait(), interval)
            if self._closing:
                return
            try:
                removed = await self._sweep_round()
            except asyncio.CancelledError:
                raise
            except PoolClosedError:
                return
            except Exception as exc:  # an engine away, an API error: next round retries
                self.stats.sweep_errors += 1
                log.warning(
                    "pool: sweep of untracked sandboxes on %s failed (retrying in %.0f s): %s",
                    self.backend.name,
                    interval,
                    _describe(exc),
                )
                continue
            if removed is None:
                log.debug("pool: backend %s cannot list its sandboxes: no sweep", self.backend.name)
                return

    def _host_start(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The host-wide limits around one `backend.create` (nothing without them)."""
        if self._host_limiter is None:
            return contextlib.nullcontext()
        return self._host_limiter.starting()

    def _held(self) -> list[Sandbox]:
        """Every sandbox the pool holds and hands out: ready and leased."""
        held = [item.sandbox for k in self._keys.values() for item in k.ready]
        return held + list(self._leased_sb.values())

    def _recycle_idle(self) -> None:
        now = time.monotonic()
        for k in self._keys.values():
            keep: deque[_Ready] = deque()
            for item in k.ready:
                if now - item.since > self.settings.max_idle_s:
                    self.stats.idle_recycled += 1
                    # An idle replacement was not wanted; do not owe another one.
                    k.replace_credit = max(0, k.replace_credit - 1)
                    self._destroy_bg(item.sandbox)
                else:
                    keep.append(item)
            k.ready = keep
        # Forget keys nobody wants and that hold nothing, so snapshots stay small.
        for key in [
            key
            for key, k in self._keys.items()
            if k.held() == 0
            and not k.waiters
            and not k.in_demand(now, self.settings.demand_window_s)
            and not k.failing(now)
        ]:
            del self._keys[key]

    # -- close -----------------------------------------------------------------------------------
    async def _close_impl(self) -> None:
        for task in (self._loop_task, self._sweep_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._keeper.aclose()
        closed_err = PoolClosedError("pool closed while waiting for a sandbox")
        for k in self._keys.values():
            while k.waiters:
                fut = k.waiters.popleft()
                if not fut.done():
                    fut.set_exception(closed_err)
            while k.ready:
                self._destroy_bg(k.ready.popleft().sandbox)
        for sb in list(self._leased_sb.values()):
            self._unlease(sb)
            self._destroy_bg(sb)
        # Creations not yet inside backend.create() are cancelled; those inside it finish
        # (their sandbox is destroyed by _create) or are cancelled after close_timeout_s, and
        # whatever a cancelled backend call half-made is left to the label-based reaper.
        self._close_event.set()
        for task in set(self._create_tasks) - self._in_backend_create:
            task.cancel()
        if self._create_tasks:
            _, pending = await asyncio.wait(
                set(self._create_tasks), timeout=self.settings.close_timeout_s
            )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        while self._destroy_tasks:
            await asyncio.wait(set(self._destroy_tasks))
        self._idle_event.set()
        # Retrieve results so no "exception was never retrieved" noise is left behind.
        for k in self._keys.values():
            k.ready.clear()


def _describe(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    return f"{type(exc).__name__}: {exc}"

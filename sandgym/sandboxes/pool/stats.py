"""What the pool counts and shows: its counters and latency histograms (`PoolStats`), and the
typed picture of the whole pool that `SandboxPool.snapshot()` returns (`PoolSnapshot`, served
as JSON by `GET /v1/pool` and read field by field by the server's `/metrics`)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from prometheus_client import Histogram
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from sandgym.sandboxes.createlimit import CreateLimitStats
from sandgym.sandboxes.lifetime import LifetimeStats

#: Upper bounds (seconds) of every latency histogram's buckets: the pool's own and the server's
#: /metrics ones (sandgym/server/metrics.py) share this one set (Prometheus style, +Inf last).
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

    def quantiles(self) -> LatencyQuantiles:
        """The p50 and p99 of the recent window (None without samples)."""
        return LatencyQuantiles(p50_s=self.quantile(0.5), p99_s=self.quantile(0.99))


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
        """The plain counters, by name (as `PoolSnapshot` carries them)."""
        return {name: getattr(self, name) for name in COUNTER_NAMES}

    def acquire_latency_snapshot(self) -> AcquireLatencySnapshot:
        """The acquire latency histogram, with the hit and miss quantiles beside it."""
        h = self.acquire_latency
        return AcquireLatencySnapshot(
            count=h.count,
            sum_s=h.sum_s,
            p50_s=h.quantile(0.5),
            p99_s=h.quantile(0.99),
            buckets=[
                LatencyBucket(le="+Inf" if math.isinf(b) else b, count=c) for b, c in h.cumulative()
            ],
            hit=self.hit_latency.quantiles(),
            miss=self.miss_latency.quantiles(),
        )


#: The monotonic counters of `PoolStats`, in the order the snapshot (and /metrics) lists them.
COUNTER_NAMES: tuple[str, ...] = (
    "hits",
    "misses",
    "timeouts",
    "fail_fast",
    "created",
    "failures",
    "destroyed",
    "destroy_failures",
    "health_replaced",
    "idle_recycled",
    "evicted",
    "reaped",
    "swept",
    "sweep_errors",
)


# ---------------------------------------------------------------------------------------------
# the snapshot
# ---------------------------------------------------------------------------------------------
class _Snapshot(BaseModel):
    """Base of the snapshot models: fields by attribute. `snap["totals"]["creating"]` and
    `"hits" in snap` also work, as on the former dict (some tests still read it by key; the
    product and bench read fields): a name the JSON leaves out raises KeyError."""

    model_config = ConfigDict(extra="forbid")

    #: fields left out of the JSON (and of key reads) while None
    _absent_when_none: ClassVar[frozenset[str]] = frozenset()

    def __contains__(self, name: object) -> bool:
        return (
            isinstance(name, str)
            and name in type(self).model_fields
            and not (name in self._absent_when_none and getattr(self, name) is None)
        )

    def __getitem__(self, name: str) -> Any:
        if name not in self:
            raise KeyError(name)
        return getattr(self, name)

    @model_serializer(mode="wrap")
    def _leave_out_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self._absent_when_none:
            if getattr(self, name) is None:
                data.pop(name, None)
        return data


class PoolKeySnapshot(_Snapshot):
    """One pool key (an environment fingerprint): its sandboxes and its health."""

    ready: int = Field(description="ready sandboxes waiting to be acquired")
    creating: int = Field(description="creations in flight")
    leased: int = Field(description="sandboxes handed out and not yet released")
    waiting: int = Field(description="acquires waiting for a sandbox")
    target: int = Field(description="ready sandboxes the refill aims to keep")
    in_demand: bool = Field(description="acquired or prewarmed within the demand window")
    failing: bool = Field(description="creations kept failing: acquires fail fast")
    consecutive_failures: int = Field(description="failed creations since the last success")
    last_error: str | None = Field(description="`Type: message` of the last creation error")
    image: str | None = Field(description="the image of the key's spec")


class PoolTotals(_Snapshot):
    """Sandboxes the pool holds, over every key."""

    ready: int = Field(description="ready sandboxes")
    creating: int = Field(description="creations in flight")
    leased: int = Field(description="sandboxes handed out")
    destroying: int = Field(description="sandboxes being destroyed (still counted)")
    total: int = Field(description="ready + creating + leased + destroying")
    max_total: int = Field(description="the cap on `total` (PoolSettings.max_total)")
    peak_total: int = Field(description="the highest `total` seen")


class LatencyBucket(_Snapshot):
    """One cumulative histogram bucket, as Prometheus `_bucket` has it."""

    le: Literal["+Inf"] | float = Field(description="upper bound in seconds; '+Inf' for the last")
    count: int = Field(description="samples <= le")


class LatencyQuantiles(_Snapshot):
    """Nearest-rank quantiles of the recent window of latencies."""

    p50_s: float | None = Field(description="median; None without samples")
    p99_s: float | None = Field(description="99th percentile; None without samples")


class AcquireLatencySnapshot(_Snapshot):
    """The latency of `acquire()`: every call's histogram, and hits and misses apart."""

    count: int = Field(description="acquires observed")
    sum_s: float = Field(description="their total latency in seconds")
    p50_s: float | None = Field(description="median of the recent window; None without samples")
    p99_s: float | None = Field(description="99th percentile of the recent window")
    buckets: list[LatencyBucket] = Field(description="cumulative buckets, LATENCY_BUCKETS_S")
    hit: LatencyQuantiles = Field(description="acquires served by a ready sandbox")
    miss: LatencyQuantiles = Field(description="acquires that waited for a creation")


class PoolSnapshot(_Snapshot):
    """The whole pool at one moment (`SandboxPool.snapshot()`; `GET /v1/pool` is its JSON)."""

    backend: str = Field(description="the backend's name")
    owner_id: str = Field(description="the owner id labelled on the backend's sandboxes")
    closed: bool = Field(description="close() has begun")
    totals: PoolTotals
    keys: dict[str, PoolKeySnapshot] = Field(description="per key (environment fingerprint)")
    lifetime: LifetimeStats = Field(description="the sandboxes' self-ending deadlines")
    create_limits: CreateLimitStats | None = Field(
        default=None, description="host-wide creation limits; left out of the JSON when unset"
    )
    hits: int = Field(description="acquires served by a ready sandbox")
    misses: int = Field(description="acquires that waited for a creation")
    timeouts: int = Field(description="acquires that gave up (PoolTimeoutError)")
    fail_fast: int = Field(description="acquires refused because the key was failing")
    created: int = Field(description="sandboxes created")
    failures: int = Field(description="failed backend.create() attempts")
    destroyed: int = Field(description="sandboxes destroyed")
    destroy_failures: int = Field(description="destroys that failed or were abandoned")
    health_replaced: int = Field(description="ready sandboxes found dead at acquire, replaced")
    idle_recycled: int = Field(description="ready sandboxes destroyed for being idle too long")
    evicted: int = Field(description="ready sandboxes destroyed to give a starved key a slot")
    reaped: int = Field(description="the backend's expired leftovers removed by start()")
    swept: int = Field(description="sandboxes of the owner id the pool did not hold, removed")
    sweep_errors: int = Field(description="failed sweep listings and removals")
    acquire_latency_s: AcquireLatencySnapshot

    # The JSON has had no `create_limits` key at all without host limits: kept so.
    _absent_when_none: ClassVar[frozenset[str]] = frozenset({"create_limits"})

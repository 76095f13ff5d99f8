"""Prometheus metrics of one server, in a registry of its own (two apps in a process never clash).

Per-step cost is one counter increment and one histogram observation on pre-bound children;
pool gauges are read field by field from `pool.snapshot()` (a typed `PoolSnapshot`) only when
`/metrics` is scraped. A snapshot that fails is logged and counted
(`sandgym_pool_snapshot_errors_total`), never dropped in silence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandgym.sandboxes.pool import LATENCY_BUCKETS_S, PoolSnapshot
from sandgym.wire.protocol import ACTION_KINDS, ERROR_CODES

log = logging.getLogger(__name__)

_Samples = dict[str, list[tuple[dict[str, str], float]]]


class _PoolCollector(Collector):
    """The fields of `pool.snapshot()` (a `PoolSnapshot`) as `sandgym_pool_*` gauges."""

    def __init__(self, snapshot: Callable[[], PoolSnapshot]) -> None:
        self._snapshot = snapshot
        self.errors = 0

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._snapshot()
        except Exception:
            # The scrape still answers (every other metric is there), and says why the pool's
            # gauges are missing: logged with the traceback, and counted in this same scrape.
            log.exception("pool snapshot failed: /metrics carries no sandgym_pool_* gauges")
            self.errors += 1
            snap = None
        yield CounterMetricFamily(
            "sandgym_pool_snapshot_errors",
            "scrapes whose pool snapshot failed (their pool gauges were left out; see the log)",
            value=self.errors,
        )
        if snap is None:
            return
        for name, samples in pool_gauges(snap).items():
            label_names = sorted({k for labels, _ in samples for k in labels})
            fam = GaugeMetricFamily(name, f"pool snapshot field {name}", labels=label_names)
            for labels, value in samples:
                fam.add_metric([labels.get(k, "") for k in label_names], value)
            yield fam


def pool_gauges(snap: PoolSnapshot) -> _Samples:
    """The gauges of one snapshot by metric name, as `(labels, value)` samples, in the order the
    snapshot declares its fields. A pool key (a fingerprint) is a `key` label, a latency bucket
    an `index` label; a quantile without samples (None) gives no sample."""
    out: _Samples = {}

    def put(name: str, value: float | None, labels: dict[str, str] | None = None) -> None:
        if value is not None:
            out.setdefault(f"sandgym_pool_{name}", []).append((labels or {}, float(value)))

    put("closed", snap.closed)
    t = snap.totals
    put("totals_ready", t.ready)
    put("totals_creating", t.creating)
    put("totals_leased", t.leased)
    put("totals_destroying", t.destroying)
    put("totals_total", t.total)
    put("totals_max_total", t.max_total)
    put("totals_peak_total", t.peak_total)
    for key, k in snap.keys.items():
        label = {"key": key}
        put("keys_ready", k.ready, label)
        put("keys_creating", k.creating, label)
        put("keys_leased", k.leased, label)
        put("keys_waiting", k.waiting, label)
        put("keys_target", k.target, label)
        put("keys_in_demand", k.in_demand, label)
        put("keys_failing", k.failing, label)
        put("keys_consecutive_failures", k.consecutive_failures, label)
    life = snap.lifetime
    put("lifetime_writes", life.writes)
    put("lifetime_errors", life.errors)
    put("lifetime_grace_s", life.grace_s)
    limits = snap.create_limits
    if limits is not None:
        put("create_limits_rate_per_s", limits.rate_per_s)
        put("create_limits_max_starting", limits.max_starting)
        put("create_limits_waits", limits.waits)
        put("create_limits_wait_seconds", limits.wait_seconds)
        put("create_limits_waiting", limits.waiting)
        put("create_limits_starting", limits.starting)
    put("hits", snap.hits)
    put("misses", snap.misses)
    put("timeouts", snap.timeouts)
    put("fail_fast", snap.fail_fast)
    put("created", snap.created)
    put("failures", snap.failures)
    put("destroyed", snap.destroyed)
    put("destroy_failures", snap.destroy_failures)
    put("health_replaced", snap.health_replaced)
    put("idle_recycled", snap.idle_recycled)
    put("evicted", snap.evicted)
    put("reaped", snap.reaped)
    put("swept", snap.swept)
    put("sweep_errors", snap.sweep_errors)
    lat = snap.acquire_latency_s
    put("acquire_latency_s_count", lat.count)
    put("acquire_latency_s_sum_s", lat.sum_s)
    put("acquire_latency_s_p50_s", lat.p50_s)
    put("acquire_latency_s_p99_s", lat.p99_s)
    for i, bucket in enumerate(lat.buckets):
        index = {"index": str(i)}
        # the last bound is the string "+Inf" in the JSON, and has never been a sample
        put("acquire_latency_s_buckets_le", None if bucket.le == "+Inf" else bucket.le, index)
        put("acquire_latency_s_buckets_count", bucket.count, index)
    put("acquire_latency_s_hit_p50_s", lat.hit.p50_s)
    put("acquire_latency_s_hit_p99_s", lat.hit.p99_s)
    put("acquire_latency_s_miss_p50_s", lat.miss.p50_s)
    put("acquire_latency_s_miss_p99_s", lat.miss.p99_s)
    return out


class ServerMetrics:
    """The metrics the server updates; `render()` is the `/metrics` body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(
            "sandgym_sessions_active", "episodes alive (attached or in grace)", registry=r
        )
        self.sessions_detached = Gauge(
            "sandgym_sessions_detached", "episodes waiting for a resume", registry=r
        )
        self.connections = Gauge("sandgym_connections", "open websocket connections", registry=r)
        self.episodes = Counter(
            "sandgym_episodes", "episodes ended, by how", ["outcome"], registry=r
        )
        self.steps = Counter("sandgym_steps", "steps handled", registry=r)
        self.errors = Counter("sandgym_errors", "error replies by code", ["code"], registry=r)
        self.action_latency = Histogram(
            "sandgym_action_latency_seconds",
            "time spent applying an action in the sandbox",
            ["kind"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.acquire_latency = Histogram(
            "sandgym_acquire_latency_seconds",
            "time to get a sandbox from the pool at reset",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tamper_reports = Counter(
            "sandgym_tamper_reports",
            "scored episodes by verify mode and tamper report: clean, tampered (verified anyway: "
            "shared, pristine), refused (refuse-tampered: scored without the verifier), "
            "unchecked (the backend lists no changed paths)",
            ["verify", "report"],
            registry=r,
        )
        self.tampered_paths = Counter(
            "sandgym_tampered_paths",
            "paths named by tamper reports, by category",
            ["category"],
            registry=r,
        )
        # Pre-bind label children so the hot path does no label lookups.
        self.latency_by_kind = {k: self.action_latency.labels(k) for k in ACTION_KINDS}
        self.errors_by_code = {c: self.errors.labels(c) for c in ERROR_CODES}
        self._episodes_by_outcome: dict[str, Any] = {}

    def episode_ended(self, outcome: str) -> None:
        """Count an ended episode (its label child is looked up once per outcome)."""
        child = self._episodes_by_outcome.get(outcome)
        if child is None:
            child = self._episodes_by_outcome[outcome] = self.episodes.labels(outcome)
        child.inc()

    def episode_verified(self, verify: str | None, tamper: Any) -> None:
        """Count one scored episode's tamper report (`sandgym.tasks.tamper.TamperReport`)."""
        if not tamper.checked:
            report = "unchecked"
        elif not tamper.tampered:
            report = "clean"
        else:
            report = "refused" if verify == "refuse-tampered" else "tampered"
        self.tamper_reports.labels(verify or "shared", report).inc()
        counts: dict[str, int] = {}
        for p in tamper.paths:
            counts[p.category] = counts.get(p.category, 0) + 1
        for category, n in counts.items():
            self.tampered_paths.labels(category).inc(n)

    def watch_pool(self, snapshot: Callable[[], PoolSnapshot]) -> None:
        self.registry.register(_PoolCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)

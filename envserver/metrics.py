"""Prometheus metrics of one server, in a registry of its own (two apps in a process never clash).

Per-step cost is one counter increment and one histogram observation on pre-bound children;
pool gauges are read from `pool.snapshot()` only when `/metrics` is scraped. A snapshot that
fails is logged and counted (`sandgym_pool_snapshot_errors_total`), never dropped in silence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from envserver.protocol import ACTION_KINDS, ERROR_CODES
from sandboxes.pool import LATENCY_BUCKETS_S

log = logging.getLogger(__name__)

#: Snapshot fields whose dict is keyed by data (a pool key's fingerprint), not by field names:
#: their keys always become a `key` label. (A fingerprint such as `e694ff01cb6f9c34` looks like
#: a name, and became part of the metric name: one family per key, nothing to aggregate.)
_DATA_KEYED = frozenset({"sandgym_pool_keys"})


class _PoolCollector(Collector):
    """Flattens the numbers in `pool.snapshot()` into `sandgym_pool_*` gauges."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
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
        flat: dict[str, list[tuple[dict[str, str], float]]] = {}
        _flatten(snap, "sandgym_pool", {}, flat)
        for name, samples in flat.items():
            label_names = sorted({k for labels, _ in samples for k in labels})
            fam = GaugeMetricFamily(name, f"pool snapshot field {name}", labels=label_names)
            for labels, value in samples:
                fam.add_metric([labels.get(k, "") for k in label_names], value)
            yield fam


def _flatten(
    obj: Any,
    prefix: str,
    labels: dict[str, str],
    out: dict[str, list[tuple[dict[str, str], float]]],
    data_keyed: bool = False,
) -> None:
    """Numbers of `obj` into `out` by metric name; `data_keyed`: `obj`'s keys are data."""
    if isinstance(obj, bool | int | float):
        out.setdefault(prefix, []).append((labels, float(obj)))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            key = str(key)
            named = key.replace("_", "").isalnum() and not key[:1].isdigit()
            if named and not data_keyed:
                name = f"{prefix}_{key}"
                _flatten(value, name, labels, out, data_keyed=name in _DATA_KEYED)
            else:  # a data key (a fingerprint, a spec name) becomes a label
                _flatten(value, prefix, {**labels, "key": key}, out)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            _flatten(value, prefix, {**labels, "index": str(i)}, out)


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
        """Count one scored episode's tamper report (`tasks.tamper.TamperReport`)."""
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

    def watch_pool(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.registry.register(_PoolCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)

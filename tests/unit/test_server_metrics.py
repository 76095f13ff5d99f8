"""The server's /metrics body (sandgym/server/metrics.py) over a real pool on the null backend: pool
gauges keyed by fingerprint as a label, a failed pool snapshot logged and counted (never
dropped in silence), and one set of latency buckets for the pool and the server."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sandgym.sandboxes import SandboxCreateError, SandboxSpec, get_backend
from sandgym.sandboxes.createlimit import CreateLimitSettings
from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.sandboxes.pool import LATENCY_BUCKETS_S, LatencyHistogram, PoolSettings, SandboxPool
from sandgym.server.metrics import ServerMetrics, pool_gauges


def _samples(metrics: ServerMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _spec_with_named_fingerprint() -> SandboxSpec:
    """A spec whose fingerprint starts with a letter (so it looks like a metric name part)."""
    for i in range(100):
        spec = SandboxSpec(image=f"img{i}")
        if spec.fingerprint("null")[0].isalpha():
            return spec
    raise AssertionError("no letter-first fingerprint among 100 specs")


async def test_pool_gauges_carry_every_key_as_a_label() -> None:
    named = _spec_with_named_fingerprint()
    other = next(
        SandboxSpec(image=f"dig{i}")
        for i in range(100)
        if SandboxSpec(image=f"dig{i}").fingerprint("null")[0].isdigit()
    )
    pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=0))
    await pool.start()
    try:
        for spec in (named, other):
            await pool.release(await pool.acquire(spec))
        metrics = ServerMetrics()
        metrics.watch_pool(pool.snapshot)
        samples = _samples(metrics)
    finally:
        await pool.close()
    leased = {labels["key"]: v for labels, v in samples["sandgym_pool_keys_leased"]}
    assert leased == {named.fingerprint("null"): 0.0, other.fingerprint("null"): 0.0}
    stray = [n for n in samples if named.fingerprint("null") in n]
    assert not stray, f"a fingerprint became part of a metric name: {stray}"
    assert samples["sandgym_pool_misses"] == [({}, 2.0)]
    assert samples["sandgym_pool_snapshot_errors_total"] == [({}, 0.0)]


def test_failed_pool_snapshot_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("snapshot exploded")

    metrics = ServerMetrics()
    metrics.watch_pool(broken)
    metrics.steps.inc()
    with caplog.at_level(logging.ERROR, logger="sandgym.server.metrics"):
        first = _samples(metrics)
        second = _samples(metrics)
    assert first["sandgym_steps_total"] == [({}, 1.0)], "the rest of the scrape must still answer"
    assert not [n for n in first if n.startswith("sandgym_pool_") and "snapshot_errors" not in n]
    assert first["sandgym_pool_snapshot_errors_total"] == [({}, 1.0)]
    assert second["sandgym_pool_snapshot_errors_total"] == [({}, 2.0)]
    failures = [r for r in caplog.records if "pool snapshot failed" in r.getMessage()]
    assert len(failures) == 2 and failures[0].exc_info is not None
    assert "snapshot exploded" in caplog.text


async def test_one_set_of_latency_buckets() -> None:
    pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=0))
    await pool.start()
    try:
        await pool.release(await pool.acquire(SandboxSpec(image="x")))
        snap = pool.snapshot()
    finally:
        await pool.close()
    pool_bounds = [math.inf if b.le == "+Inf" else b.le for b in snap.acquire_latency_s.buckets]
    assert pool_bounds == list(LATENCY_BUCKETS_S)
    metrics = ServerMetrics()
    metrics.acquire_latency.observe(0.01)
    text = metrics.render().decode()
    le = re.findall(r'sandgym_acquire_latency_seconds_bucket\{le="([^"]+)"\}', text)
    assert [float(x) for x in le] == list(LATENCY_BUCKETS_S)


def test_latency_histogram_counts_and_nearest_rank_quantiles() -> None:
    h = LatencyHistogram(window=1000)
    values = [0.0004, 0.003, 0.003, 0.2, 7.0, 400.0]
    for v in values:
        h.observe(v)
    d = h.to_dict()
    assert d["count"] == 6 and d["sum_s"] == pytest.approx(sum(values))
    cumulative = dict(h.cumulative())
    assert cumulative[0.0005] == 1 and cumulative[0.005] == 3 and cumulative[0.25] == 4
    assert cumulative[10.0] == 5 and cumulative[300.0] == 5 and cumulative[math.inf] == 6
    assert h.quantile(0.5) == 0.003 and h.quantile(0.99) == 400.0
    assert h.quantile(0.5) == float(np.quantile(values, 0.5, method="inverted_cdf"))
    assert LatencyHistogram().quantile(0.5) is None


def _flatten_by_key_names(
    obj: object, prefix: str, labels: dict[str, str], out: _Flat, data_keyed: bool = False
) -> None:
    """The gauges as /metrics made them before the snapshot was typed (kept here as the
    reference): every number of the snapshot's JSON by its key path, a pool key (a
    fingerprint) as a `key` label, a list position as an `index` label."""
    if isinstance(obj, bool | int | float):
        out.setdefault(prefix, []).append((labels, float(obj)))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if data_keyed:
                _flatten_by_key_names(value, prefix, {**labels, "key": key}, out)
            else:
                name = f"{prefix}_{key}"
                _flatten_by_key_names(value, name, labels, out, name == "sandgym_pool_keys")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            _flatten_by_key_names(value, prefix, {**labels, "index": str(i)}, out)


_Flat = dict[str, list[tuple[dict[str, str], float]]]


class _FailsForImage(NullBackend):
    async def create(self, spec: SandboxSpec) -> NullSandbox:
        if spec.image == "broken":
            raise SandboxCreateError("injected creation failure")
        return await super().create(spec)


@pytest.mark.parametrize("host_limits", [False, True])
async def test_pool_gauges_read_by_name_match_every_number_of_the_snapshot(
    host_limits: bool, tmp_path: Path
) -> None:
    """Every number of the snapshot's JSON is one gauge sample, under the name and labels its
    key path gave it before the snapshot was typed; nothing more, nothing less, same order."""
    limits = CreateLimitSettings(rate_per_s=1000.0, max_starting=4, directory=tmp_path)
    settings = PoolSettings(
        min_ready=1,
        host_limits=limits if host_limits else None,
        sweep_interval_s=None,
        create_retries=0,
        failing_after=1,
    )
    pool = SandboxPool(_FailsForImage(), settings)
    await pool.start()
    try:
        a, b = SandboxSpec(image="a"), SandboxSpec(image="b")
        await pool.prewarm([a])
        await pool.wait_idle(timeout_s=5)
        await pool.release(await pool.acquire(a))  # a hit
        await pool.release(await pool.acquire(b))  # a miss
        with pytest.raises(SandboxCreateError):
            await pool.acquire(SandboxSpec(image="broken"))
        await pool.wait_idle(timeout_s=5)
        snap = pool.snapshot()
    finally:
        await pool.close()
    expected: _Flat = {}
    _flatten_by_key_names(snap.model_dump(), "sandgym_pool", {}, expected)
    gauges = pool_gauges(snap)
    assert gauges == expected
    assert list(gauges) == list(expected), "the families' order changed"
    assert ("create_limits" in snap.model_dump()) is host_limits
    assert len(expected["sandgym_pool_keys_failing"]) == 3  # a, b and the broken key
    assert expected["sandgym_pool_hits"] == [({}, 1.0)]
    # and the scrape carries exactly those families
    metrics = ServerMetrics()
    metrics.watch_pool(lambda: snap)
    scraped = {n: s for n, s in _samples(metrics).items() if n.startswith("sandgym_pool_")}
    del scraped["sandgym_pool_snapshot_errors_total"]
    assert scraped == expected


def test_snapshot_reads_by_key_like_the_former_dict() -> None:
    """lab/bench/ still reads `snap["totals"]["creating"]` and asks `"hits" in snap`; a name the
    JSON leaves out (no host limits: no `create_limits`) is absent there too."""
    snap = SandboxPool(get_backend("null")).snapshot()
    assert snap["totals"]["creating"] == snap.totals.creating == 0
    assert {k: snap[k] for k in ("hits", "misses") if k in snap} == {"hits": 0, "misses": 0}
    assert "create_limits" not in snap and "create_limits" not in snap.model_dump()
    for missing in ("no_such_field", "create_limits"):
        with pytest.raises(KeyError):
            snap[missing]

"""`sandgym bench pool`: what the warm pool buys, measured per backend.

For each backend asked for (`--backends local,docker`; `null` is allowed for development) it
measures, in one run:

- **hit**: acquire latency when a ready sandbox is waiting (pool with `min_ready=1`, the machine
  quiet between samples), p50/p99;
- **cold**: acquire latency when the pool has nothing ready (`min_ready=0`, no demand carried
  over), i.e. a create, p50/p99; and the cold/hit ratio;
- **steady**: `--concurrency` loops of acquire -> one `exec("true")` -> release for
  `--steady-s` seconds: hit rate, episodes per second, peak sandboxes held vs `max_total`.

After each phase the pool is closed and the backend asked for leftovers of its owner
(`reap(only_expired=False)`): a non-zero count is a leak and is reported. A backend that cannot
run here is skipped with the reason recorded. With `--json` one JSON document goes to stdout;
`--out PATH` also writes it (the committed figures live in `lab/bench/results/pool.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from lab.bench.report import percentile_or_none, save_json
from sandgym.sandboxes import SandboxBackend, SandboxSpec, get_backend
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.sandboxes.pool import PoolSettings, SandboxPool

log = logging.getLogger("lab.bench.pool")

KNOWN_BACKENDS = ("local", "docker", "e2b", "null")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--backends",
        default="local,docker",
        help="comma-separated backends to measure (local, docker, e2b; null for development)",
    )
    parser.add_argument(
        "--steady-s", type=float, default=60.0, help="duration of the steady-state phase"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="concurrent episode loops in the steady phase"
    )
    parser.add_argument(
        "--hold-s",
        type=float,
        default=0.0,
        help="steady phase: time an episode keeps its sandbox after the exec (agent think time)",
    )
    parser.add_argument(
        "--samples", type=int, default=20, help="acquire samples for each of hit and cold"
    )
    parser.add_argument(
        "--max-total",
        type=int,
        default=None,
        help="pool max_total in the steady phase (default: 3 x concurrency)",
    )
    parser.add_argument(
        "--image", default=None, help="sandbox image for image-based backends (default: theirs)"
    )
    parser.add_argument(
        "--null-create-delay-s",
        type=float,
        default=0.25,
        help="simulated creation time of the null backend",
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    names = [n.strip() for n in str(args.backends).split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN_BACKENDS]
    if unknown or not names:
        print(
            f"sandgym bench pool: expected --backends from {', '.join(KNOWN_BACKENDS)}, "
            f"got {args.backends!r}",
            file=sys.stderr,
        )
        return 2
    if args.concurrency < 1 or args.samples < 1 or args.steady_s <= 0:
        print(
            "sandgym bench pool: --concurrency and --samples must be >= 1 and --steady-s > 0",
            file=sys.stderr,
        )
        return 2
    doc = asyncio.run(_run_all(args, names))
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        _print_table(doc)
    failed = [n for n, r in doc["backends"].items() if "error" in r or r.get("leak")]
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
async def _run_all(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    max_total = args.max_total or 3 * args.concurrency
    doc: dict[str, Any] = {
        "bench": "pool",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            # Other work on the machine skews latencies; the load says how quiet it was.
            "loadavg_at_start": list(os.getloadavg()),
        },
        "params": {
            "samples": args.samples,
            "steady_s": args.steady_s,
            "concurrency": args.concurrency,
            "hold_s": args.hold_s,
            "max_total": max_total,
            "image": args.image,
        },
        "backends": {},
    }
    for name in names:
        print(f"bench pool: {name} ...", file=sys.stderr)
        doc["backends"][name] = await _bench_backend(name, args, max_total)
    doc["host"]["loadavg_at_end"] = list(os.getloadavg())
    return doc


async def _open_backend(name: str, args: argparse.Namespace) -> SandboxBackend:
    kwargs: dict[str, Any] = {}
    if name == "null":
        kwargs["create_delay_s"] = args.null_create_delay_s
    return get_backend(name, **kwargs)


async def _bench_backend(name: str, args: argparse.Namespace, max_total: int) -> dict[str, Any]:
    try:
        backend = await _open_backend(name, args)
    except Exception as exc:  # missing module, SDK or engine: a reason, not a crash
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    spec = SandboxSpec(image=args.image)
    out: dict[str, Any] = {}
    try:
        # One probe creation: proves the backend works here and pays one-off costs (image
        # lookups, client connection) outside the samples.
        try:
            async with OwnLifetimes() as lifetimes:  # ends by itself if this is killed
                probe = await lifetimes.create(backend, spec, limit_s=0.0)
                await probe.close()
        except Exception as exc:
            return {"skipped": f"cannot create a sandbox here: {type(exc).__name__}: {exc}"}
        out["hit"] = await _latency_phase(backend, spec, args.samples, warm=True)
        out["cold"] = await _latency_phase(backend, spec, args.samples, warm=False)
        out["cold_over_hit"] = {
            q: _ratio(out["cold"][f"{q}_s"], out["hit"][f"{q}_s"]) for q in ("p50", "p99")
        }
        out["steady"] = await _steady_phase(backend, spec, args, max_total)
        leftovers = await backend.reap(only_expired=False)
        out["leftovers_after_close"] = len(leftovers)
        out["leak"] = bool(leftovers) or bool(getattr(backend, "live", None))
    except Exception as exc:
        log.exception("bench pool: %s failed", name)
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await backend.aclose()
    return out


async def _latency_phase(
    backend: SandboxBackend, spec: SandboxSpec, samples: int, warm: bool
) -> dict[str, Any]:
    """Acquire latency with a ready sandbox waiting (warm) or with none (cold), one at a time on
    a quiet machine: the pool settles (creations and destroys done) before each sample."""
    settings = PoolSettings(
        min_ready=1 if warm else 0,
        max_total=4,
        # Cold: no demand carried over, so a release schedules no replacement.
        demand_window_s=3600 if warm else 0,
        max_idle_s=3600,
    )
    pool = SandboxPool(backend, settings)
    await pool.start()
    lat: list[float] = []
    from_pool = 0
    try:
        if warm:
            await pool.prewarm([spec])
        for _ in range(samples):
            await pool.wait_idle(timeout_s=120)
            t0 = time.perf_counter()
            sb = await pool.acquire(spec)
            lat.append(time.perf_counter() - t0)
            from_pool += int(sb.from_pool)
            await pool.release(sb)
        await pool.wait_idle(timeout_s=120)
    finally:
        await pool.close()
    return {
        "samples": len(lat),
        "from_pool": from_pool,
        "p50_s": _quantile(lat, 0.5),
        "p99_s": _quantile(lat, 0.99),
        "mean_s": sum(lat) / len(lat),
        "max_s": max(lat),
    }


async def _steady_phase(
    backend: SandboxBackend, spec: SandboxSpec, args: argparse.Namespace, max_total: int
) -> dict[str, Any]:
    n = args.concurrency
    settings = PoolSettings(min_ready=n, max_total=max_total, max_concurrent_creates=n)
    pool = SandboxPool(backend, settings)
    await pool.start()
    await pool.prewarm([spec], count=n)
    await pool.wait_idle(timeout_s=300)
    episodes = 0
    hits = 0
    exec_failures = 0
    lat: list[float] = []
    hit_lat: list[float] = []
    miss_lat: list[float] = []
    lags: list[float] = []
    peak_seen = 0
    started = time.perf_counter()
    deadline = started + args.steady_s

    async def lag_monitor() -> None:
        # How late the event loop wakes a 10 ms sleeper: a backend that blocks the loop
        # (a fork, a synchronous call) shows here, and it delays every acquire, hits included.
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - t0 - 0.01)

    async def loop() -> None:
        nonlocal episodes, hits, exec_failures, peak_seen
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            sb = await pool.acquire(spec)
            took = time.perf_counter() - t0
            lat.append(took)
            (hit_lat if sb.from_pool else miss_lat).append(took)
            peak_seen = max(peak_seen, pool.total())
            try:
                res = await sb.exec("true", timeout_s=60)
                exec_failures += int(res.exit_code != 0)
                if args.hold_s:
                    await asyncio.sleep(args.hold_s)
            finally:
                await pool.release(sb)
            episodes += 1
            hits += int(sb.from_pool)

    try:
        await asyncio.gather(lag_monitor(), *(loop() for _ in range(n)))
        elapsed = time.perf_counter() - started
        snap = pool.snapshot()
    finally:
        await pool.close()
    peak = max(peak_seen, pool.stats.peak_total)
    return {
        "concurrency": n,
        "duration_s": elapsed,
        "episodes": episodes,
        "episodes_per_s": episodes / elapsed,
        "hit_rate": hits / episodes if episodes else None,
        "acquire_p50_s": _quantile(lat, 0.5),
        "acquire_p99_s": _quantile(lat, 0.99),
        "hit_acquire_p50_s": _quantile(hit_lat, 0.5),
        "miss_acquire_p50_s": _quantile(miss_lat, 0.5),
        "event_loop_lag_p50_s": _quantile(lags, 0.5),
        "event_loop_lag_p99_s": _quantile(lags, 0.99),
        "exec_failures": exec_failures,
        "peak_total": peak,
        "max_total": max_total,
        "peak_within_max_total": peak <= max_total,
        "created": snap.created,
        "destroyed_before_close": snap.destroyed,
        "health_replaced": snap.health_replaced,
        "failures": snap.failures,
    }


# ---------------------------------------------------------------------------------------------
def _quantile(values: list[float], q: float) -> float | None:
    return percentile_or_none(values, q * 100)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.2f} ms"


def _print_table(doc: dict[str, Any]) -> None:
    for name, r in doc["backends"].items():
        if "skipped" in r:
            print(f"{name:7s} skipped: {r['skipped']}")
            continue
        if "error" in r:
            print(f"{name:7s} error: {r['error']}")
            continue
        hit, cold, st = r["hit"], r["cold"], r["steady"]
        ratio = r["cold_over_hit"]["p50"]
        print(
            f"{name:7s} hit p50 {_ms(hit['p50_s'])} p99 {_ms(hit['p99_s'])} | "
            f"cold p50 {_ms(cold['p50_s'])} p99 {_ms(cold['p99_s'])} | "
            f"cold/hit p50 x{ratio:.0f} | steady {st['episodes_per_s']:.1f} ep/s, "
            f"hit rate {st['hit_rate']:.2%}, peak {st['peak_total']}/{st['max_total']}, "
            f"leftovers {r['leftovers_after_close']}"
            if ratio is not None
            else f"{name:7s} {r}"
        )

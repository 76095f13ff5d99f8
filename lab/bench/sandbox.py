"""`sandgym bench sandbox`: the latency of one sandbox's life, per backend, in one run.

For each backend asked for (`--backends local,docker`; `null` allowed for development) it runs
`--n` sequential cycles, after one untimed warm-up cycle, and reports p50/p99 (nearest rank) of:

- `create`: `backend.create(SandboxSpec())` until the sandbox can run commands;
- `first_exec`: the first `exec("true")` in a fresh sandbox;
- `shell_start`: the first `run("true")` (spawns the persistent shell);
- `shell_rtt`: `run("true")` in the warm shell (`--shell-runs` samples per sandbox);
- `close`: `close()` until the sandbox is gone;
- `cycle`: create + first exec + close.

With docker in the list it also times the raw baseline `docker run --rm IMAGE true` (the CLI,
no SDK, no limits), so the backend's overhead reads against what Docker itself costs here.
A backend that cannot run is skipped with its reason. After each backend, leftovers of the
bench's owner are reaped and counted (non-zero = a leak). `--json` prints one JSON document;
`--out PATH` also writes it (committed figures: `lab/bench/results/sandbox_latency.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab.bench import report
from lab.bench.report import save_json
from sandgym.sandboxes import SandboxBackend, SandboxSpec, get_backend
from sandgym.sandboxes.lifetime import OwnLifetimes

log = logging.getLogger("lab.bench.sandbox")

KNOWN_BACKENDS = ("local", "docker", "e2b", "null")
DEFAULT_IMAGE = "sandgym/terminal:latest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--n", type=int, default=30, help="timed cycles per backend")
    parser.add_argument(
        "--backends", default="local,docker", help="comma-separated backends to measure"
    )
    parser.add_argument(
        "--shell-runs", type=int, default=5, help="warm-shell round trips timed per sandbox"
    )
    parser.add_argument(
        "--image", default=DEFAULT_IMAGE, help="image of the raw `docker run` baseline"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the raw `docker run --rm` baseline"
    )


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample list."""
    return report.percentile(samples, q)


def summarize(samples: list[float]) -> dict[str, float | int]:
    """p50/p99/mean/min/max in milliseconds, and the sample count."""
    if not samples:
        return {"n": 0}
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(sum(ms) / len(ms), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
    }


async def one_cycle(
    backend: SandboxBackend, shell_runs: int, lifetimes: OwnLifetimes
) -> dict[str, list[float]]:
    """One sandbox's life; raises if any step fails (a bench of failures measures nothing).
    Its deadline (`lifetimes`) ends it by itself if the bench is killed."""
    out: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    sb = await lifetimes.create(backend, SandboxSpec(), limit_s=0.0)
    t1 = time.perf_counter()
    try:
        r = await sb.exec("true")
        t2 = time.perf_counter()
        if r.exit_code != 0:
            raise RuntimeError(f"exec('true') returned {r.exit_code}: {r.stderr!r}")
        s = await sb.run("true")
        t3 = time.perf_counter()
        if s.exit_code != 0:
            raise RuntimeError(f"run('true') returned {s.exit_code}: {s.output!r}")
        rtts = []
        for _ in range(shell_runs):
            a = time.perf_counter()
            await sb.run("true")
            rtts.append(time.perf_counter() - a)
    finally:
        t4 = time.perf_counter()
        await sb.close()
        t5 = time.perf_counter()
    out["create"] = [t1 - t0]
    out["first_exec"] = [t2 - t1]
    out["shell_start"] = [t3 - t2]
    out["shell_rtt"] = rtts
    out["close"] = [t5 - t4]
    out["cycle"] = [(t1 - t0) + (t2 - t1) + (t5 - t4)]
    return out


async def bench_backend(name: str, n: int, shell_runs: int) -> dict[str, Any]:
    try:
        backend = get_backend(name, owner_id=f"bench-{os.getpid()}")
    except Exception as exc:  # not importable yet / not registered
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    samples: dict[str, list[float]] = {}
    try:
        async with OwnLifetimes() as lifetimes:
            try:
                await one_cycle(backend, 1, lifetimes)  # warm-up: client, page cache, image
            except Exception as exc:
                return {"skipped": f"{type(exc).__name__}: {exc}"}
            for i in range(n):
                for k, v in (await one_cycle(backend, shell_runs, lifetimes)).items():
                    samples.setdefault(k, []).extend(v)
                log.info("%s: cycle %d/%d", name, i + 1, n)
        leftovers = await backend.reap(only_expired=False)
    finally:
        await backend.aclose()
    result: dict[str, Any] = {k: summarize(v) for k, v in samples.items()}
    result["leaked"] = len(leftovers)
    return result


async def bench_docker_run(image: str, n: int) -> dict[str, Any]:
    """The raw CLI baseline: `docker run --rm IMAGE true`, end to end."""

    async def once() -> float:
        t = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            image,
            "true",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"docker run failed ({proc.returncode}): {err.decode().strip()}")
        return time.perf_counter() - t

    try:
        await once()
    except (OSError, RuntimeError) as exc:
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    return {"docker_run_true": summarize([await once() for _ in range(n)])}


def environment() -> dict[str, Any]:
    def cmd(*argv: str) -> str | None:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "docker_server": cmd("docker", "version", "--format", "{{.Server.Version}}"),
        "git_commit": cmd("git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"),
        "unix_time": int(time.time()),
        # Figures from a loaded machine are not comparable; the load says how loaded it was.
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in names:
        if b not in KNOWN_BACKENDS:
            raise SystemExit(f"unknown backend {b!r}; expected some of {', '.join(KNOWN_BACKENDS)}")
    doc: dict[str, Any] = {
        "bench": "sandbox",
        "n": args.n,
        "shell_runs_per_sandbox": args.shell_runs,
        "environment": environment(),
        "backends": {},
    }
    for name in names:
        log.info("benchmarking %s (%d cycles)", name, args.n)
        doc["backends"][name] = await bench_backend(name, args.n, args.shell_runs)
    if "docker" in names and not args.no_baseline:
        log.info("baseline: docker run --rm %s true (%d runs)", args.image, args.n)
        doc["baseline"] = await bench_docker_run(args.image, args.n)
    doc["environment"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return doc


def run(args: argparse.Namespace) -> int:
    doc = asyncio.run(main(args))
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        for name, res in doc["backends"].items():
            if "skipped" in res:
                print(f"{name:8s} skipped: {res['skipped']}")
                continue
            parts = [
                f"{k} p50 {v['p50_ms']:.1f} / p99 {v['p99_ms']:.1f} ms"
                for k, v in res.items()
                if isinstance(v, dict) and v.get("n")
            ]
            print(f"{name:8s} " + "; ".join(parts) + f"; leaked {res['leaked']}")
        base = doc.get("baseline", {}).get("docker_run_true")
        if base:
            print(
                f"baseline docker run --rm true: p50 {base['p50_ms']:.1f} / p99 {base['p99_ms']:.1f} ms"
            )
    failed = [n for n, r in doc["backends"].items() if r.get("leaked")]
    if failed:
        print(f"leak: sandboxes left behind by {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0

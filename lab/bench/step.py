"""`sandgym bench step`: what the env server adds to one step, per backend.

For each backend (`--backends null,local,docker`) it times `--n` round trips of the command
`true`, after `--warmup` untimed ones, two ways:

- `direct`: `sandbox.run("true")` on a sandbox the bench creates from the backend itself;
- `websocket`: a `step` of `{"kind":"command","command":"true"}` through `AsyncEnvClient` to a
  `sandgym serve` child process on the same backend (client and server in separate processes,
  as in production), from send to reply.

Both use the same task environment (a tiny Harbor task written to a temp dir), so the
difference of the p50s is the server's own cost: protocol, validation, dispatch, metrics and
the websocket hop. On `null` the direct figure is ~0 and the websocket figure is the whole
server overhead. A backend that cannot run here is skipped with its reason. `--json` prints one
JSON document; `--out PATH` also writes it (committed: `lab/bench/results/step.json`) and, beside it
(`PATH` with `.raw.jsonl`), every timed round trip and the server's CPU readings per backend,
from which `summarize_backend` recomputes each reported figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.bench.report import percentile, save_json
from sandgym.client.env_client import AsyncEnvClient
from sandgym.sandboxes import get_backend
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.tasks import TaskRegistry
from sandgym.tasks.episode_start import prepare_episode
from sandgym.tasks.sandbox_spec import sandbox_spec_for

TASK_ID = "bench-echo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--n", type=int, default=500, help="timed round trips per path")
    parser.add_argument("--warmup", type=int, default=50, help="untimed round trips first")
    parser.add_argument(
        "--backends", default="null,local,docker", help="comma-separated backends to measure"
    )


def write_bench_task(root: Path) -> Path:
    """A minimal Harbor task (`bench-echo`) that prepares on every backend, null included."""
    t = root / TASK_ID
    (t / "environment").mkdir(parents=True, exist_ok=True)
    (t / "tests").mkdir(exist_ok=True)
    (t / "task.toml").write_text('version = "1.0"\n')
    (t / "instruction.md").write_text("Benchmark task: nothing to do.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    )
    return root


def summarize(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    us = [s * 1e6 for s in samples]
    return {
        "n": len(us),
        "p50_us": round(percentile(us, 50), 1),
        "p99_us": round(percentile(us, 99), 1),
        "mean_us": round(sum(us) / len(us), 1),
    }


async def _direct(backend_name: str, task_root: Path, n: int, warmup: int) -> list[float]:
    backend = get_backend(backend_name)
    task = TaskRegistry([task_root], include_builtin=False).get(TASK_ID)
    try:
        # a deadline of its own (sandgym.sandboxes.lifetime): it ends by itself if this process is killed
        async with OwnLifetimes() as lifetimes:
            sb = await lifetimes.create(backend, sandbox_spec_for(task), limit_s=0.0)
            try:
                await prepare_episode(task, sb, 0)
                for _ in range(warmup):
                    await sb.run("true")
                samples = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await sb.run("true")
                    samples.append(time.perf_counter() - t0)
                return samples
            finally:
                await sb.close()
    finally:
        await backend.aclose()


async def _websocket(
    url: str, n: int, warmup: int, cpu: Any
) -> tuple[list[float], tuple[float, float]]:
    action = {"kind": "command", "command": "true"}
    async with AsyncEnvClient(url) as env:
        await env.reset(TASK_ID)
        for _ in range(warmup):
            await env.step(action)
        samples = []
        cpu0 = cpu()
        for _ in range(n):
            t0 = time.perf_counter()
            await env.step(action)
            samples.append(time.perf_counter() - t0)
        return samples, (cpu0, cpu())


def _bench_backend(name: str, task_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The raw record of one backend: every timed round trip (us) and the CPU readings."""
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import ServerProcess

    # max_steps must exceed the bench's own steps, or the episode truncates mid-run.
    env = {"SANDGYM_MAX_STEPS": str(args.n + args.warmup + 10), "SANDGYM_INCLUDE_BUILTIN": "false"}
    direct = asyncio.run(_direct(name, task_root, args.n, args.warmup))
    with ServerProcess(name, args=["--tasks", str(task_root)], env=env) as srv:
        ws, cpu = asyncio.run(_websocket(srv.url, args.n, args.warmup, srv.cpu_seconds))
    return {
        "backend": name,
        "direct_us": [round(x * 1e6, 1) for x in direct],
        "websocket_us": [round(x * 1e6, 1) for x in ws],
        "server_cpu_s": {"before": cpu[0], "after": cpu[1]},
    }


def summarize_backend(raw: dict[str, Any]) -> dict[str, Any]:
    """The reported figures of one backend, from its raw record alone."""
    d = summarize([x / 1e6 for x in raw["direct_us"]])
    w = summarize([x / 1e6 for x in raw["websocket_us"]])
    cpu = raw["server_cpu_s"]
    cpu_per_step = (cpu["after"] - cpu["before"]) / max(1, len(raw["websocket_us"]))
    return {
        "backend": raw["backend"],
        "direct": d,
        "websocket": w,
        "overhead_p50_us": round(w["p50_us"] - d["p50_us"], 1),
        "overhead_p99_us": round(w["p99_us"] - d["p99_us"], 1),
        # CPU the server process spent per step (sandbox work on its side included; on null
        # that is ~nothing): the server's own cost, whatever the machine's load does to latency.
        "server_cpu_us_per_step": round(cpu_per_step * 1e6, 1),
    }


def run(args: argparse.Namespace) -> int:
    # Other work on the machine skews latencies: the load is recorded beside the figures.
    load_start = [round(x, 2) for x in os.getloadavg()]
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    results: list[dict[str, Any]] = []
    raws: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-step-") as tmp:
        task_root = write_bench_task(Path(tmp))
        for name in names:
            try:
                raws.append(_bench_backend(name, task_root, args))
                results.append(summarize_backend(raws[-1]))
            except Exception as exc:  # a backend that cannot run here is reported, not fatal
                skipped[name] = f"{type(exc).__name__}: {exc}"
                print(f"bench step: {name} skipped: {skipped[name]}", file=sys.stderr)
    doc = {
        "bench": "step",
        "command": "true",
        "n": args.n,
        "warmup": args.warmup,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": load_start,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "results": results,
        "skipped": skipped,
        "raw": None,
    }
    if args.out is not None:
        raw_path = Path(args.out).with_suffix(".raw.jsonl")
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        raw_path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in raws))
        doc["raw"] = raw_path.name
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        print(
            f"{'backend':8} {'direct p50/p99 us':>20} {'websocket p50/p99 us':>22} "
            f"{'added p50':>10} {'srv cpu us':>10}"
        )
        for r in results:
            d, w = r["direct"], r["websocket"]
            print(
                f"{r['backend']:8} {d['p50_us']:>9.0f} / {d['p99_us']:<8.0f} "
                f"{w['p50_us']:>10.0f} / {w['p99_us']:<9.0f} {r['overhead_p50_us']:>9.0f} "
                f"{r['server_cpu_us_per_step']:>10.0f}"
            )
        for name, why in skipped.items():
            print(f"{name:8} skipped: {why}")
    return 0 if results else 1

"""`sandgym bench sessions`: many concurrent sessions against one env server (null backend).

For each level of `--levels 256,1024,2048` concurrent sessions, every session opens its own
websocket, resets the `bench-echo` task and runs `--steps` steps of `echo hi`; all sessions then
hold their episode open at a barrier, where the server's RSS is read, and close. Reported per
level: success rate (sessions whose reset and steps all succeeded), error codes seen, p50/p99
step latency (send to reply, as the client sees it), aggregate steps/s over the step phase, and
server memory per session ((RSS at the barrier - RSS before the level) / live sessions).

The null backend makes the sandbox free, so this measures the server itself: protocol,
sessions, pool bookkeeping. The server runs as a child process (`sandgym serve`); the clients
all run in this process, so on a small machine the client side shares the CPUs with the server
and the figures are a lower bound of what the server alone sustains. `--json` prints one JSON
document; `--out PATH` also writes it (committed: `bench/results/sessions.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.step import TASK_ID, percentile, write_bench_task


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--levels", default="256,1024,2048", help="comma-separated concurrent session counts"
    )
    parser.add_argument("--steps", type=int, default=10, help="steps per session")
    parser.add_argument("--backend", default="null", help="backend of the server (default null)")


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


async def _level(url: str, n: int, steps: int, rss: Any, cpu: Any) -> dict[str, Any]:
    from envserver.client import AsyncEnvClient, EnvError

    latencies: list[float] = []
    errors: Counter[str] = Counter()
    done = 0
    all_stepped = asyncio.Event()
    release = asyncio.Event()
    step_window: list[float] = []  # first step start, last step end
    ok_sessions = 0

    async def session() -> None:
        nonlocal done, ok_sessions
        client = AsyncEnvClient(url, connect_timeout_s=120, request_timeout_s=120)
        ok = False
        try:
            await client.connect()
            await client.reset(TASK_ID)
            for _ in range(steps):
                t0 = time.perf_counter()
                res = await client.step("echo hi")
                t1 = time.perf_counter()
                if res.observation["output"] != "hi\n":
                    raise EnvError("internal", f"unexpected output {res.observation!r}")
                latencies.append(t1 - t0)
                step_window.append(t0)
                step_window.append(t1)
            ok = True
        except EnvError as exc:
            errors[exc.code] += 1
        except Exception as exc:  # connection refused, timeouts: counted, never hidden
            errors[type(exc).__name__] += 1
        finally:
            done += 1
            if ok:
                ok_sessions += 1
            if done == n:
                all_stepped.set()
            await release.wait()  # hold the episode open while memory is read
            try:
                await client.close()
            except Exception:
                pass

    rss_before, cpu_before = rss(), cpu()
    tasks = [asyncio.create_task(session()) for _ in range(n)]
    await all_stepped.wait()
    rss_peak, cpu_used = rss(), cpu() - cpu_before
    release.set()
    await asyncio.gather(*tasks)
    total_steps = len(latencies)
    span = (max(step_window) - min(step_window)) if step_window else 0.0
    return {
        "sessions": n,
        "steps_per_session": steps,
        "ok_sessions": ok_sessions,
        "success_rate": round(ok_sessions / n, 4),
        "errors": dict(errors),
        "steps": total_steps,
        "step_p50_ms": round(percentile(latencies, 50) * 1000, 3) if latencies else None,
        "step_p99_ms": round(percentile(latencies, 99) * 1000, 3) if latencies else None,
        "steps_per_s": round(total_steps / span, 1) if span else None,
        # Server CPU over connect + reset + steps, per step: the server's own cost, whatever
        # the clients sharing the machine do to wall-clock figures.
        "server_cpu_us_per_step": round(cpu_used / max(1, total_steps) * 1e6, 1),
        "server_rss_before_mb": round(rss_before / 2**20, 1),
        "server_rss_peak_mb": round(rss_peak / 2**20, 1),
        "server_kb_per_session": round((rss_peak - rss_before) / 1024 / max(1, ok_sessions), 1),
    }


def run(args: argparse.Namespace) -> int:
    # Other work on the machine skews latencies: the load is recorded beside the figures.
    load_start = [round(x, 2) for x in os.getloadavg()]
    from envserver.runner import ServerProcess

    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    top = max(levels)
    _raise_fd_limit(top * 2 + 256)
    env = {
        "SANDGYM_MAX_SESSIONS": str(top),
        "SANDGYM_MAX_STEPS": str(args.steps + 5),
        "SANDGYM_INCLUDE_BUILTIN": "false",
        "SANDGYM_POOL_MAX_TOTAL": str(top * 2),
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-sessions-") as tmp:
        root = write_bench_task(Path(tmp))
        with ServerProcess(args.backend, args=["--tasks", str(root)], env=env) as srv:
            for n in levels:
                res = asyncio.run(_level(srv.url, n, args.steps, srv.rss_bytes, srv.cpu_seconds))
                results.append(res)
                print(f"bench sessions: {n} sessions done", file=sys.stderr)
                time.sleep(1.0)  # let the pool destroy the level's sandboxes
    doc = {
        "bench": "sessions",
        "backend": args.backend,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": load_start,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "note": "clients and server share this machine's CPUs; figures are lower bounds",
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print(
            f"{'sessions':>8} {'ok':>7} {'p50 ms':>8} {'p99 ms':>8} {'steps/s':>9} {'KiB/ses':>8}"
        )
        for r in results:
            print(
                f"{r['sessions']:>8} {r['success_rate']:>7.2%} {r['step_p50_ms']:>8} "
                f"{r['step_p99_ms']:>8} {r['steps_per_s']:>9} {r['server_kb_per_session']:>8} "
                f"{r['server_cpu_us_per_step']:>15}"
            )
    return 0 if all(r["success_rate"] == 1.0 for r in results) else 1

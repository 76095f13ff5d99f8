"""`sandgym bench group`: how long a GRPO group takes to get ready, forked against prepared
one by one, per backend, through a real env server.

For each backend (`--backends local,docker`) and each task it runs, alternating, `--repeats`
times:

- `fork`: `--size` clients reset one group (`reset.options.group`) at once: the first reset
  prepares the sandbox and snapshots it, the others start from copies;
- `independent`: `--size` clients reset the same task and seed at once, each prepared on its own;
- `cold_create`: `--size` bare sandboxes created at once on the backend (no task set-up), the
  floor either of the above pays for its sandboxes;
- `fork_snapshot` (docker, whose groups fork by changes, `group_fork`): the group again, its
  members started from a `docker commit` of member 0 instead (the backend's other way);

each timed from the first reset sent to the last reply (all members ready), each on a fresh
server with no ready pool (`pool_size` 0, so every way starts cold). Tasks: `slow-setup` (a Harbor task whose
generator spends about `--setup-cpu-s` seconds of CPU, as a data build or compile would) and a
catalog task (`--catalog-task`). Then `first_command`: on a server keeping ready sandboxes
(`pool_size` 2), `--n-first` episodes, each timed from the reset's reply to the result of the
first `command` (`true`): with the pool's shell already started that is one round trip. Twice:
`first_command_after_pool_hit`, each reset on a settled pool (the episode before ended, no
creation or destruction in flight), and `first_command_back_to_back`, each reset as soon as a
sandbox is ready (the episode before being destroyed and the pool refilling beside it).

Every figure is a median of its repeats, each repeat's raw seconds beside it; ratios are
`independent / fork`. `--json` prints one JSON document; `--out PATH` also writes it (committed:
`lab/bench/results/group.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from lab.bench.report import save_json
from sandgym.client.env_client import AsyncEnvClient
from sandgym.sandboxes import get_backend
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.server.settings import ServerSettings
from sandgym.tasks import TaskRegistry
from sandgym.tasks.sandbox_spec import sandbox_spec_for

SLOW_TASK = "slow-setup"

GENERATOR = """\
import argparse, hashlib, pathlib, time
p = argparse.ArgumentParser(); p.add_argument("--seed", type=int); a = p.parse_args()
h = hashlib.sha256(str(a.seed).encode())
start = time.process_time()
while time.process_time() - start < {cpu_s}:  # the set-up's own work: CPU, as a build is
    for _ in range(2000):
        h.update(h.digest())
pathlib.Path("/app/data.txt").write_text(h.hexdigest())
print(h.hexdigest())
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--backends", default="local,docker", help="comma-separated backends")
    parser.add_argument("--size", type=int, default=8, help="members per group")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats per way")
    parser.add_argument("--setup-cpu-s", type=float, default=5.0, help="slow task's set-up CPU")
    parser.add_argument("--catalog-task", default="builtin/hello-file", help="a catalog task")
    parser.add_argument("--n-first", type=int, default=30, help="first-command samples")
    parser.add_argument(
        "--parts",
        default="ready,first",
        help="comma-separated parts to run: ready (group vs independent vs cold), first",
    )


def write_slow_task(root: Path, cpu_s: float) -> Path:
    t = root / SLOW_TASK
    (t / "environment").mkdir(parents=True, exist_ok=True)
    (t / "tests").mkdir(exist_ok=True)
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "environment" / "generate.py").write_text(GENERATOR.format(cpu_s=cpu_s))
    (t / "instruction.md").write_text("Benchmark task: nothing to do.\n")
    (t / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ngenerator = "environment/generate.py"\n'
        "generator_timeout_sec = 900\n"
        '[environment]\nnetwork_mode = "no-network"\n'
    )
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"
    )
    return root


async def _resets(url: str, task_id: str, size: int, group: bool) -> tuple[float, list[bool]]:
    """`size` clients reset at once; (seconds until the last reply, forked flags)."""

    clients = [AsyncEnvClient(url, request_timeout_s=900) for _ in range(size)]
    for c in clients:
        await c.connect()
    gid = "bench-" + uuid.uuid4().hex[:10]
    opts = {"group": {"id": gid, "size": size}} if group else None
    try:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(c.reset(task_id, seed=1, options=opts) for c in clients))
        took = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.close()
    return took, [bool(info.get("group", {}).get("forked")) for _, info in replies]


async def _cold_creates(backend: Any, spec: Any, size: int) -> float:
    # deadlines of their own (sandgym.sandboxes.lifetime): they end by themselves if this is killed
    async with OwnLifetimes() as lifetimes:
        t0 = time.perf_counter()
        boxes = await asyncio.gather(*(lifetimes.create(backend, spec, 0.0) for _ in range(size)))
        took = time.perf_counter() - t0
        await asyncio.gather(*(b.close() for b in boxes))
    return took


async def _pool_totals(http_url: str) -> dict[str, int]:
    import httpx

    async with httpx.AsyncClient() as h:
        r = await h.get(f"{http_url}/v1/pool", timeout=10)
        return {k: int(v) for k, v in r.json()["totals"].items()}


def _has_ready(t: dict[str, int]) -> bool:
    return t["ready"] > 0


def _settled(t: dict[str, int]) -> bool:
    """A ready sandbox and nothing else under way: no creation, no destruction in flight."""
    return t["ready"] > 0 and t["creating"] == 0 and t["destroying"] == 0


async def _first_commands(
    url: str, http_url: str, task_id: str, n: int, settled: bool
) -> tuple[list[float], list[float]]:
    """Seconds of the first `command` after each pool-hit reset, and of the second one (the same
    shell's plain round trip: the first costs more only if the shell was not ready).

    `settled`: each episode is ended, and the next reset waits until the pool is settled (a
    ready sandbox, no creation or destruction in flight), so the figure is a pool hit's alone
    (the refill the hit itself starts still runs beside it). Otherwise back to back: the next
    reset goes as soon as a sandbox is ready, the previous episode's sandbox being destroyed and
    the pool refilling on the same cores, as in a busy training run."""

    first: list[float] = []
    second: list[float] = []
    wait_for = _settled if settled else _has_ready
    for _ in range(n):
        for _ in range(600):  # until the pool is as asked (bounded: 60 s)
            if wait_for(await _pool_totals(http_url)):
                break
            await asyncio.sleep(0.1)
        # one client per episode: its close ends the episode (the sandbox is destroyed)
        async with AsyncEnvClient(url, request_timeout_s=300) as c:
            _, info = await c.reset(task_id, seed=1)
            took = []
            for _ in range(2):
                t0 = time.perf_counter()
                res = await c.step({"kind": "command", "command": "true"})
                took.append(time.perf_counter() - t0)
                assert res.observation["exit_code"] == 0
        if info.get("from_pool"):  # only pool hits count: the figure is about a ready sandbox
            first.append(took[0])
            second.append(took[1])
    return first, second


def _first_figures(task_id: str, samples: list[float], seconds: list[float]) -> dict[str, Any]:
    return {
        "task": task_id,
        "samples": len(samples),
        "p50_ms": _ms_at(samples, 0.5),
        "p90_ms": _ms_at(samples, 0.9),
        "raw_ms": [round(1000 * s, 3) for s in samples],
        # the same episodes' second command: one round trip on a shell known to be ready
        "second_command_p50_ms": _ms_at(seconds, 0.5),
        "second_command_raw_ms": [round(1000 * s, 3) for s in seconds],
    }


def _ms_at(xs: list[float], q: float) -> float | None:
    """The sample at quantile `q` (nearest rank below, as before), in ms."""
    ys = sorted(xs)
    return round(1000 * ys[int(len(ys) * q)], 3) if ys else None


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


async def _bench_backend(name: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import BackgroundServer

    registry = TaskRegistry([root], include_builtin=True)
    out: dict[str, Any] = {"tasks": {}}
    # a fresh server per measured run: no ready sandbox left over from the run before
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend=name, task_dirs=[root], pool_size=0, max_sessions=64
    )
    backend = get_backend(name)

    async def one(
        task_id: str, group: bool, size: int, options: dict[str, Any] | None = None
    ) -> tuple[float, list[bool]]:
        with BackgroundServer(
            settings.model_copy(update={"backend_options": options or {}})
        ) as srv:
            return await _resets(srv.url, task_id, size, group)

    # docker forks by changes (its default); its other way, from a `docker commit`, side by side
    by_changes = bool(getattr(backend, "forks_by_changes", False))
    out["group_fork"] = "changes" if by_changes else "snapshot"

    parts = {p for p in args.parts.split(",") if p}
    try:
        for task_id in (SLOW_TASK, args.catalog_task) if "ready" in parts else ():
            spec = sandbox_spec_for(registry.get(task_id))
            raw: dict[str, list[float]] = {"fork": [], "independent": [], "cold_create": []}
            if by_changes:
                raw["fork_snapshot"] = []
            forked: list[list[bool]] = []
            await one(task_id, False, 1)  # images built, caches warm
            for _ in range(args.repeats):
                took, flags = await one(task_id, True, args.size)
                raw["fork"].append(took)
                forked.append(flags)
                took, _ = await one(task_id, False, args.size)
                raw["independent"].append(took)
                raw["cold_create"].append(await _cold_creates(backend, spec, args.size))
                if by_changes:
                    took, _ = await one(task_id, True, args.size, {"group_fork": "snapshot"})
                    raw["fork_snapshot"].append(took)
            med = {k: _median(v) for k, v in raw.items()}
            out["tasks"][task_id] = {
                "ready_s_median": med,
                "independent_over_fork": (
                    round(med["independent"] / med["fork"], 2)
                    if med["fork"] and med["independent"]
                    else None
                ),
                **(
                    {"snapshot_fork_over_fork": round(med["fork_snapshot"] / med["fork"], 2)}
                    if by_changes and med["fork"] and med["fork_snapshot"]
                    else {}
                ),
                "raw_s": {k: [round(x, 4) for x in v] for k, v in raw.items()},
                "members_forked": [sum(f) for f in forked],
            }
        if "first" not in parts:
            return out
        settings = ServerSettings(
            host="127.0.0.1", port=0, backend=name, task_dirs=[root], pool_size=2
        )
        with BackgroundServer(settings) as srv:
            await _resets(srv.url, args.catalog_task, 1, group=False)
            for key, settled in (
                ("first_command_after_pool_hit", True),
                ("first_command_back_to_back", False),
            ):
                samples, seconds = await _first_commands(
                    srv.url, srv.http_url, args.catalog_task, args.n_first, settled
                )
                out[key] = _first_figures(args.catalog_task, samples, seconds)
    finally:
        await backend.aclose()
    return out


def run(args: argparse.Namespace) -> int:
    backends = [b for b in args.backends.split(",") if b]
    doc: dict[str, Any] = {
        "bench": "group",
        "size": args.size,
        "repeats": args.repeats,
        "setup_cpu_s": args.setup_cpu_s,
        "parts": args.parts,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_start": list(os.getloadavg()),
        },
        "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-group-") as tmp:
        root = write_slow_task(Path(tmp), args.setup_cpu_s)
        for name in backends:
            try:
                doc["backends"][name] = asyncio.run(_bench_backend(name, root, args))
            except Exception as exc:  # a backend that cannot run here is reported, not fatal
                doc["backends"][name] = {"skipped": f"{type(exc).__name__}: {exc}"}
            print(f"bench group: {name} done", file=sys.stderr)
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    return 0

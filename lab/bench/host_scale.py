"""`sandgym bench host_scale`: how many sandboxes one host holds, and how fast it makes them.

For each backend asked (`--backends local,docker`) it starts a real `sandgym serve` process and
drives the sandbox API (`POST /v1/sandboxes`) with one async client at `--concurrency`:

- a burst of `--count` idle sandboxes (each create timed; the rate of the first `--window`
  creations, made with few held, beside the rate of the last `--window`, made with the most
  held: the figure that shows whether creation slows with the number held);
- memory per idle sandbox: the server's RSS growth plus what the sandboxes hold (local: the
  PSS of the server's child processes and the sandboxes' in-memory trees; docker: each
  container's cgroup memory plus its containerd shim), beside the bare figure measured the same
  way (`--bare` plain `sleep` processes; plain `sleep` containers of the same image);
- `--claims` warm claims (a pool hit: `SANDGYM_POOL_SIZE` keeps ready sandboxes) with the burst
  still held, each timed client-side;
- the CPU each sandbox costs over its life (the server's and its reaped processes', per sandbox
  the pool made), and the create-and-close rate that allows on this host's cores;
- closing every sandbox at the same concurrency, timed, then what is left behind (local: the
  trees under the backend's root; docker: containers labelled with the server's owner id).

On docker it also times the engine's own `docker run -d IMAGE sleep infinity` at the same
concurrency in the same run (`--engine-runs`), the physical bound of docker creation here.
`--count 100,1000` runs each count with a fresh server in the same run; the backend's figures
are the largest count's, `scale` sets the counts' creation rates side by side (and, on docker,
each beside the engine's rate measured just before it), `smaller_counts` keeps the other runs.
Every per-sandbox timing goes to `--raw-out` (JSON lines, phases tagged `backend@count`); the
summary to `--out`.
The host is shared and noisy: the load average is recorded before and after each phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from lab.bench.report import percentile, save_json

DEFAULT_OUT = Path("lab/bench/results/host_scale.json")
DEFAULT_RAW = Path("lab/bench/results/host_scale.raw.jsonl")
MIB = 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default="local", help="comma list: local, docker")
    parser.add_argument(
        "--count",
        default="1000",
        help="sandboxes held at the burst's end; a comma list (100,1000) runs each, a fresh "
        "server per count, in one run: the record's `scale` compares their creation rates",
    )
    parser.add_argument(
        "--docker-count", default=None, help="docker's counts when they differ (e.g. 100,300)"
    )
    parser.add_argument("--window", type=int, default=100, help="creations per rate window")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    parser.add_argument("--claims", type=int, default=50, help="warm claims with the burst held")
    parser.add_argument("--pool-size", type=int, default=2, help="ready sandboxes kept (claims)")
    parser.add_argument("--bare", type=int, default=100, help="bare processes/containers")
    parser.add_argument("--engine-runs", type=int, default=40, help="docker run -d timed")
    parser.add_argument("--image", default="sandgym/terminal:latest", help="docker image")
    parser.add_argument("--local-image", default="debian:bookworm-slim", help="name on local")
    parser.add_argument("--out", type=Path, default=None, help=f"summary (e.g. {DEFAULT_OUT})")
    parser.add_argument("--raw-out", type=Path, default=None, help=f"raw (e.g. {DEFAULT_RAW})")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


# -- host figures --------------------------------------------------------------------------------
def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def proc_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process `pid` itself, and of its reaped children (their
    own reaped children included: every sandbox process is waited for by its parent)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_bytes(root: Path) -> int:
    """Bytes of the files under `root` (in-memory trees under /dev/shm count as memory)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def summary(samples: list[float]) -> dict[str, float | int]:
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "p50_s": round(percentile(samples, 50), 4),
        "p99_s": round(percentile(samples, 99), 4),
        "max_s": round(max(samples), 4),
    }


def window_rate(ends: list[float], start: float, n: int) -> dict[str, Any]:
    """Creations per second of the first and last `n` creations (by completion order)."""
    ends = sorted(ends)
    if len(ends) < 2 * n:
        n = max(1, len(ends) // 2)
    first = n / max(ends[n - 1] - start, 1e-9)
    last = n / max(ends[-1] - ends[-n - 1], 1e-9)
    return {
        "window": n,
        "first_rate_per_s": round(first, 2),
        "last_rate_per_s": round(last, 2),
        "last_over_first": round(last / first, 3),
    }


# -- driving the API -----------------------------------------------------------------------------
async def burst(
    client: Any, image: str, count: int, concurrency: int, raw: list[dict[str, Any]], tag: str
) -> tuple[list[str], list[float], float, list[str]]:
    from sandgym.wire.sandbox_protocol import CreateSandboxRequest, SandboxEnvironment

    sem = asyncio.Semaphore(concurrency)
    ids: list[str] = []
    ends: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            try:
                info = await client.create(
                    CreateSandboxRequest(
                        environment=SandboxEnvironment(docker_image=image),
                        idle_timeout_s=3600,
                    )
                )
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                raw.append({"phase": tag, "op": "create", "i": i, "error": str(exc)})
                return
            t1 = time.perf_counter()
            ids.append(info.sandbox_id)
            ends.append(t1)
            raw.append({"phase": tag, "op": "create", "i": i, "held_before": len(ids) - 1,
                        "s": round(t1 - t0, 5), "end_s": round(t1 - start, 5),
                        "server_acquire_s": info.acquire_s, "from_pool": info.from_pool})  # fmt: skip

    await asyncio.gather(*(one(i) for i in range(count)))
    return ids, ends, start, errors


async def close_all(
    client: Any, ids: list[str], concurrency: int, raw: list[dict[str, Any]], tag: str
) -> tuple[float, list[float], list[str]]:
    sem = asyncio.Semaphore(concurrency)
    times: list[float] = []
    errors: list[str] = []
    start = time.perf_counter()

    async def one(sid: str) -> None:
        async with sem:
            t0 = time.perf_counter()
            try:
                await client.close(sid)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            times.append(time.perf_counter() - t0)
            raw.append({"phase": tag, "op": "close", "s": round(times[-1], 5)})

    await asyncio.gather(*(one(s) for s in ids))
    return time.perf_counter() - start, times, errors


async def pool_ready(client: Any) -> int:
    keys = (await client.pool_status()).get("keys", {})
    return sum(int(k.get("ready", 0)) for k in keys.values())


async def claims(
    client: Any, image: str, n: int, raw: list[dict[str, Any]], tag: str
) -> tuple[list[float], int, list[str]]:
    """`n` warm claims one after another, each once the pool has a ready sandbox again."""
    from sandgym.wire.sandbox_protocol import CreateSandboxRequest, SandboxEnvironment

    req = CreateSandboxRequest(environment=SandboxEnvironment(docker_image=image))
    hits: list[float] = []
    misses = 0
    errors: list[str] = []
    for i in range(n):
        deadline = time.monotonic() + 60
        # polling the remote server (no event reaches this client)
        while await pool_ready(client) < 1 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        try:
            info = await client.create(req)
        except Exception as exc:
            errors.append(str(exc))
            continue
        dt = time.perf_counter() - t0
        raw.append({"phase": tag, "op": "claim", "i": i, "s": round(dt, 5),
                    "from_pool": info.from_pool, "server_acquire_s": info.acquire_s})  # fmt: skip
        if info.from_pool:
            hits.append(dt)
        else:
            misses += 1
        await client.close(info.sandbox_id)
    return hits, misses, errors


# -- memory --------------------------------------------------------------------------------------
def docker_ids(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={label}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [x for x in out.split() if x]


def container_bytes(cids: list[str]) -> tuple[int, int]:
    """(cgroup memory of the containers, PSS of their containerd shims)."""
    cg = 0
    for cid in cids:
        for p in (
            f"/sys/fs/cgroup/memory/docker/{cid}/memory.usage_in_bytes",
            f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.current",
        ):
            try:
                cg += int(Path(p).read_text())
                break
            except OSError:
                continue
    import psutil

    shims = 0
    wanted = set(cids)
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if proc.info.get("name", "").startswith("containerd-shim") and any(
            c in wanted for c in cmd
        ):
            shims += pss_bytes(proc.pid)
    return cg, shims


def bare_local(n: int) -> dict[str, Any]:
    """PSS of `n` plain `sleep` processes, per process."""
    procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(n)]
    try:
        time.sleep(0.5)
        total = sum(pss_bytes(p.pid) for p in procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    return {"what": "plain sleep processes", "n": n, "per_mib": round(total / n / MIB, 3)}


def bare_docker(image: str, n: int, concurrency: int) -> dict[str, Any]:
    """`docker run -d IMAGE sleep infinity` timed at `concurrency`, then the memory per
    container measured as for sandboxes, then removed."""
    from concurrent.futures import ThreadPoolExecutor

    label = f"sandgym.bench.host_scale={os.getpid()}"

    def run_one(_: int) -> float:
        t0 = time.perf_counter()
        subprocess.run(
            ["docker", "run", "-d", "--label", label, image, "sleep", "infinity"],
            check=True, capture_output=True,
        )  # fmt: skip
        return time.perf_counter() - t0

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        times = list(ex.map(run_one, range(n)))
    wall = time.perf_counter() - start
    cids = docker_ids(label)
    time.sleep(1)
    cg, shims = container_bytes(cids)
    t0 = time.perf_counter()
    subprocess.run(["docker", "rm", "-f", *cids], check=True, capture_output=True)
    rm_s = time.perf_counter() - t0
    return {
        "what": "docker run -d IMAGE sleep infinity",
        "n": n,
        "concurrency": concurrency,
        "rate_per_s": round(n / wall, 2),
        "run": summary(times),
        "rm_rate_per_s": round(n / rm_s, 2),
        "cgroup_per_mib": round(cg / n / MIB, 3),
        "shim_per_mib": round(shims / n / MIB, 3),
        "per_mib": round((cg + shims) / n / MIB, 3),
    }


# -- one backend ---------------------------------------------------------------------------------
async def bench_backend(
    backend: str, count: int, args: argparse.Namespace, raw: list[dict[str, Any]]
) -> dict:
    from sandgym.client.sandbox_client import SandboxClient
    from sandgym.server.runner import ServerProcess

    image = args.image if backend == "docker" else args.local_image
    top = count + args.claims + 16
    tag = f"{backend}@{count}"
    env = {
        "SANDGYM_MAX_SESSIONS": str(top),
        "SANDGYM_POOL_MAX_TOTAL": str(top + args.pool_size),
        "SANDGYM_POOL_SIZE": str(args.pool_size),
        "SANDGYM_INCLUDE_BUILTIN": "false",
    }
    out: dict[str, Any] = {"backend": backend, "count": count, "image": image, "env": env}
    out["bare"] = (
        bare_docker(args.image, args.engine_runs, min(args.concurrency, 8))
        if backend == "docker"
        else bare_local(args.bare)
    )
    srv = ServerProcess(backend, env=env, startup_timeout_s=120)
    try:
        async with SandboxClient(srv.http_url, timeout_s=600) as client:
            pool = await client.pool_status()
            owner = pool.get("owner_id")
            rss0 = srv.rss_bytes()
            out["load_before"] = loadavg()
            cpu0 = proc_cpu(srv.pid)
            made0 = int(pool.get("created", 0))
            ids, ends, start, errs = await burst(
                client, image, count, args.concurrency, raw, f"{tag}/burst"
            )
            wall = max(ends) - start if ends else 0.0
            creates = [r["s"] for r in raw if r.get("phase") == f"{tag}/burst" and "s" in r]
            out["create"] = {
                "count": count,
                "concurrency": args.concurrency,
                "made": len(ids),
                "errors": len(errs),
                "error_examples": errs[:3],
                "wall_s": round(wall, 3),
                "rate_per_s": round(len(ids) / wall, 2) if wall else None,
                "latency": summary(creates),
                **window_rate(ends, start, args.window),
            }
            out["load_after_create"] = loadavg()
            # memory with the burst held (idle sandboxes)
            await asyncio.sleep(1.0)
            rss1 = srv.rss_bytes()
            mem: dict[str, Any] = {
                "held": len(ids),
                "server_rss_growth_mib": round((rss1 - rss0) / MIB, 2),
            }
            if backend == "local":
                kids = descendants(srv.pid)
                kid_pss = sum(pss_bytes(p) for p in kids)
                from sandgym.sandboxes.local.root import local_root

                trees = tree_bytes(local_root())
                mem.update(processes=len(kids), children_pss_mib=round(kid_pss / MIB, 2),
                           trees_mib=round(trees / MIB, 2))  # fmt: skip
                total = kid_pss + trees + (rss1 - rss0)
            else:
                cids = docker_ids(f"sandgym.owner={owner}")
                cg, shims = container_bytes(cids)
                mem.update(containers=len(cids), cgroup_mib=round(cg / MIB, 2),
                           shim_pss_mib=round(shims / MIB, 2))  # fmt: skip
                total = cg + shims + (rss1 - rss0)
            mem["per_sandbox_mib"] = round(total / max(1, len(ids)) / MIB, 3)
            out["memory"] = mem
            hits, misses, cerrs = await claims(client, image, args.claims, raw, f"{tag}/claim")
            out["claim"] = {"held": len(ids), "hits": len(hits), "misses": misses,
                            "errors": len(cerrs), "hit": summary(hits)}  # fmt: skip
            close_wall, ctimes, close_errs = await close_all(
                client, ids, args.concurrency, raw, f"{tag}/close"
            )
            out["close"] = {
                "closed": len(ctimes),
                "errors": len(close_errs),
                "wall_s": round(close_wall, 3),
                "rate_per_s": round(len(ctimes) / close_wall, 2) if close_wall else None,
                "latency": summary(ctimes),
            }
            # wait for the pool to finish destroying what it was given back
            closed_at = time.perf_counter()
            deadline = time.monotonic() + max(20.0, 0.3 * count)
            while time.monotonic() < deadline:
                totals = (await client.pool_status()).get("totals", {})
                if int(totals.get("destroying", 0)) == 0 and int(totals.get("leased", 0)) == 0:
                    break
                await asyncio.sleep(0.2)
            out["close"]["drained_after_s"] = round(time.perf_counter() - closed_at, 3)
            out["load_after_close"] = loadavg()
            # CPU of one sandbox's whole life (create, idle, close), the server's share and its
            # processes' (reaped, so counted): the work each sandbox costs this host, whatever
            # else runs beside it. `cores / per_sandbox` is the create-and-close rate it allows.
            cpu1 = proc_cpu(srv.pid)
            made = int((await client.pool_status()).get("created", 0)) - made0
            per_ms = 1000 * (cpu1[0] - cpu0[0] + cpu1[1] - cpu0[1]) / max(1, made)
            out["cpu"] = {
                "sandboxes_made": made,
                "server_s": round(cpu1[0] - cpu0[0], 2),
                "processes_s": round(cpu1[1] - cpu0[1], 2),
                "per_sandbox_ms": round(per_ms, 2),
                "server_per_sandbox_ms": round(1000 * (cpu1[0] - cpu0[0]) / max(1, made), 2),
                "cycles_per_s_bound": round((os.cpu_count() or 1) * 1000 / per_ms, 1)
                if per_ms
                else None,
            }
            # the server still runs: what it holds now beside the pool's own (ready ones, and
            # the replacements its release credit asks for: they end with the server)
            on_backend = leftovers(backend, owner)
            totals = (await client.pool_status()).get("totals", {})
            out["after_close"] = {
                "on_backend": on_backend,
                "pool_ready": int(totals.get("ready", 0)),
                "pool_creating": int(totals.get("creating", 0)),
                "pool_leased": int(totals.get("leased", 0)),
            }
    finally:
        srv.stop()
    out["leftovers_after_stop"] = leftovers(backend, owner)
    return out


def scale_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The creation rate at each count, and the largest count's over the smallest's (issue 59's
    target: at least 0.9), with the docker engine's own `docker run -d` rate of each run."""
    rates = [r["create"]["rate_per_s"] for r in runs]
    doc: dict[str, Any] = {
        "counts": [r["count"] for r in runs],
        "rate_per_s": rates,
        "load_before": [r.get("load_before") for r in runs],
    }
    if len(runs) > 1 and rates[0] and rates[-1]:
        doc["rate_max_over_min"] = round(rates[-1] / rates[0], 3)
    engine = [r["bare"].get("rate_per_s") for r in runs]
    if all(e for e in engine):
        doc["engine_rate_per_s"] = engine
        doc["rate_over_engine"] = [round(a / e, 3) for a, e in zip(rates, engine, strict=True)]
    return doc


def leftovers(backend: str, owner: str | None) -> int:
    """Sandboxes on the backend labelled with the server's owner id."""
    if backend != "local":
        return len(docker_ids(f"sandgym.owner={owner}"))
    from sandgym.sandboxes.local.root import local_root

    found = 0
    for d in local_root().glob("sg-*"):
        try:
            labels = json.loads((d / "labels.json").read_text())
        except (OSError, ValueError):
            continue
        found += int(labels.get("sandgym.owner") == owner)
    return found


async def main(args: argparse.Namespace) -> dict[str, Any]:
    raw: list[dict[str, Any]] = []
    doc: dict[str, Any] = {
        "bench": "host_scale",
        "cores": os.cpu_count(),
        "load_at_start": loadavg(),
        "backends": {},
    }
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        spec = args.docker_count if backend == "docker" and args.docker_count else args.count
        counts = sorted({int(c) for c in str(spec).split(",") if c.strip()})
        runs = [await bench_backend(backend, n, args, raw) for n in counts]
        # the record's figures per backend are the largest count's; `scale` sets the counts'
        # creation rates side by side (same run, same host load era: see load_* per run)
        top = dict(runs[-1])
        top["scale"] = scale_summary(runs)
        top["smaller_counts"] = runs[:-1]
        doc["backends"][backend] = top
    doc["load_at_end"] = loadavg()
    if args.raw_out is not None:
        args.raw_out.parent.mkdir(parents=True, exist_ok=True)
        with args.raw_out.open("w", encoding="utf-8") as f:
            for line in raw:
                f.write(json.dumps(line) + "\n")
    return doc


def run(args: argparse.Namespace) -> int:
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)
    doc = asyncio.run(main(args))
    text = save_json(doc, args.out)
    print(text)
    return 0

"""`sandgym bench sessions`: many concurrent sessions against one env server, beside OpenEnv.

For each level of `--levels 256,1024,2048` concurrent sessions, every session opens its own
websocket, resets and runs `--steps` echo steps (with `--barrier`, all sessions reset before any
steps, so the step phase is measured alone); then they hold their episodes open at a barrier
(where the server's RSS is read) and close. Reported per level and per server: success rate
(sessions whose reset and steps all succeeded, replies checked), error kinds seen, p50/p99 step
latency (send to reply, as the client sees it), aggregate steps/s (first step sent to last reply),
server CPU per step (with `--barrier`: the step phase alone, and per connect + reset apart;
without: everything over the steps), CPU of the server's child processes per step, how many CPUs
the whole machine was busy once every session had reset, and server memory per session ((RSS at
the barrier - RSS before the level) / live sessions).

`local` (in `--servers`) also runs `--local-sessions 64` sessions of `--local-steps 50` real
commands (`echo hi` in each session's bash) on the local backend: all sessions reset, then step
together (the headline, target 1000 steps/s on 2 cores), and again overlapped (each session
steps right after its own reset, sandbox creation inside the window); it derives from the
measured CPU per step (server + shells + clients) the steps/s this machine's CPUs allow.

Servers, each started as a child process and driven by the same load generator:

- `sandgym`: `sandgym serve --backend null` (the sandbox is free, so this measures the server
  itself) with the `bench-echo` task; a step is `{"kind":"command","command":"echo hi"}` and the
  reply must carry `output == "hi\\n"`.
- `openenv`: OpenEnv's own websocket server (`create_app`, its `/ws` endpoint, uvicorn with
  its defaults) hosting a plain async echo environment written by this bench (`--openenv-env
  plain`, the default: OpenEnv's fastest path); a step is `{"type": "step", "data": {"message":
  "hi"}}` and the reply must echo `hi`. `--openenv-env mcp` runs OpenEnv's shipped
  `envs/echo_env` (MCP tools, `call_tool echo_message`) from `--openenv-app-dir` instead.
  OpenEnv is not a dependency of sandgym: point `--openenv-python` at a virtualenv where
  `openenv-core` is installed. If that is missing the reason is recorded and the figures
  measured earlier on this machine are kept as a labelled reference (`openenv_reference`).

The load generator (`--client lean`, the default: `bench/wsclient.py`, a minimal RFC 6455 client;
or `--client websockets`, that library's asyncio client) runs in `--client-procs` separate
processes, started together, so the clients do not run on the server's event loop and both
servers face exactly the same client code. Each run starts once every server is idle (the last
level's closes done). On a small machine the clients still share the CPUs with the server, so
wall-clock figures are lower bounds of what a server alone sustains.
`--json` prints one JSON document; `--out PATH` also writes it (committed:
`bench/results/sessions.json`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench.report import save_json
from bench.step import TASK_ID, percentile, write_bench_task

#: OpenEnv measured on this machine before this bench drove it itself (2048 sessions, same
#: workload). Kept only as a labelled reference for runs where OpenEnv cannot be started.
OPENENV_REFERENCE = {
    "sessions": 2048,
    "success_rate": 1.0,
    "step_p99_ms": 1560.0,
    "steps_per_s": 2075.0,
    "server_kb_per_session": 100.0,
    "note": "measured earlier on this machine; not part of this run",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--levels", default="256,1024,2048", help="comma-separated concurrent session counts"
    )
    parser.add_argument("--steps", type=int, default=10, help="steps per session")
    parser.add_argument("--backend", default="null", help="backend of the server (default null)")
    parser.add_argument(
        "--client-procs", type=int, default=2, help="load-generator processes (sessions split)"
    )
    parser.add_argument(
        "--client",
        choices=("lean", "websockets"),
        default="lean",
        help="load generator's websocket client: lean (bench/wsclient.py, about half the CPU per "
        "step of the other, so less is taken from the server it shares the CPUs with) or "
        "websockets (its asyncio client)",
    )
    parser.add_argument(
        "--client-loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="load generator's event loop: auto (uvloop when installed: less client CPU per "
        "step, so less taken from the servers sharing the CPUs), uvloop, asyncio",
    )
    parser.add_argument(
        "--servers",
        default="sandgym,openenv,local",
        help="what to drive: sandgym (--backend, --levels), openenv (--levels), local (sandgym "
        "on the local backend: --local-sessions sessions of --local-steps real commands)",
    )
    parser.add_argument(
        "--barrier",
        action="store_true",
        help="all sessions reset before any steps (step phase measured alone); default: each "
        "session steps right after its own reset, so resets and steps overlap",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each level per server, alternating which goes first; the median is "
        "reported (this machine is shared: single runs swing with the background load)",
    )
    parser.add_argument("--local-sessions", type=int, default=64, help="sessions of `local`")
    parser.add_argument("--local-steps", type=int, default=50, help="steps per `local` session")
    parser.add_argument(
        "--openenv-python",
        default=os.environ.get("SANDGYM_BENCH_OPENENV_PYTHON", "/tmp/openenv-venv/bin/python"),
        help="python of a virtualenv with openenv-core installed",
    )
    parser.add_argument(
        "--openenv-env",
        choices=("plain", "mcp"),
        default="plain",
        help="OpenEnv environment: plain (an async echo env on its create_app, its fastest "
        "path) or mcp (its shipped envs/echo_env, MCP tools; ~7 ms of server CPU per step)",
    )
    parser.add_argument(
        "--openenv-app-dir",
        default=os.environ.get("SANDGYM_BENCH_OPENENV_APP", "/tmp/openenv-src/envs/echo_env"),
        help="OpenEnv's envs/echo_env directory (holds server/app.py)",
    )


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


# -- wire dialects: the only difference between the two servers, as the client sees them -------
class _Dialect:
    """Frames of one server's protocol and the checks on its replies."""

    name = ""
    close_replies = False  # whether the server answers `close` before the socket is closed

    def reset(self, i: int) -> str:
        raise NotImplementedError

    def step(self, i: int, k: int) -> str:
        raise NotImplementedError

    def close(self, i: int) -> str | None:
        raise NotImplementedError

    def check_reset(self, reply: dict[str, Any]) -> str | None:
        """None when the reply is right, else an error kind."""
        raise NotImplementedError

    def check_step(self, reply: dict[str, Any]) -> str | None:
        raise NotImplementedError


class _Sandgym(_Dialect):
    name = "sandgym"
    close_replies = True  # else the episode waits resume_grace_s for a `resume`

    def reset(self, i: int) -> str:
        return json.dumps({"type": "reset", "request_id": "r", "task_id": TASK_ID})

    def step(self, i: int, k: int) -> str:
        return json.dumps(
            {
                "type": "step",
                "request_id": str(k),
                "action": {"kind": "command", "command": "echo hi"},
            }
        )

    def close(self, i: int) -> str | None:
        return json.dumps({"type": "close", "request_id": "c"})

    def check_reset(self, reply: dict[str, Any]) -> str | None:
        if reply.get("type") == "observation":
            return None
        return str(reply.get("code") or reply.get("type"))

    def check_step(self, reply: dict[str, Any]) -> str | None:
        if reply.get("type") != "step_result":
            return str(reply.get("code") or reply.get("type"))
        return None if reply["observation"]["output"] == "hi\n" else "wrong_output"


class _OpenEnv(_Dialect):
    name = "openenv"

    def reset(self, i: int) -> str:
        return json.dumps({"type": "reset", "data": {}})

    def step(self, i: int, k: int) -> str:
        action = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}}
        return json.dumps({"type": "step", "data": action})

    def close(self, i: int) -> str | None:
        return json.dumps({"type": "close"})

    def check_reset(self, reply: dict[str, Any]) -> str | None:
        if reply.get("type") == "observation":
            return None
        return str((reply.get("data") or {}).get("code") or reply.get("type"))

    def check_step(self, reply: dict[str, Any]) -> str | None:
        if reply.get("type") != "observation":
            return str((reply.get("data") or {}).get("code") or reply.get("type"))
        # The echoed text sits in the tool result (its exact nesting varies across versions).
        return None if '"hi"' in json.dumps(reply["data"]) else "wrong_output"


class _OpenEnvPlain(_OpenEnv):
    """OpenEnv's server hosting `_OPENENV_PLAIN_APP` (an `EchoAction(message)` environment)."""

    def step(self, i: int, k: int) -> str:
        return json.dumps({"type": "step", "data": {"message": "hi"}})


DIALECTS: dict[str, type[_Dialect]] = {
    "sandgym": _Sandgym,
    "openenv": _OpenEnvPlain,
    "openenv-mcp": _OpenEnv,
}

#: The plain echo environment the bench hosts on OpenEnv's server (`create_app`, its `/ws`):
#: async reset/step, so the server awaits them on its loop (OpenEnv's fastest path, no executor
#: thread per session). Written by this bench; OpenEnv itself only provides the server.
_OPENENV_PLAIN_APP = """
import os
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""


class PlainEcho(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kw: Any):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation()

    async def reset_async(self, seed=None, episode_id=None, **kw):
        return self.reset(seed=seed, episode_id=episode_id, **kw)

    def step(self, action: EchoAction, timeout_s: Optional[float] = None, **kw: Any):
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message)

    async def step_async(self, action, timeout_s=None, **kw):
        return self.step(action, timeout_s=timeout_s, **kw)

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    PlainEcho, EchoAction, EchoObservation, env_name="plain_echo",
    max_concurrent_envs=int(os.environ["MAX_CONCURRENT_ENVS"]),
)
"""


# -- load generator (runs in child processes) ---------------------------------------------------
async def _connect(url: str, client: str) -> Any:
    """A connection of the load generator: `lean` (bench/wsclient.py) or `websockets`."""
    if client == "lean":
        from bench.wsclient import WsClient

        return await WsClient.connect(url, timeout_s=300)
    from websockets.asyncio.client import connect

    return await connect(url, open_timeout=300, ping_interval=None, close_timeout=5, max_size=None)


async def _drive(
    url: str, dialect: _Dialect, n: int, steps: int, barrier: bool, client: str, ctl: Connection
) -> None:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    window = [float("inf"), 0.0]
    ok_sessions = 0
    done = 0
    reset_done = 0
    all_reset = asyncio.Event()
    go = asyncio.Event()
    all_stepped = asyncio.Event()
    release = asyncio.Event()

    def count_reset() -> None:
        nonlocal reset_done
        reset_done += 1
        if reset_done == n:
            all_reset.set()

    async def session(i: int) -> None:
        nonlocal ok_sessions, done
        ws = None
        counted = False
        try:
            ws = await _connect(url, client)
            await ws.send(dialect.reset(i))
            bad = dialect.check_reset(json.loads(await ws.recv()))
            if bad:
                errors[f"reset:{bad}"] += 1
                return
            counted = True
            count_reset()
            if barrier:
                await go.wait()  # every session steps at once: the step phase measured alone
            for k in range(steps):
                t0 = time.monotonic()
                await ws.send(dialect.step(i, k))
                raw = await ws.recv()
                t1 = time.monotonic()
                bad = dialect.check_step(json.loads(raw))
                if bad:
                    errors[f"step:{bad}"] += 1
                    return
                latencies.append(t1 - t0)
                window[0] = min(window[0], t0)
                window[1] = max(window[1], t1)
            ok_sessions += 1
        except Exception as exc:  # refused connections, drops, timeouts: counted, never hidden
            errors[type(exc).__name__] += 1
        finally:
            if not counted:
                count_reset()
            done += 1
            if done == n:
                all_stepped.set()
            await release.wait()  # hold the episode open while the server's memory is read
            if ws is not None:
                try:
                    frame = dialect.close(i)
                    if frame is not None:
                        await ws.send(frame)
                        if dialect.close_replies:
                            await ws.recv()  # the episode has ended before the socket goes
                    await ws.close()
                except Exception:
                    pass

    loop = asyncio.get_running_loop()
    # Every load generator starts at once: spawned processes finish importing at different
    # times, and a late one would stretch the measured span by its delay.
    ctl.send("ready")
    await loop.run_in_executor(None, ctl.recv)
    tasks = [asyncio.create_task(session(i)) for i in range(n)]
    cpu0 = time.process_time()
    await all_reset.wait()
    ctl.send("reset")
    await loop.run_in_executor(None, ctl.recv)
    if barrier:  # the step phase alone
        cpu0 = time.process_time()
    go.set()
    await all_stepped.wait()
    cpu_used = time.process_time() - cpu0
    ctl.send(
        {
            "latencies": latencies,
            "errors": dict(errors),
            "ok_sessions": ok_sessions,
            "window": window,
            "client_cpu_s": cpu_used,
        }
    )
    await loop.run_in_executor(None, ctl.recv)
    release.set()
    await asyncio.gather(*tasks)
    ctl.send("closed")


def _client_loop(loop: str) -> str:
    """The load generator's event loop: uvloop when asked or (auto) when installed."""
    if loop == "auto":
        import importlib.util

        return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return loop


def _client_main(
    url: str,
    dialect: str,
    n: int,
    steps: int,
    barrier: bool,
    client: str,
    loop: str,
    ctl: Connection,
) -> None:
    _raise_fd_limit(n + 256)
    if _client_loop(loop) == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(_drive(url, DIALECTS[dialect](), n, steps, barrier, client, ctl))


def _proc_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s(pid: int) -> float:
    """CPU seconds of `pid`'s live descendants (the local backend's sandbox shells)."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                todo.extend(k for k in kids if k not in seen)
                seen.update(kids)
        except OSError:
            continue  # gone meanwhile
    for p in seen:
        try:
            total += _proc_cpu_s(p)
        except (OSError, IndexError):
            pass
    return total


def _machine_busy_s() -> float:
    """Seconds of CPU the whole machine has spent busy (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _level(
    url: str,
    pid: int,
    dialect: str,
    n: int,
    steps: int,
    procs: int,
    barrier: bool,
    client: str = "lean",
    loop: str = "auto",
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    shares = [s for s in shares if s > 0]
    pipes: list[Connection] = []
    children = []
    for share in shares:
        parent_end, child_end = ctx.Pipe()
        p = ctx.Process(
            target=_client_main,
            args=(url, dialect, share, steps, barrier, client, loop, child_end),
        )
        p.start()
        pipes.append(parent_end)
        children.append(p)
    for c in pipes:
        c.recv()  # every child is ready to connect
    rss_before, cpu_before = _proc_rss_bytes(pid), _proc_cpu_s(pid)
    for c in pipes:
        c.send("start")
    for c in pipes:
        c.recv()  # every child's sessions have connected and reset (or failed)
    cpu_reset = _proc_cpu_s(pid) - cpu_before
    machine0, cpu_step0, t_go = _machine_busy_s(), _proc_cpu_s(pid), time.monotonic()
    kids0 = _children_cpu_s(pid)
    for c in pipes:
        c.send("go")
    parts = [c.recv() for c in pipes]  # every child's sessions have stepped (or failed)
    rss_peak, cpu_used = _proc_rss_bytes(pid), _proc_cpu_s(pid) - cpu_step0
    if not barrier:  # resets and steps overlap: one figure for all of it, per step
        cpu_used, cpu_reset = cpu_used + cpu_reset, float("nan")
    kids_used = _children_cpu_s(pid) - kids0
    machine_busy = (_machine_busy_s() - machine0) / max(1e-9, time.monotonic() - t_go)
    for c in pipes:
        c.send("release")
    for c in pipes:
        c.recv()
    for p in children:
        p.join(timeout=60)
    latencies = [x for part in parts for x in part["latencies"]]
    errors: Counter[str] = Counter()
    for part in parts:
        errors.update(part["errors"])
    ok_sessions = sum(part["ok_sessions"] for part in parts)
    starts = [part["window"][0] for part in parts if part["latencies"]]
    ends = [part["window"][1] for part in parts if part["latencies"]]
    span = (max(ends) - min(starts)) if starts else 0.0
    total_steps = len(latencies)
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
        # The server's own cost, whatever the clients sharing the machine do to wall clock:
        # the step phase alone, and connect + reset per session before it.
        "server_cpu_us_per_step": round(cpu_used / max(1, total_steps) * 1e6, 1),
        "server_cpu_us_per_connect_reset": round(cpu_reset / n * 1e6, 1) if barrier else None,
        # The server's child processes (sandbox shells on `local`; 0 on `null`).
        "sandbox_cpu_us_per_step": round(kids_used / max(1, total_steps) * 1e6, 1),
        # CPUs busy on the whole machine during the step phase (other work included).
        "machine_cpus_busy_in_step_phase": round(machine_busy, 2),
        "client_cpu_us_per_step": round(
            sum(part["client_cpu_s"] for part in parts) / max(1, total_steps) * 1e6, 1
        ),
        "server_rss_before_mb": round(rss_before / 2**20, 1),
        "server_rss_peak_mb": round(rss_peak / 2**20, 1),
        "server_kb_per_session": round((rss_peak - rss_before) / 1024 / max(1, ok_sessions), 1),
    }


# -- servers ------------------------------------------------------------------------------------
def _wait_http(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} at startup")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server did not answer {url} within {timeout_s:g}s")


@dataclass
class _Target:
    """A running server the load generator can drive."""

    name: str
    url: str
    pid: int
    meta: dict[str, Any]
    dialect: str = ""

    def __post_init__(self) -> None:
        self.dialect = self.dialect or self.name


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's repeats folded into one record: the median of every figure (the worst
    success rate, the largest memory growth), the repeats kept beside it under `runs`."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = dict(runs[-1])
    for key, value in runs[-1].items():
        if key in ("sessions", "steps_per_session"):
            continue
        values = [r[key] for r in runs]
        if isinstance(value, int | float) and not isinstance(value, bool):
            if all(isinstance(v, int | float) for v in values):
                out[key] = statistics.median(values)
    # Memory: the run that grew the heap (later repeats reuse it, so their delta reads ~0).
    for key in ("server_rss_peak_mb", "server_kb_per_session"):
        out[key] = max(r[key] for r in runs)
    out["success_rate"] = min(r["success_rate"] for r in runs)
    out["ok_sessions"] = min(r["ok_sessions"] for r in runs)
    errors: Counter[str] = Counter()
    for r in runs:
        errors.update(r["errors"])
    out["errors"] = dict(errors)
    out["runs"] = [
        {
            k: r[k]
            for k in (
                "step_p50_ms",
                "step_p99_ms",
                "steps_per_s",
                "server_cpu_us_per_step",
                "server_kb_per_session",
            )  # fmt: skip
        }
        for r in runs
    ]
    return out


def _run_level(t: _Target, n: int, args: argparse.Namespace) -> dict[str, Any]:
    res = _level(
        t.url,
        t.pid,
        t.dialect,
        n,
        args.steps,
        args.client_procs,
        args.barrier,
        args.client,
        args.client_loop,
    )
    print(
        f"bench sessions: {t.name} {n}: ok {res['success_rate']:.2%} "
        f"p99 {res['step_p99_ms']} ms, {res['steps_per_s']} steps/s",
        file=sys.stderr,
    )
    return res


def _wait_quiet(pids: list[int], timeout_s: float = 60.0) -> float:
    """Wait until every server is idle (under 5 % of a CPU over a quarter second): a server
    still closing the last level's sessions (2048 closes take OpenEnv seconds) would take CPU
    from the next run, and its memory reading would not be a baseline. Returns seconds waited."""
    start = time.monotonic()
    window = 0.25
    while True:
        before = [_proc_cpu_s(p) for p in pids]
        time.sleep(window)
        used = max(_proc_cpu_s(p) - b for p, b in zip(pids, before, strict=True))
        waited = time.monotonic() - start
        if (used < 0.05 * window and waited >= 0.5) or waited > timeout_s:
            return waited


def _bench_local(args: argparse.Namespace, levels: list[int]) -> dict[str, Any]:
    """sandgym on the local backend: each step runs `echo hi` in the session's real shell.

    Headline: all `--local-sessions` sessions reset first, then step together (64 sessions
    running commands at once, what the target is about). Beside it, `overlapped`: each session
    steps right after its own reset, so the window also holds the creation of the sandboxes
    (no warm pool in this bench: each reset creates one, 4 at a time)."""
    base = {**vars(args), "backend": "local", "steps": args.local_steps}
    out = _bench_sandgym(argparse.Namespace(**{**base, "barrier": True}), [args.local_sessions])
    r = out["results"][0]
    # Derived, labelled as such: what the measured CPU per step (server + shells + clients)
    # allows on this machine's CPUs when nothing else runs on them.
    total_us = r["server_cpu_us_per_step"] + r["sandbox_cpu_us_per_step"]
    total_us += r["client_cpu_us_per_step"]
    out["mode"] = "all sessions reset, then step together"
    out["target_steps_per_s"] = 1000
    out["target_met"] = r["success_rate"] == 1.0 and r["steps_per_s"] >= 1000
    out["cpu_us_per_step_all_processes"] = round(total_us, 1)
    out["steps_per_s_cpu_bound_estimate"] = round((os.cpu_count() or 1) * 1e6 / total_us, 1)
    over = _bench_sandgym(argparse.Namespace(**{**base, "barrier": False}), [args.local_sessions])
    out["overlapped"] = {
        "mode": "each session steps right after its own reset (sandbox creation in the window)",
        **over["results"][0],
    }
    return out


@contextlib.contextmanager
def _sandgym_server(args: argparse.Namespace, levels: list[int]) -> Iterator[_Target]:
    """`sandgym serve` on `args.backend` with the bench-echo task, as a child process."""
    from envserver.runner import ServerProcess
    from envserver.settings import ServerSettings

    top = max(levels)
    env = {
        "SANDGYM_MAX_SESSIONS": str(top),
        "SANDGYM_POOL_SIZE": "0",
        "SANDGYM_MAX_STEPS": str(args.steps + 5),
        "SANDGYM_INCLUDE_BUILTIN": "false",
        "SANDGYM_POOL_MAX_TOTAL": str(top * 2),
    }
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-sessions-") as tmp:
        root = write_bench_task(Path(tmp))
        with ServerProcess(args.backend, args=["--tasks", str(root)], env=env) as srv:
            meta = {
                "server": "sandgym serve",
                "backend": args.backend,
                "ws_impl": os.environ.get("SANDGYM_WS_IMPL", ServerSettings().ws_impl),
            }
            yield _Target("sandgym", srv.url, srv.pid, meta)


def _bench_sandgym(args: argparse.Namespace, levels: list[int]) -> dict[str, Any]:
    with _sandgym_server(args, levels) as t:
        results = []
        for n in levels:
            _wait_quiet([t.pid])
            results.append(_run_level(t, n, args))
        return {**t.meta, "results": results}


def _openenv_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('openenv-core'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise RuntimeError(f"openenv-core is not importable by {python}: {out.stderr[-300:]}")
    return out.stdout.strip()


@contextlib.contextmanager
def _openenv_server(args: argparse.Namespace, levels: list[int]) -> Iterator[_Target]:
    """OpenEnv's server (`--openenv-env`) in its own virtualenv, as a child process."""
    if not Path(args.openenv_python).exists():
        raise RuntimeError(f"no python at --openenv-python {args.openenv_python}")
    version = _openenv_version(args.openenv_python)
    if args.openenv_env == "mcp":
        app_dir = Path(args.openenv_app_dir)
        if not (app_dir / "server" / "app.py").exists():
            raise RuntimeError(f"no server/app.py under --openenv-app-dir {app_dir}")
        with _serve_openenv(args, levels, app_dir, "openenv-mcp", version) as t:
            yield t
        return
    with tempfile.TemporaryDirectory(prefix="sandgym-bench-openenv-") as tmp:
        (Path(tmp) / "server").mkdir()
        (Path(tmp) / "server" / "__init__.py").write_text("")
        (Path(tmp) / "server" / "app.py").write_text(_OPENENV_PLAIN_APP)
        with _serve_openenv(args, levels, Path(tmp), "openenv", version) as t:
            yield t


@contextlib.contextmanager
def _serve_openenv(
    args: argparse.Namespace, levels: list[int], app_dir: Path, dialect: str, version: str
) -> Iterator[_Target]:
    from envserver.runner import free_port

    port = free_port()
    # OpenEnv's server as it ships: uvicorn with its defaults (loop/ws "auto"), no access log.
    cmd = [args.openenv_python, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    env = {**os.environ, "MAX_CONCURRENT_ENVS": str(max(levels) + 16)}
    # Its log (a traceback per closed websocket) goes to a file, shown only if it fails to start.
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            _wait_http(proc, f"http://127.0.0.1:{port}/health", 120)
        except RuntimeError as exc:
            log.seek(0)
            raise RuntimeError(f"{exc}; its log ends: {log.read()[-1500:]!r}") from exc
        what = {
            "openenv": "OpenEnv create_app (its /ws endpoint) hosting a plain async echo "
            "environment (EchoAction(message) -> EchoObservation(echoed_message)), under uvicorn",
            "openenv-mcp": "OpenEnv envs/echo_env (MCP tools through FastMCP) under uvicorn",
        }[dialect]
        meta = {"server": what, "openenv_core_version": version}
        yield _Target("openenv", f"ws://127.0.0.1:{port}/ws", proc.pid, meta, dialect)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _verdict(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: all sessions ok, p99 under half of OpenEnv's, steps/s at least twice."""
    by_n = {r["sessions"]: r for r in theirs}
    out = []
    for r in ours:
        o = by_n.get(r["sessions"])
        if o is None or not o["step_p99_ms"] or not r["step_p99_ms"]:
            continue
        out.append(
            {
                "sessions": r["sessions"],
                "all_ok": r["success_rate"] == 1.0,
                "p99_ratio": round(r["step_p99_ms"] / o["step_p99_ms"], 3),
                "steps_per_s_ratio": round(r["steps_per_s"] / o["steps_per_s"], 3),
                "target_met": r["success_rate"] == 1.0
                and r["step_p99_ms"] < 0.5 * o["step_p99_ms"]
                and r["steps_per_s"] >= 2 * o["steps_per_s"],
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    # Other work on the machine skews latencies: the load is recorded beside the figures.
    load_start = [round(x, 2) for x in os.getloadavg()]
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    _raise_fd_limit(max(levels) * 2 + 256)
    doc: dict[str, Any] = {
        "bench": "sessions",
        "workload": f"per session: connect, reset, {args.steps} echo steps, hold, close"
        + ("; all sessions reset before any steps" if args.barrier else ""),
        "client": (
            f"bench/wsclient.py (lean) in {args.client_procs} processes"
            if args.client == "lean"
            else f"websockets {_websockets_version()} in {args.client_procs} processes"
        )
        + f", event loop {_client_loop(args.client_loop)}",
        "repeats": args.repeats,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_start": load_start,
        },
        "note": (
            "clients and servers share this machine's CPUs; figures are lower bounds. The lean "
            "client offers no websocket extension, so neither server compresses; the websockets "
            "client used before offered permessage-deflate, which OpenEnv's uvicorn (deflate on "
            "by default) took up, costing its server CPU that sandgym (deflate off) did not spend"
            if args.client == "lean"
            else "clients and servers share this machine's CPUs; figures are lower bounds. The "
            "websockets client offers permessage-deflate: OpenEnv's uvicorn takes it up (its "
            "default), sandgym's server does not"
        ),
    }
    # sandgym and OpenEnv run side by side, level by level (both servers up, idle when not
    # driven), so both face the same background load on this shared machine.
    with contextlib.ExitStack() as stack:
        targets: list[_Target] = []
        starters = {"sandgym": _sandgym_server, "openenv": _openenv_server}
        for name in [s for s in servers if s in starters]:
            try:
                targets.append(stack.enter_context(starters[name](args, levels)))
            except Exception as exc:
                if name == "sandgym":
                    raise
                doc[name] = {"skipped": f"{type(exc).__name__}: {exc}"}
                doc["openenv_reference"] = OPENENV_REFERENCE
                print(f"bench sessions: {name} skipped: {exc}", file=sys.stderr)
        for t in targets:
            doc[t.name] = {**t.meta, "results": []}
        for n in levels:
            runs: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
            for i in range(args.repeats):
                # Alternate who goes first: neither server always meets the same drift.
                for t in targets if i % 2 == 0 else targets[::-1]:
                    waited = _wait_quiet([x.pid for x in targets])
                    if waited > 2:
                        print(
                            f"bench sessions: {waited:.1f}s until the servers idled",
                            file=sys.stderr,
                        )
                    runs[t.name].append(_run_level(t, n, args))
            for t in targets:
                doc[t.name]["results"].append(_median_run(runs[t.name]))
    if "local" in servers:
        try:
            doc["local"] = _bench_local(args, levels)
        except Exception as exc:
            doc["local"] = {"skipped": f"{type(exc).__name__}: {exc}"}
            print(f"bench sessions: local skipped: {exc}", file=sys.stderr)
    failed = any(
        r["success_rate"] < 1.0 for name in servers for r in doc.get(name, {}).get("results", [])
    )
    if "results" in doc.get("sandgym", {}) and "results" in doc.get("openenv", {}):
        doc["vs_openenv"] = _verdict(doc["sandgym"]["results"], doc["openenv"]["results"])
    doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        print(
            f"{'server':8} {'sessions':>8} {'ok':>7} {'p50 ms':>8} {'p99 ms':>8} {'steps/s':>9} "
            f"{'KiB/ses':>8} {'srv cpu us/step':>15}"
        )
        for name in servers:
            for r in doc.get(name, {}).get("results", []):
                print(
                    f"{name:8} {r['sessions']:>8} {r['success_rate']:>7.2%} "
                    f"{r['step_p50_ms']:>8} {r['step_p99_ms']:>8} {r['steps_per_s']:>9} "
                    f"{r['server_kb_per_session']:>8} {r['server_cpu_us_per_step']:>15}"
                )
    return 1 if failed else 0


def _websockets_version() -> str:
    import websockets

    return str(websockets.__version__)

"""The load generator of `sandgym bench sessions`, and one measured run of one level.

`run_level` starts `procs` load-generator processes (spawned, each pinned to the load
generator's CPUs when given), which open `n` sessions against one server, reset, step and hold
their episodes; it reads the server's CPU time and memory (psutil) around each phase, and returns
the run's raw record: every step latency, every reading, every error. `summarize_run` derives the
reported figures from that raw record alone, so each figure in `lab/bench/results/sessions.json` can
be recomputed from `sessions.raw.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import resource
import time
from collections import Counter
from multiprocessing.connection import Connection
from typing import Any

import psutil

from lab.bench.report import percentile
from lab.bench.step import TASK_ID


def raise_fd_limit(need: int) -> None:
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


# -- load generator (runs in child processes) ---------------------------------------------------
async def _connect(url: str, client: str) -> Any:
    """A connection of the load generator: `lean` (lab/bench/wsclient.py) or `websockets`."""
    if client == "lean":
        from lab.bench.wsclient import WsClient

        return await WsClient.connect(url, timeout_s=300)
    from websockets.asyncio.client import connect

    return await connect(url, open_timeout=300, ping_interval=None, close_timeout=5, max_size=None)


async def _drive(
    url: str, dialect: _Dialect, n: int, steps: int, barrier: bool, client: str, ctl: Connection
) -> None:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    close_errors: Counter[str] = Counter()
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
                except Exception as exc:  # after the measured phases: counted on their own
                    close_errors[type(exc).__name__] += 1

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
    ctl.send({"close_errors": dict(close_errors)})


def client_loop(loop: str) -> str:
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
    cpus: list[int] | None = None,
) -> None:
    if cpus:  # before any thread exists: every thread of this process inherits it
        os.sched_setaffinity(0, cpus)
    raise_fd_limit(n + 256)
    if client_loop(loop) == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(_drive(url, DIALECTS[dialect](), n, steps, barrier, client, ctl))


# -- one measured run -------------------------------------------------------------------------
def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def _children_cpu_s(pid: int) -> float:
    """CPU seconds of `pid`'s live descendants (the local backend's sandbox shells)."""
    total = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.NoSuchProcess:
            continue  # gone meanwhile
        total += t.user + t.system
    return total


def _busy_s_by_cpu() -> list[float]:
    """Seconds each CPU has spent busy (not idle, not waiting on I/O), machine-wide."""
    return [
        sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
        - getattr(t, "guest_nice", 0.0)
        for t in psutil.cpu_times(percpu=True)
    ]  # fmt: skip


def run_level(
    url: str,
    pid: int,
    dialect: str,
    n: int,
    steps: int,
    procs: int,
    barrier: bool,
    client: str = "lean",
    loop: str = "auto",
    client_cpus: list[int] | None = None,
) -> dict[str, Any]:
    """One run of `n` sessions against the server `pid` at `url`: the raw record."""
    ctx = mp.get_context("spawn")
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    shares = [s for s in shares if s > 0]
    pipes: list[Connection] = []
    children = []
    for share in shares:
        parent_end, child_end = ctx.Pipe()
        p = ctx.Process(
            target=_client_main,
            args=(url, dialect, share, steps, barrier, client, loop, child_end, client_cpus),
        )
        p.start()
        pipes.append(parent_end)
        children.append(p)
    for c in pipes:
        c.recv()  # every child is ready to connect
    rss_before, cpu_start = psutil.Process(pid).memory_info().rss, _cpu_s(pid)
    t_start = time.monotonic()
    for c in pipes:
        c.send("start")
    for c in pipes:
        c.recv()  # every child's sessions have connected and reset (or failed)
    cpu_reset_done = _cpu_s(pid)
    kids0 = _children_cpu_s(pid)
    # Each machine-wide reading right beside its own clock reading: on a loaded host the other
    # readings around them can take a while, and would stretch the window the busy time fills.
    busy0, t_go = _busy_s_by_cpu(), time.monotonic()
    for c in pipes:
        c.send("go")
    parts = [c.recv() for c in pipes]  # every child's sessions have stepped (or failed)
    t_stepped = time.monotonic()
    busy1 = _busy_s_by_cpu()
    t_busy1 = time.monotonic()
    rss_barrier, cpu_steps_done = psutil.Process(pid).memory_info().rss, _cpu_s(pid)
    kids1 = _children_cpu_s(pid)
    for c in pipes:
        c.send("release")
    closing = [c.recv() for c in pipes]
    for p in children:
        p.join(timeout=60)
    errors: Counter[str] = Counter()
    close_errors: Counter[str] = Counter()
    for part in parts:
        errors.update(part["errors"])
    for part in closing:
        close_errors.update(part["close_errors"])
    starts = [part["window"][0] for part in parts if part["latencies"]]
    ends = [part["window"][1] for part in parts if part["latencies"]]
    return {
        "sessions": n,
        "steps_per_session": steps,
        "barrier": barrier,
        "latencies_us": [round(x * 1e6) for part in parts for x in part["latencies"]],
        "ok_sessions": sum(part["ok_sessions"] for part in parts),
        "errors": dict(errors),
        "close_errors": dict(close_errors),
        # first step sent to last reply, over every load generator (one monotonic clock)
        "step_window_s": (max(ends) - min(starts)) if starts else 0.0,
        "server_cpu_s": {
            "at_start": cpu_start,
            "all_reset": cpu_reset_done,
            "all_stepped": cpu_steps_done,
        },
        "server_children_cpu_s": {"all_reset": kids0, "all_stepped": kids1},
        "server_rss_bytes": {"before": rss_before, "at_barrier": rss_barrier},
        "cpu_busy_s_by_cpu": {"all_reset": busy0, "all_stepped": busy1},
        "phase_s": {
            "connect_reset": t_go - t_start,
            "steps": t_stepped - t_go,
            "busy_window": t_busy1 - t_go,  # from the first busy reading to the second
        },
        "client_cpu_s": [part["client_cpu_s"] for part in parts],
    }


def summarize_run(raw: dict[str, Any]) -> dict[str, Any]:
    """The reported figures of one run, from its raw record (`run_level`) alone."""
    lat_ms = [x / 1000 for x in raw["latencies_us"]]
    n, steps = raw["sessions"], len(lat_ms)
    cpu = raw["server_cpu_s"]
    step_cpu = cpu["all_stepped"] - cpu["all_reset"]
    reset_cpu = cpu["all_reset"] - cpu["at_start"]
    if not raw["barrier"]:  # resets and steps overlap: one figure for all of it, per step
        step_cpu += reset_cpu
    kids = raw["server_children_cpu_s"]
    busy = raw["cpu_busy_s_by_cpu"]
    busy_by_cpu = [b - a for a, b in zip(busy["all_reset"], busy["all_stepped"], strict=True)]
    busy_s = max(1e-9, raw["phase_s"]["busy_window"])
    rss = raw["server_rss_bytes"]
    span = raw["step_window_s"]
    return {
        "sessions": n,
        "steps_per_session": raw["steps_per_session"],
        "ok_sessions": raw["ok_sessions"],
        "success_rate": round(raw["ok_sessions"] / n, 4),
        "errors": raw["errors"],
        "close_errors": raw["close_errors"],
        "steps": steps,
        "step_p50_ms": round(percentile(lat_ms, 50), 3) if lat_ms else None,
        "step_p99_ms": round(percentile(lat_ms, 99), 3) if lat_ms else None,
        "steps_per_s": round(steps / span, 1) if span else None,
        # The server's own cost, whatever the clients sharing the machine do to wall clock:
        # with a barrier the step phase alone, and connect + reset per session before it.
        "server_cpu_us_per_step": round(step_cpu / max(1, steps) * 1e6, 1),
        "server_cpu_us_per_connect_reset": (
            round(reset_cpu / n * 1e6, 1) if raw["barrier"] else None
        ),
        # The server's child processes (sandbox shells on `local`; 0 on `null`).
        "sandbox_cpu_us_per_step": round(
            (kids["all_stepped"] - kids["all_reset"]) / max(1, steps) * 1e6, 1
        ),
        # CPUs busy during the step phase (other work on the machine included), each and all.
        "cpus_busy_in_step_phase_by_cpu": [round(b / busy_s, 2) for b in busy_by_cpu],
        "machine_cpus_busy_in_step_phase": round(sum(busy_by_cpu) / busy_s, 2),
        "client_cpu_us_per_step": round(sum(raw["client_cpu_s"]) / max(1, steps) * 1e6, 1),
        "server_rss_before_mb": round(rss["before"] / 2**20, 1),
        "server_rss_at_barrier_mb": round(rss["at_barrier"] / 2**20, 1),
        "server_kb_per_session": round(
            (rss["at_barrier"] - rss["before"]) / 1024 / max(1, raw["ok_sessions"]), 1
        ),
    }

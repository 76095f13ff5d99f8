"""`sandgym bench sessions`: many concurrent sessions against one env server, beside OpenEnv.

For each level of `--levels 256,1024,2048` concurrent sessions, every session opens its own
websocket, resets and runs `--steps` echo steps (with `--barrier`, all sessions reset before any
steps, so the step phase is measured alone); then they hold their episodes open at a barrier
(where the server's RSS is read) and close. Per run and server: success rate (sessions whose
reset and steps all succeeded, replies checked), error kinds seen, p50/p99 step latency (send to
reply, as the client sees it), aggregate steps/s (first step sent to last reply), server CPU per
step (with `--barrier`: the step phase alone, and per connect + reset apart), CPU of the
server's child processes per step, how busy each CPU was in the step phase, and server memory
per session ((RSS at the barrier - RSS before the run) / live sessions; a later run reuses the
heap the first one grew, so the first pair's figure is reported apart).

Runs are **paired**: each of `--repeats` pairs drives sandgym and then OpenEnv (the order
alternates from pair to pair), once both servers are idle. Every pair is kept; a level is
reported as its median pair (by the sandgym/OpenEnv steps/s ratio), real runs both, never a
median per metric across runs. With at least two CPUs the servers run on the first and the load
generator on the others (`--no-pin`: anywhere), read back from each process.

`local` (in `--servers`) also runs `--local-sessions 64` sessions of `--local-steps 50` real
commands (`echo hi` in each session's bash) on the local backend, unpinned: all sessions reset,
then step together (target 1000 steps/s on 2 cores), and again overlapped (each session steps
right after its own reset, sandbox creation inside the window); it derives from the measured
CPU per step (server + shells + clients) the steps/s this machine's CPUs allow.

Servers (lab/bench/sessions_servers.py): `sandgym serve --backend null` (the sandbox is free, so
this measures the server itself; a step is `{"kind":"command","command":"echo hi"}`, the reply
must carry `output == "hi\\n"`), and OpenEnv's current release (the `openenv` distribution,
from `--openenv-python`, by default this python, whose dev extra installs it) as its
environment template deploys it, hosting a plain async echo environment (a step is `{"type":
"step", "data": {"message": "hi"}}`, the reply must echo `hi`). Each server's uvicorn, loop,
HTTP and websocket implementations are recorded. When OpenEnv cannot start, the reason is
recorded and no OpenEnv figure is reported.

The load generator (lab/bench/sessions_load.py; `--client lean`: lab/bench/wsclient.py, a minimal RFC
6455 client, or `--client websockets`) runs in `--client-procs` processes, started together.
`--json` prints one JSON document; `--out PATH` also writes it and, beside it, every run's raw
record (`PATH` with `.raw.jsonl`: every step latency and reading), from which each reported
figure is recomputed (`sessions_load.summarize_run`). Committed: `lab/bench/results/sessions.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from lab.bench.report import save_json
from lab.bench.sessions_load import client_loop, raise_fd_limit, run_level, summarize_run
from lab.bench.sessions_servers import (
    OpenEnvUnavailable,
    Target,
    default_openenv_python,
    openenv_server,
    pinned,
    sandgym_server,
    split_cpus,
    wait_quiet,
)

#: Figures of a run that a pair's ratios compare (sandgym / OpenEnv).
_RATIOS = {
    "p99": "step_p99_ms",
    "p50": "step_p50_ms",
    "steps_per_s": "steps_per_s",
    "server_cpu_per_step": "server_cpu_us_per_step",
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
        help="load generator's websocket client: lean (lab/bench/wsclient.py, about half the CPU per "
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
        help="pairs of runs (sandgym, OpenEnv) per level, alternating which goes first; every "
        "pair is kept and the median pair reported (single runs swing with the host's load)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the servers and the load generator to separate CPUs",
    )
    parser.add_argument(
        "--raw-out",
        type=Path,
        default=None,
        help="where every run's raw record goes (JSON lines; default: --out with .raw.jsonl)",
    )
    parser.add_argument("--local-sessions", type=int, default=64, help="sessions of `local`")
    parser.add_argument("--local-steps", type=int, default=50, help="steps per `local` session")
    parser.add_argument(
        "--openenv-python",
        default=default_openenv_python(),
        help="python that imports OpenEnv (the `openenv` distribution; default "
        "$SANDGYM_BENCH_OPENENV_PYTHON, else this python, where the dev extra installs it)",
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


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _pair_ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    return {k: _ratio(ours[field], theirs[field]) for k, field in _RATIOS.items()}


def _median_index(values: list[float]) -> int:
    """Index of the (lower) median of `values`: a real element, never an average of two."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def _run_pairs(
    targets: list[Target],
    n: int,
    args: argparse.Namespace,
    client_cpus: list[int] | None,
    raw_out: list[dict[str, Any]],
) -> dict[str, Any]:
    """Every pair of runs at one level, and which pair is the median one."""
    pairs: list[dict[str, Any]] = []
    pids = [t.pid for t in targets]
    for i in range(args.repeats):
        order = targets if i % 2 == 0 else targets[::-1]  # neither always meets the same drift
        pair: dict[str, Any] = {"pair": i, "order": [t.name for t in order]}
        for position, t in enumerate(order):
            waited = wait_quiet(pids)
            raw = run_level(
                t.url, t.pid, t.dialect, n, args.steps, args.client_procs, args.barrier,
                args.client, args.client_loop, client_cpus,
            )  # fmt: skip
            raw_out.append(
                {"server": t.name, "level": n, "pair": i, "position": position,
                 "waited_for_idle_s": round(waited, 3), **raw}
            )  # fmt: skip
            pair[t.name] = res = summarize_run(raw)
            print(
                f"bench sessions: {t.name} {n} (pair {i}): ok {res['success_rate']:.2%} "
                f"p99 {res['step_p99_ms']} ms, {res['steps_per_s']} steps/s",
                file=sys.stderr,
            )
        if "openenv" in pair:
            pair["ratios"] = _pair_ratios(pair["sandgym"], pair["openenv"])
        pairs.append(pair)
    if all("ratios" in p and p["ratios"]["steps_per_s"] is not None for p in pairs):
        by, key = "sandgym/openenv steps_per_s ratio", [p["ratios"]["steps_per_s"] for p in pairs]
    else:
        by, key = "sandgym steps_per_s", [p["sandgym"]["steps_per_s"] or 0.0 for p in pairs]
    median = _median_index(key)
    return {
        "sessions": n,
        "median_pair": median,
        "median_by": by,
        **{t.name: pairs[median][t.name] for t in targets},
        # The first pair grew each server's heap; later runs reuse it (their growth reads ~0).
        "server_kb_per_session_first_pair": {
            t.name: pairs[0][t.name]["server_kb_per_session"] for t in targets
        },
        "pairs": pairs,
    }


def _verdict(level: dict[str, Any]) -> dict[str, Any]:
    """One level's comparison: the median pair's ratios, every pair's, and the targets (all
    sessions ok in every run; in the median pair, p99 under half of OpenEnv's and at least
    twice its steps/s)."""
    pairs, m = level["pairs"], level["pairs"][level["median_pair"]]
    ours, ratios = m["sandgym"], m["ratios"]
    all_ok = all(p[s]["success_rate"] == 1.0 for p in pairs for s in ("sandgym", "openenv"))
    return {
        "sessions": level["sessions"],
        "pairs": len(pairs),
        "median_pair": level["median_pair"],
        **{f"{k}_ratio": v for k, v in ratios.items()},
        **{f"{k}_ratio_by_pair": [p["ratios"][k] for p in pairs] for k in ("p99", "steps_per_s")},
        "all_ok": all_ok,
        "target_met": bool(
            all_ok
            and ratios["p99"] is not None
            and ratios["p99"] < 0.5
            and ours["steps_per_s"] >= 2 * m["openenv"]["steps_per_s"]
        ),
    }


def _bench_local(args: argparse.Namespace, raw_out: list[dict[str, Any]]) -> dict[str, Any]:
    """sandgym on the local backend, unpinned: each step runs `echo hi` in the session's real
    shell. Headline: all `--local-sessions` sessions reset first, then step together. Beside it,
    `overlapped`: each session steps right after its own reset, so the window also holds the
    creation of the sandboxes (no warm pool here: each reset creates one, 4 at a time)."""
    base = {**vars(args), "backend": "local", "steps": args.local_steps}
    out: dict[str, Any] = {}
    for barrier in (True, False):
        sub = argparse.Namespace(**{**base, "barrier": barrier})
        with sandgym_server(sub, args.local_sessions) as t:
            wait_quiet([t.pid])
            raw = run_level(
                t.url, t.pid, t.dialect, args.local_sessions, args.local_steps,
                args.client_procs, barrier, args.client, args.client_loop,
            )  # fmt: skip
            mode = "together" if barrier else "overlapped"
            raw_out.append({"server": "local", "mode": mode, "level": args.local_sessions, **raw})
            res = summarize_run(raw)
            if barrier:
                out.update({**t.meta, "mode": "all sessions reset, then step together", **res})
            else:
                out["overlapped"] = {
                    "mode": "each session steps right after its own reset (creation in the window)",
                    **res,
                }
    # Derived, labelled as such: what the measured CPU per step (server + shells + clients)
    # allows on this machine's CPUs when nothing else runs on them.
    total_us = out["server_cpu_us_per_step"] + out["sandbox_cpu_us_per_step"]
    total_us += out["client_cpu_us_per_step"]
    out["target_steps_per_s"] = 1000
    out["target_met"] = out["success_rate"] == 1.0 and (out["steps_per_s"] or 0) >= 1000
    out["cpu_us_per_step_all_processes"] = round(total_us, 1)
    out["steps_per_s_cpu_bound_estimate"] = round((os.cpu_count() or 1) * 1e6 / total_us, 1)
    return out


def _raw_path(args: argparse.Namespace) -> Path | None:
    if args.raw_out is not None:
        return Path(args.raw_out)
    return Path(args.out).with_suffix(".raw.jsonl") if args.out is not None else None


def run(args: argparse.Namespace) -> int:
    # Other work on the machine skews latencies: the load is recorded beside the figures.
    load_start = [round(x, 2) for x in os.getloadavg()]
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    raise_fd_limit(max(levels) * 2 + 256)
    if args.no_pin:
        server_cpus, client_cpus, why = None, None, "not pinned (--no-pin)"
    else:
        server_cpus, client_cpus, why = split_cpus()
    raw_path = _raw_path(args)
    doc: dict[str, Any] = {
        "bench": "sessions",
        "argv": sys.argv[1:],
        "workload": f"per session: connect, reset, {args.steps} echo steps, hold, close"
        + ("; all sessions reset before any steps" if args.barrier else ""),
        "client": (
            f"lab/bench/wsclient.py (lean) in {args.client_procs} processes"
            if args.client == "lean"
            else f"websockets {_websockets_version()} in {args.client_procs} processes"
        )
        + f", event loop {client_loop(args.client_loop)}",
        "pairs_per_level": args.repeats,
        "pinning": {"servers": server_cpus, "load_generator": client_cpus, "how": why},
        "machine": {
            "cpus": os.cpu_count(),
            "usable_cpus": sorted(os.sched_getaffinity(0)),
            "python": platform.python_version(),
            "loadavg_at_start": load_start,
        },
        "raw": raw_path.name if raw_path is not None else None,
    }
    raw_out: list[dict[str, Any]] = []
    failed = False
    with contextlib.ExitStack() as stack:
        # sandgym and OpenEnv run side by side (both up, idle when not driven), so both face
        # the same background load on this shared machine.
        targets = [stack.enter_context(sandgym_server(args, max(levels), server_cpus))]
        if "openenv" in servers:
            try:
                targets.append(stack.enter_context(openenv_server(args, max(levels), server_cpus)))
            except OpenEnvUnavailable as exc:
                doc["openenv"] = {"skipped": str(exc)}
                print(f"bench sessions: openenv skipped: {exc}", file=sys.stderr)
        for t in targets:
            doc[t.name] = {**t.meta, "results": []}
        with pinned(client_cpus):  # this process reads the servers between phases
            for n in levels:
                level = _run_pairs(targets, n, args, client_cpus, raw_out)
                for t in targets:
                    doc[t.name]["results"].append(
                        {**level[t.name], "from_pair": level["median_pair"]}
                    )
                    failed |= any(p[t.name]["success_rate"] < 1.0 for p in level["pairs"])
                doc.setdefault("levels", []).append(level)
    if len(targets) == 2:
        doc["vs_openenv"] = [_verdict(level) for level in doc["levels"]]
    if "local" in servers:
        doc["local"] = _bench_local(args, raw_out)
    doc["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if raw_path is not None:
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        with raw_path.open("w", encoding="utf-8") as f:
            for record in raw_out:
                f.write(json.dumps(record, separators=(",", ":")) + "\n")
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        _print_table(doc, servers)
    return 1 if failed else 0


def _print_table(doc: dict[str, Any], servers: list[str]) -> None:
    print(
        f"{'server':8} {'sessions':>8} {'ok':>7} {'p50 ms':>8} {'p99 ms':>8} {'steps/s':>9} "
        f"{'srv cpu us/step':>15}  pair"
    )
    for name in servers:
        for r in doc.get(name, {}).get("results", []):
            print(
                f"{name:8} {r['sessions']:>8} {r['success_rate']:>7.2%} "
                f"{r['step_p50_ms']:>8} {r['step_p99_ms']:>8} {r['steps_per_s']:>9} "
                f"{r['server_cpu_us_per_step']:>15}  {r['from_pair']}"
            )
    for v in doc.get("vs_openenv", []):
        print(
            f"{v['sessions']:>6} sessions: steps/s ratio {v['steps_per_s_ratio']} (pairs "
            f"{v['steps_per_s_ratio_by_pair']}), p99 ratio {v['p99_ratio']}"
        )


def _websockets_version() -> str:
    import websockets

    return str(websockets.__version__)

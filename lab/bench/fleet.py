"""Bench: a fleet of two env servers behind one address, with a SIGKILL mid-job (issue 60).

Two `sandgym serve --backend local` processes on this host; TRL's door
(`sandgym.integrations.trl.SandgymEnvironment`, given `ws://A/v1/env,ws://B/v1/env`) plays
`--trials` rollouts of builtin/hello-file (the solving command, then the task's verifier), four
at a time. When a third of them have finished, server A is SIGKILLed (rollouts running there
are dropped: reward None, and retried up to twice after a second, as Harbor retries a trial); when two thirds have
finished, A is started again on its port. Before, the same rollouts run against A alone: the
rewards to compare with.

    python -m lab.bench.fleet --out lab/bench/results/fleet

writes `<out>.raw.jsonl` (one line per rollout attempt: phase, trial, attempt, server, reward,
dropped, seconds) and `<out>.json` (counts per server, rewards, what the kill did).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from sandgym.integrations.trl import SandgymEnvironment

TASK = "builtin/hello-file"
SOLVE = "sleep 1; printf 'Hello, world!\\n' > /app/hello.txt"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`sandgym serve --backend local` on a fixed port."""

    def __init__(self, port: int, max_sessions: int) -> None:
        self.port, self.max_sessions = port, max_sessions
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/env"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "sandgym.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend", "local",
               "--max-sessions", str(self.max_sessions)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"server on {self.port} did not answer within 90 s")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def rollout(address: str, phase: str, trial: int, attempt: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    error = None
    with SandgymEnvironment(address) as env:
        try:
            env.reset(task_id=TASK, seed=trial)
            env.run(SOLVE)
            reward = env.get_reward()
        except Exception as exc:  # a reset or a step the lost server did not answer: dropped
            error, reward = f"{type(exc).__name__}: {exc}"[:300], None
        server = env.served_by
    return {
        "error": error,
        "phase": phase,
        "trial": trial,
        "attempt": attempt,
        "server": server,
        "reward": reward,
        "dropped": reward is None,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def run(trials: int, out: Path) -> dict[str, Any]:
    a, b = Server(_free_port(), 6), Server(_free_port(), 6)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    try:
        a.start()
        with ThreadPoolExecutor(4) as pool:
            rows += pool.map(lambda i: rollout(a.ws, "single", i, 1), range(trials))
        b.start()
        address = f"{a.ws},{b.ws}"
        done = 0
        events: list[dict[str, Any]] = []

        def fleet_trial(i: int) -> list[dict[str, Any]]:
            nonlocal done
            attempt, mine = 1, []
            while True:
                row = rollout(address, "fleet", i, attempt)
                mine.append(row)
                if not row["dropped"] or attempt >= 3:
                    break
                attempt += 1
                time.sleep(1.0)  # the retry's backoff (Harbor's trial retry waits too)
            with lock:
                done += 1
                if done == trials // 3:
                    a.kill()
                    events.append({"event": "kill", "server": a.ws, "after_done": done})
                elif done == 2 * trials // 3:
                    a.start()
                    events.append({"event": "restart", "server": a.ws, "after_done": done})
            return mine

        with ThreadPoolExecutor(4) as pool:
            for mine in pool.map(fleet_trial, range(trials)):
                rows += mine
    finally:
        a.stop()
        b.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fleet = [r for r in rows if r["phase"] == "fleet"]
    single = [r for r in rows if r["phase"] == "single"]
    final = {r["trial"]: r["reward"] for r in fleet}  # the last attempt of each trial
    summary = {
        "trials": trials,
        "servers": {"A": a.ws, "B": b.ws},
        "events": events,
        "fleet_attempts_per_server": dict(Counter(r["server"] for r in fleet)),
        "fleet_dropped": [(r["trial"], r["server"]) for r in fleet if r["dropped"]],
        "fleet_scored_zero": sum(1 for r in fleet if r["reward"] == 0.0),
        "single_rewards": sorted(Counter(r["reward"] for r in single).items()),
        "fleet_final_rewards": sorted(Counter(final.values()).items(), key=str),
        "rewards_identical": sorted(map(str, (r["reward"] for r in single)))
        == sorted(map(str, final.values())),
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("lab/bench/results/fleet"))
    args = parser.parse_args()
    print(json.dumps(run(args.trials, args.out), indent=1))


if __name__ == "__main__":
    main()

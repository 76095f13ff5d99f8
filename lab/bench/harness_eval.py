"""Harness eval result: SmolLM2-135M-Instruct on a few catalog tasks, pass@1, pass@K and the
pairwise-selected accuracy over K candidates, side by side.

    python -m lab.bench.harness_eval --out lab/bench/results/harness_eval.json

Starts `sandgym serve --backend local` on a free port, runs the real `sandgym eval` CLI (K
sampled attempts per task, then a pairwise self-verification knockout judged by the same model)
and writes its JSON report with the command, the commit and the wall time. `judge_check` and
`note` are computed from the report's own brackets (`judge_check`), never typed in: how often
the judge's reply began with A or B, and in how many tasks the knockout kept attempt 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from lab.bench.report import save_json, start_run

REPO = Path(__file__).resolve().parents[2]
# copy-file: the one family the base model sometimes solves (lab.bench.train_probe: ~9/64 sampled)
DEFAULT_TASKS = ["builtin/copy-file", "builtin/hello-file"]


def judge_check(report: dict) -> dict:
    """What the pairwise judge did, from the brackets of `sandgym eval --select pairwise`."""
    letters = {"A": 0, "B": 0, "other": 0}
    tasks = kept_first = comparisons = challenger_wins = 0
    for task in report.get("tasks", []):
        selection = task.get("selection") or {}
        if not selection:
            continue
        tasks += 1
        kept_first += selection.get("selected_attempt") == 0
        for match in selection.get("bracket", []):
            comparisons += 1
            challenger_wins += match.get("winner") == match.get("b")
            for reply in match.get("replies", []):
                first = reply.strip()[:1].upper()
                letters[first if first in ("A", "B") else "other"] += 1
    return {
        "judge_replies": letters,
        "comparisons": comparisons,
        "challenger_wins": challenger_wins,
        "tasks": tasks,
        "kept_attempt_0": kept_first,
    }


def judge_note(check: dict) -> str:
    """One sentence saying what the judge's figures mean, made from `judge_check`."""
    n = sum(check["judge_replies"].values())
    a, b = check["judge_replies"]["A"], check["judge_replies"]["B"]
    text = (
        f"the judge's replies began with A in {a} of {n} (B: {b}); the challenger (which must "
        f"win in both orders) won {check['challenger_wins']} of {check['comparisons']} "
        f"comparisons; the knockout kept attempt 0 in {check['kept_attempt_0']} of "
        f"{check['tasks']} tasks"
    )
    if check["comparisons"] and check["challenger_wins"] == 0:
        text += (
            ": with no challenger winning, pairwise-selected is the success of attempt 0 "
            "(expected value: pass@1) and measures no verification ability of this judge"
        )
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="lab/bench/results/harness_eval.json")
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS)
    ap.add_argument("--attempts", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()
    start_run(shlex.join(["python", "-m", "lab.bench.harness_eval", *sys.argv[1:]]))

    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import ServerProcess

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    # a loaded CPU can take minutes per generation batch: do not let the server end idle episodes
    env = {"SANDGYM_IDLE_TIMEOUT_S": "7200", "SANDGYM_EPISODE_TIME_LIMIT_S": "7200"}
    server = ServerProcess("local", env=env, startup_timeout_s=120)
    try:
        episodes = Path(args.out).with_suffix(".episodes.jsonl")
        episodes.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "sandgym.cli", "eval"]
        cmd += ["--server-url", server.url, "--tasks", *args.tasks]
        cmd += ["--agent", "llm", "--model", args.model, "--attempts", str(args.attempts)]
        cmd += ["--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens)]
        # every episode at once: each turn is one batched generate call
        concurrency = str(args.attempts * len(args.tasks))
        cmd += ["--temperature", str(args.temperature), "--concurrency", concurrency]
        cmd += ["--select", "pairwise", "--json", "--out", str(episodes)]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)  # progress: stderr
        wall_s = time.monotonic() - t0
        if proc.returncode != 0:
            return proc.returncode
        report = json.loads(proc.stdout)
    finally:
        server.stop()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    k = args.attempts
    check = judge_check(report)
    result = {
        "model": "SmolLM2-135M-Instruct" if args.model == "smollm2" else args.model,
        "backend": "local",
        "tasks": args.tasks,
        "attempts": k,
        "summary": {
            "pass@1": report.get("pass@1"),
            f"pass@{k}": report.get(f"pass@{k}"),
            f"pairwise_selected@{k}": report.get("selected"),
        },
        "report": report,
        "judge_check": check,
        "note": judge_note(check),
        "command": " ".join(cmd[1:]),
        "commit": commit,
        "wall_s": round(wall_s, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_at_start": load_at_start,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
    }
    save_json(result, Path(args.out))
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`sandgym plot RUN_DIR`: the reward curve of a run (training batches and held-out evals)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sandgym.trainer.metrics import read_metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory written by `sandgym train`")
    parser.add_argument("--out", help="PNG path (default RUN_DIR/reward.png)")
    parser.add_argument("--json", action="store_true", help="print {png, points} as JSON")


def plot_run(run_dir: Path, out: Path) -> dict[str, int]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    train = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    evals = [(r["step"], r["eval/reward_mean"]) for r in rows if "eval/reward_mean" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train, strict=True), marker=".", label="training batch mean reward")
    if evals:
        ax.plot(*zip(*evals, strict=True), marker="o", linestyle="--", label="held-out (greedy)")
    # lab.bench.train_demo's sampled held-out evaluation (before and after), with +-1 standard error
    sampled_path = Path(run_dir) / "sampled_eval.json"
    sampled = json.loads(sampled_path.read_text()) if sampled_path.exists() else {}
    last = train[-1][0] if train else 0
    ends: list[tuple[int, dict[str, Any]]] = [
        (x, e) for x, e in ((0, sampled.get("before")), (last, sampled.get("after"))) if e
    ]
    if ends:
        ax.errorbar(
            [x for x, _ in ends],
            [e["mean_reward"] for _, e in ends],
            yerr=[e.get("stderr") or 0.0 for _, e in ends],
            marker="s",
            linestyle=":",
            capsize=4,
            label=f"held-out (sampled, T={ends[0][1].get('temperature')}, +-1 se)",
        )
    ax.set_xlabel("policy update")
    ax.set_ylabel("reward")
    ax.set_title(f"sandgym: {Path(run_dir).name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return {"train_points": len(train), "eval_points": len(evals), "sampled_points": len(ends)}


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        print(
            f"sandgym plot: {run_dir} has no metrics.jsonl (not a run directory?)", file=sys.stderr
        )
        return 2
    out = Path(args.out) if args.out else run_dir / "reward.png"
    points = plot_run(run_dir, out)
    if args.json:
        print(json.dumps({"png": str(out), **points}))
    else:
        print(f"wrote {out}", file=sys.stderr)
    return 0

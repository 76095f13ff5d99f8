"""Training demo: SmolLM2-135M-Instruct, GRPO on CPU, reward on held-out seeds before and after.

    python -m bench.train_demo --out bench/results/train_demo.json

Starts `sandgym serve --backend local` on a free port (unless `--server-url` is given), runs
`trainer/configs/demo.yaml` through the real trainer (Ray rollout actor + learner), evaluates
the greedy policy on the held-out seeds before the first and after the last update, and writes
a JSON record (rewards, throughput, the exact command) plus the reward-curve PNG beside it.

Greedy decoding of a task whose instruction is the same for every seed gives nearly the same
reply on every seed, so the greedy figure is close to all-or-nothing. The headline figure is
therefore a *sampled* held-out evaluation (`--eval-seeds` seeds disjoint from the training
seeds, `--eval-samples` episodes each, at the training temperature, fixed torch seed), of the
base model before training and of the final checkpoint after it, with its standard error and a
95% interval (`heldout_sampled`; kept in RUN_DIR/sampled_eval.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandgym_cli", "serve", "--backend", "local", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, f"ws://127.0.0.1:{port}/v1/env"
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("sandgym serve did not answer /healthz within 120 s")


def summarize(run_dir: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The demo record, read from the run directory's files (so an interrupted run can be
    summarised too: `updates` then says how far it got and `heldout_reward_after` is None)."""
    from trainer.episode import read_episodes
    from trainer.metrics import read_metrics

    rows = read_metrics(run_dir)
    train = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/reward_mean" in r]
    before = [r for r in evals if r["step"] == 0]
    after = [r for r in evals if train and r["step"] == train[-1]["step"] and r["step"] > 0]
    episodes = read_episodes(run_dir / "episodes.jsonl")
    terminations: dict[str, int] = {}
    for e in episodes:
        terminations[e["termination"]] = terminations.get(e["termination"], 0) + 1
    t0 = min((e["started_at"] for e in episodes), default=0.0)
    wall_s = (train[-1]["time"] - t0) if train and episodes else 0.0
    gen_tokens = sum(int(e["metrics"].get("generated_tokens", 0)) for e in episodes)
    learner_tps = [r["learner/tokens_per_s"] for r in train if r.get("learner/tokens_per_s")]
    return {
        "command": "python -m bench.train_demo " + " ".join(sys.argv[1:]),
        "config": config,
        "updates": train[-1]["step"] if train else 0,
        "heldout_sampled": _read_sampled(run_dir),
        "heldout_reward_before": before[0]["eval/reward_mean"] if before else None,
        "heldout_reward_after": after[-1]["eval/reward_mean"] if after else None,
        "heldout_episodes_each": before[0]["eval/episodes"] if before else None,
        "train_reward_by_update": [r["reward/mean"] for r in train],
        "groups_with_signal": sum(1 for r in train if r.get("batch/samples", 0) > 0),
        "episodes": len(episodes),
        "terminations": terminations,
        "wall_s": wall_s,
        "episodes_per_min": 60.0 * len(episodes) / wall_s if wall_s else None,
        "generated_tokens_per_s": gen_tokens / wall_s if wall_s else None,
        "learner_tokens_per_s_mean": sum(learner_tps) / len(learner_tps) if learner_tps else None,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        # the commit the run started from (written by `run`), not the one summarising it
        "code_commit": _read_text(run_dir / "code_commit.txt"),
    }


def _read_text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def _git_head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def sampled_eval(cfg: Any, model_dir: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """Held-out sampled evaluation of the base model (`model_dir` None) or a checkpoint."""
    import asyncio

    from bench.train_probe import play_episodes, reward_stats

    if model_dir is not None:
        cfg = cfg.model_copy(
            update={"model": cfg.model.model_copy(update={"source": "hf", "path": model_dir})}
        )
    tasks = cfg.env.eval_task_ids or cfg.env.task_ids
    jobs = [
        (t, args.eval_seed_start + i)
        for t in tasks
        for i in range(args.eval_seeds)
        for _ in range(args.eval_samples)
    ]
    t0 = time.monotonic()
    eps = asyncio.run(play_episodes(cfg, jobs, sample_seed=args.eval_sample_seed))
    return {
        **reward_stats(eps),
        "model": model_dir or cfg.model.source,
        "temperature": cfg.sampling.temperature,
        "seeds": [args.eval_seed_start, args.eval_seed_start + args.eval_seeds - 1],
        "samples_per_seed": args.eval_samples,
        "wall_s": time.monotonic() - t0,
        "generated_tokens": sum(int(e.metrics.get("generated_tokens", 0)) for e in eps),
    }


def _read_sampled(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "sampled_eval.json"
    return json.loads(path.read_text()) if path.exists() else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(REPO / "trainer/configs/demo.yaml"))
    parser.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--server-url", help="use a running env server instead of starting one")
    parser.add_argument("--run-dir", default="runs/train_demo", help="run directory (fresh)")
    parser.add_argument("--out", help="write the JSON record here (and the PNG beside it)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--eval-seeds", type=int, default=32, help="held-out seeds (sampled eval)")
    parser.add_argument("--eval-seed-start", type=int, default=100_000, help="first held-out seed")
    parser.add_argument("--eval-samples", type=int, default=2, help="sampled episodes per seed")
    parser.add_argument("--eval-sample-seed", type=int, default=1234, help="torch sampling seed")
    parser.add_argument("--no-sampled-eval", action="store_true", help="skip the sampled eval")
    parser.add_argument(
        "--summarize-only", action="store_true", help="only summarise an existing --run-dir"
    )


def _write(record: dict[str, Any], run_dir: Path, args: argparse.Namespace) -> None:
    from trainer.plot_cli import plot_run

    png = run_dir / "reward.png"
    plot_run(run_dir, png)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        shutil.copy(png, out.with_suffix(".png"))
    print(json.dumps(record) if args.json else json.dumps(record, indent=2))


def run(args: argparse.Namespace) -> int:
    import yaml

    from trainer.config import load_config
    from trainer.train import Trainer

    run_dir = Path(args.run_dir)
    if args.summarize_only:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        _write(summarize(run_dir, config), run_dir, args)
        return 0
    server = None
    url = args.server_url
    if url is None:
        server, url = _start_server()
    try:
        overrides = [f'env.server_urls=["{url}"]', "run.eval_before=true", *args.override]
        cfg = load_config(args.config, overrides)
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a demo measures from scratch, never from a resume
        if cfg.env.seed_start + 10_000 > args.eval_seed_start:
            raise SystemExit("--eval-seed-start must lie well above the training seeds")
        sampled: dict[str, Any] = {}
        if not args.no_sampled_eval:
            sampled["before"] = sampled_eval(cfg, None, args)
            print(json.dumps({"sampled_eval_before": sampled["before"]}), file=sys.stderr)
        run_dir.mkdir(parents=True)
        (run_dir / "code_commit.txt").write_text(f"{_git_head()}\n")
        trainer = Trainer(cfg, run_dir)
        try:
            trainer.run()
        finally:
            trainer.shutdown()
        if not args.no_sampled_eval:
            latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
            sampled["after"] = sampled_eval(cfg, latest["path"], args)
            sampled["delta"] = sampled["after"]["mean_reward"] - sampled["before"]["mean_reward"]
            (run_dir / "sampled_eval.json").write_text(json.dumps(sampled, indent=2))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    _write(summarize(run_dir, cfg.model_dump(mode="json")), run_dir, args)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())

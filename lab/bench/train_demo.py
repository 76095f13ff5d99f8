"""Training demo: SmolLM2-135M-Instruct, GRPO on CPU; held-out seeds and a held-out family.

    python -m lab.bench.train_demo --out lab/bench/results/train_demo.json

Starts `sandgym serve --backend local` on a free port (unless `--server-url` is given), runs
`sandgym/trainer/configs/demo.yaml` through the real trainer (Ray rollout actor + learner) on a
procedural family whose instruction changes with the seed (`builtin/file-ops`), and evaluates
the base model before and the final checkpoint after training, sampled at the training
temperature with a fixed torch seed:

- on held-out seeds of the trained family (`--eval-seeds` seeds from `--eval-seed-start`,
  `--eval-samples` episodes each); every held-out episode's instruction is checked to differ
  from every training episode's instruction (`lab.bench.demo_stats.check_heldout_disjoint`), and the
  result is recorded (`heldout_instruction_check`);
- on a family never trained on (`--transfer-tasks`, default `heldout-ops`, lab/bench/tasks: chores
  worded as no training family words them, plus an operation none asks, making a file
  executable); `lab.bench.demo_stats.check_heldout_novel` checks against the training episodes'
  instructions that no held-out wording (template) and at least one held-out operation occurred
  in training (`transfer_novelty_check`).

Every before/after difference carries a seed-level interval (`seed_level`: the per-seed mean
after minus before on the same held-out seeds, a cluster bootstrap over seeds and an exact
sign-flip test): episodes of one seed share an instance and are not independent.

It writes the JSON record (every field computed here, the `summary` sentence included, built
by `lab.bench.demo_stats.summary_text` from the measured values), the reward-curve PNG, and the raw
episodes (training and evaluation, without token ids) as `<out stem>_episodes.jsonl.gz`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from lab.bench.train_probe import heldout_server
from sandgym.trainer.config import load_config
from sandgym.trainer.episode import read_episodes
from sandgym.trainer.metrics import read_metrics
from sandgym.trainer.train import Trainer

REPO = Path(__file__).resolve().parents[2]


def summarize(run_dir: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trainer's side of the record, read from the run directory's files (so an interrupted
    run can be summarised too: `updates` then says how far it got)."""

    rows = read_metrics(run_dir)
    train = [r for r in rows if "reward/mean" in r]
    episodes = read_episodes(run_dir / "episodes.jsonl")
    terminations: dict[str, int] = {}
    for e in episodes:
        terminations[e["termination"]] = terminations.get(e["termination"], 0) + 1
    t0 = min((e["started_at"] for e in episodes), default=0.0)
    wall_s = (train[-1]["time"] - t0) if train and episodes else 0.0
    gen_tokens = sum(int(e["metrics"].get("generated_tokens", 0)) for e in episodes)
    learner_tps = [r["learner/tokens_per_s"] for r in train if r.get("learner/tokens_per_s")]
    return {
        # the command that ran the demo (kept in the run directory: --summarize-only reuses it)
        "command": _read_text(run_dir / "command.txt"),
        "config": config,
        "updates": train[-1]["step"] if train else 0,
        "num_updates_configured": (config or {}).get("run", {}).get("num_updates"),
        "stopped_early": bool(_read_json(run_dir / "summary.json").get("stopped_early")),
        "training_seeds": sorted({int(e["seed"]) for e in episodes if e.get("seed") is not None}),
        "train_reward_by_update": [r["reward/mean"] for r in train],
        "groups_with_signal": sum(1 for r in train if r.get("batch/samples", 0) > 0),
        "episodes": len(episodes),
        "train_successes": sum(1 for e in episodes if e.get("reward", 0.0) >= 1.0),
        "terminations": terminations,
        "training_wall_s": wall_s,
        "episodes_per_min": 60.0 * len(episodes) / wall_s if wall_s else None,
        "generated_tokens_per_s": gen_tokens / wall_s if wall_s else None,
        "learner_tokens_per_s_mean": sum(learner_tps) / len(learner_tps) if learner_tps else None,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        # the commit the run started from (written by `run`), not the one summarising it
        "code_commit": _read_text(run_dir / "code_commit.txt"),
    }


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


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


def sampled_eval(
    cfg: Any, model_dir: str | None, tasks: list[str], args: argparse.Namespace, phase: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sampled episodes of the base model (`model_dir` None) or a checkpoint on `tasks`' held-out
    seeds: per-task statistics, and the episodes as dicts (no token ids) tagged with `phase`."""
    import asyncio

    from lab.bench.train_probe import play_episodes, reward_stats

    if model_dir is not None:
        cfg = cfg.model_copy(
            update={"model": cfg.model.model_copy(update={"source": "hf", "path": model_dir})}
        )
    cfg = cfg.model_copy(
        update={"engine": cfg.engine.model_copy(update={"max_batch_size": args.eval_batch_size})}
    )
    seeds = [args.eval_seed_start + i for i in range(args.eval_seeds)]
    jobs = [(t, s) for t in tasks for s in seeds for _ in range(args.eval_samples)]
    t0 = time.monotonic()
    eps = asyncio.run(play_episodes(cfg, jobs, sample_seed=args.eval_sample_seed))
    wall_s = time.monotonic() - t0
    stats: dict[str, Any] = {}
    for t in tasks:
        mine = [e for e in eps if e.task_id == t]
        stats[t] = {
            **reward_stats(mine),
            "model": model_dir or cfg.model.source,
            "seeds": [seeds[0], seeds[-1]],
            "samples_per_seed": args.eval_samples,
            "generated_tokens": sum(int(e.metrics.get("generated_tokens", 0)) for e in mine),
            "successes_by_commands": _successes_by_commands(mine),
        }
    stats["_wall_s"] = wall_s
    return stats, [{**e.to_dict(with_tokens=False), "phase": phase} for e in eps]


def _successes_by_commands(episodes: list[Any]) -> dict[str, int]:
    """How many successful episodes ran 0, 1, 2, ... commands (look-then-act takes 2+)."""
    out: dict[str, int] = {}
    for e in episodes:
        if e.reward >= 1.0:
            n = sum(
                1
                for t in e.trajectories
                for st in t.steps
                if st.action and st.action.get("kind") == "command"
            )
            out[str(n)] = out.get(str(n), 0) + 1
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(REPO / "sandgym/trainer/configs/demo.yaml"))
    parser.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--server-url", help="use a running env server instead of starting one")
    parser.add_argument("--run-dir", default="runs/train_demo", help="run directory (fresh)")
    parser.add_argument("--out", help="write the JSON record here (and the PNG beside it)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument(
        "--transfer-tasks",
        nargs="*",
        default=["heldout-ops"],
        help="never trained on (default heldout-ops: unseen wordings and an unseen operation, "
        "checked against the training instructions)",
    )
    parser.add_argument("--eval-seeds", type=int, default=32, help="held-out seeds (sampled eval)")
    parser.add_argument("--eval-seed-start", type=int, default=100_000, help="first held-out seed")
    parser.add_argument("--eval-samples", type=int, default=2, help="sampled episodes per seed")
    parser.add_argument(
        "--eval-batch-size", type=int, default=16, help="episodes generated together"
    )
    parser.add_argument("--eval-sample-seed", type=int, default=1234, help="torch sampling seed")
    parser.add_argument(
        "--train-budget-s",
        type=float,
        help="stop training cleanly (RUN_DIR/STOP) this many seconds after it starts; the "
        "record then says how many updates were made (stopped_early)",
    )
    parser.add_argument(
        "--summarize-only", action="store_true", help="only summarise an existing --run-dir"
    )


def plot(record: dict[str, Any], out: Path) -> None:
    """Training batch reward per update, and each evaluated task's sampled success before and
    after training (+-1 standard error)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = record.get("train_reward_by_update") or []
    fig, ax = plt.subplots(figsize=(7, 4))
    if rewards:
        ax.plot(range(1, len(rewards) + 1), rewards, marker=".", label="training batch mean reward")
    last = len(rewards)
    for key, style in (("heldout", "s"), ("transfer", "^")):
        for task, res in (record.get(key) or {}).items():
            pts = [(x, res[ph]) for x, ph in ((0, "before"), (last, "after")) if ph in res]
            if pts:
                ax.errorbar(
                    [x for x, _ in pts],
                    [e["mean_reward"] for _, e in pts],
                    yerr=[e.get("stderr") or 0.0 for _, e in pts],
                    marker=style,
                    linestyle=":",
                    capsize=4,
                    label=f"{task} {'held-out seeds' if key == 'heldout' else 'never trained'}",
                )
    ax.set_xlabel("policy update")
    ax.set_ylabel("reward (success rate)")
    ax.set_title(f"sandgym demo, sampled at T={record.get('temperature')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _write(record: dict[str, Any], run_dir: Path, args: argparse.Namespace) -> None:
    png = run_dir / "reward.png"
    plot(record, png)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        shutil.copy(png, out.with_suffix(".png"))
        raw = out.with_name(out.stem + "_episodes.jsonl.gz")
        with gzip.open(raw, "wt", encoding="utf-8") as fh:
            for path in (run_dir / "episodes.jsonl", run_dir / "eval_episodes.jsonl"):
                if path.exists():
                    for line in path.read_text(encoding="utf-8").splitlines():
                        if line.strip():
                            fh.write(json.dumps({**json.loads(line), "phase": "train"}) + "\n")
            for ep in _read_jsonl(run_dir / "sampled_episodes.jsonl"):
                fh.write(json.dumps(ep) + "\n")
            for row in _read_jsonl(run_dir / "metrics.jsonl"):
                fh.write(json.dumps({"phase": "metrics", **row}) + "\n")
    print(json.dumps(record) if args.json else json.dumps(record, indent=2))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def instance_kind(instruction: str) -> str:
    """`look-first` when the instruction gives only a directory and a name prefix (file-ops'
    wording: "... whose name starts/begins with ..."), else `direct` (the file named in full)."""
    return "look-first" if "whose name" in instruction else "direct"


def by_instance_kind(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Success per phase and instance kind, from recorded episodes (dicts)."""
    out: dict[str, Any] = {}
    for e in episodes:
        cell = out.setdefault(e["phase"], {}).setdefault(
            instance_kind(e.get("instruction", "")), {"successes": 0, "episodes": 0}
        )
        cell["episodes"] += 1
        cell["successes"] += int(e.get("reward", 0.0) >= 1.0)
    return out


def operation(instruction: str) -> str:
    """What a path-ops, file-ops or heldout-ops instruction asks, from its wording (the
    generators'): `mkdir`, `touch`, `write`, `delete`, `delete-directory`, `copy`, `move`,
    `rename` or `chmod` (heldout-ops only), with ` (look-first)` when only a directory and a
    name prefix are given."""
    text = instruction.strip()
    if "execut" in text:  # heldout-ops only: never asked in training
        op = "chmod"
    elif "folder" in text:  # heldout-ops' wording of mkdir
        op = "mkdir"
    elif "single word" in text or "just that word" in text:  # heldout-ops' wording of write
        op = "write"
    elif text.startswith("Get rid of") or "should not exist anymore" in text:
        op = "delete"
    elif text.startswith(("Copy", "Make a copy")):
        op = "copy"
    elif text.startswith("Move"):
        op = "move"
    elif text.startswith(("Rename", "Give")):
        op = "rename"
    elif text.startswith(("Delete", "Remove")):
        op = "delete-directory" if "the directory" in text else "delete"
    elif "directory" in text:
        op = "mkdir"
    elif "word" in text:
        op = "write"
    elif "empty file" in text:
        op = "touch"
    else:
        op = "other"
    return f"{op} (look-first)" if instance_kind(text) == "look-first" else op


def by_operation(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Success per task, phase and operation asked, from recorded episodes (dicts)."""
    out: dict[str, Any] = {}
    for e in episodes:
        cell = (
            out.setdefault(e["task_id"], {})
            .setdefault(e["phase"], {})
            .setdefault(operation(e.get("instruction", "")), {"successes": 0, "episodes": 0})
        )
        cell["episodes"] += 1
        cell["successes"] += int(e.get("reward", 0.0) >= 1.0)
    return out


def evaluation_record(
    run_dir: Path, cfg: Any, heldout_tasks: list[str], transfer_tasks: list[str]
) -> dict[str, Any]:
    """The evaluation side of the record: before/after per task with the difference's interval,
    and the held-out instruction check (training instructions read from episodes.jsonl)."""
    from lab.bench.demo_stats import (
        HeldoutOverlapError,
        check_heldout_disjoint,
        check_heldout_novel,
        compare,
        rewards_by_seed,
        seed_level_compare,
    )

    sampled = json.loads((run_dir / "sampled_eval.json").read_text())
    sampled_eps = _read_jsonl(run_dir / "sampled_episodes.jsonl")
    out: dict[str, Any] = {"temperature": cfg.sampling.temperature, "heldout": {}, "transfer": {}}
    for key, tasks in (("heldout", heldout_tasks), ("transfer", transfer_tasks)):
        for t in tasks:
            res = {ph: sampled[ph][t] for ph in ("before", "after") if t in sampled.get(ph, {})}
            if "before" in res and "after" in res:
                res["comparison"] = compare(res["before"], res["after"])
                # the interval that counts: seeds are the sampled unit (lab/bench/demo_stats.py)
                res["seed_level"] = seed_level_compare(
                    rewards_by_seed(sampled_eps, t, "eval-before"),
                    rewards_by_seed(sampled_eps, t, "eval-after"),
                )
            out[key][t] = res
    training = [e.get("instruction", "") for e in _read_jsonl(run_dir / "episodes.jsonl")]
    novel = [e.get("instruction", "") for e in sampled_eps if e["task_id"] in transfer_tasks]
    if transfer_tasks:
        try:
            out["transfer_novelty_check"] = {
                "ok": True,
                **check_heldout_novel(training, novel, operation),
            }
        except HeldoutOverlapError as exc:
            out["transfer_novelty_check"] = {"ok": False, "error": str(exc)}
    heldout = [
        e.get("instruction", "")
        for e in _read_jsonl(run_dir / "sampled_episodes.jsonl")
        if e["task_id"] in heldout_tasks
    ]
    try:
        out["heldout_instruction_check"] = {"ok": True, **check_heldout_disjoint(training, heldout)}
    except HeldoutOverlapError as exc:
        out["heldout_instruction_check"] = {"ok": False, "error": str(exc)}
    out["heldout_by_instance_kind"] = by_instance_kind(
        [
            e
            for e in _read_jsonl(run_dir / "sampled_episodes.jsonl")
            if e["task_id"] in heldout_tasks
        ]
    )
    out["by_operation"] = by_operation(_read_jsonl(run_dir / "sampled_episodes.jsonl"))
    after: dict[str, Any] = {}
    for t in heldout_tasks:
        for k, v in (
            sampled.get("after", {}).get(t, {}).get("successes_by_commands") or {}
        ).items():
            after[k] = after.get(k, 0) + v
    out["successes_by_commands_after"] = after
    out["sampled_eval_wall_s"] = {ph: sampled[ph].get("_wall_s") for ph in ("before", "after")}
    return out


def run(args: argparse.Namespace) -> int:
    from lab.bench.demo_stats import summary_text

    run_dir = Path(args.run_dir)
    overrides = [*args.override]
    if args.summarize_only:
        cfg = load_config(run_dir / "config.yaml", [])
    else:
        server = None
        url = args.server_url
        if url is None:
            server = heldout_server()
            url = server.url
        try:
            cfg = load_config(args.config, [f'env.server_urls=["{url}"]', *overrides])
            heldout_tasks = cfg.env.eval_task_ids or cfg.env.task_ids
            if run_dir.exists():
                shutil.rmtree(run_dir)  # a demo measures from scratch, never from a resume
            if cfg.env.seed_start + 10_000 > args.eval_seed_start:
                raise SystemExit("--eval-seed-start must lie well above the training seeds")
            run_dir.mkdir(parents=True)
            (run_dir / "code_commit.txt").write_text(f"{_git_head()}\n")
            (run_dir / "command.txt").write_text(
                "python -m lab.bench.train_demo " + " ".join(sys.argv[1:]) + "\n"
            )
            tasks = [*heldout_tasks, *args.transfer_tasks]
            sampled: dict[str, Any] = {}
            sampled["before"], eps = sampled_eval(cfg, None, tasks, args, "eval-before")
            with (run_dir / "sampled_episodes.jsonl").open("a") as fh:
                fh.writelines(json.dumps(e) + "\n" for e in eps)
            print(json.dumps({"sampled_eval_before": sampled["before"]}), file=sys.stderr)
            (run_dir / "sampled_eval.json").write_text(json.dumps(sampled, indent=2))
            trainer = Trainer(cfg, run_dir)
            timer = None
            if args.train_budget_s:  # the trainer's own clean stop: checkpoint, then eval after
                timer = threading.Timer(args.train_budget_s, (run_dir / "STOP").touch)
                timer.daemon = True
                timer.start()
            try:
                trainer.run()
            finally:
                if timer is not None:
                    timer.cancel()
                trainer.shutdown()
            latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
            sampled["after"], eps = sampled_eval(cfg, latest["path"], tasks, args, "eval-after")
            with (run_dir / "sampled_episodes.jsonl").open("a") as fh:
                fh.writelines(json.dumps(e) + "\n" for e in eps)
            (run_dir / "sampled_eval.json").write_text(json.dumps(sampled, indent=2))
        finally:
            if server is not None:
                server.stop()
    heldout_tasks = cfg.env.eval_task_ids or cfg.env.task_ids
    record = summarize(run_dir, cfg.model_dump(mode="json"))
    record.update(evaluation_record(run_dir, cfg, heldout_tasks, args.transfer_tasks))
    record["summarized_at_commit"] = _git_head()  # the code that wrote this record
    record["summary"] = summary_text(record)
    _write(record, run_dir, args)
    novelty = record.get("transfer_novelty_check") or {"ok": True}
    return 0 if record["heldout_instruction_check"]["ok"] and novelty["ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())

"""lab.bench.train_probe.reward_stats: the held-out figures the training demo reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lab.bench.train_probe import reward_stats
from sandgym.trainer.episode import Episode, Trajectory


def _ep(reward: float, termination: str = "turn_limit") -> Episode:
    ep = Episode(task_id="builtin/copy-file", seed=0)
    ep.trajectories.append(Trajectory(reward=reward))
    ep.termination = termination  # type: ignore[assignment]
    return ep


def test_mean_stderr_and_interval() -> None:
    eps = [_ep(1.0)] * 3 + [_ep(0.0)] * 5
    s = reward_stats(eps)
    assert s["episodes"] == 8 and s["successes"] == 3
    assert math.isclose(s["mean_reward"], 3 / 8)
    # sample std of 3 ones and 5 zeros, over sqrt(n)
    var = (3 * (1 - 3 / 8) ** 2 + 5 * (3 / 8) ** 2) / 7
    assert math.isclose(s["stderr"], math.sqrt(var / 8))
    lo, hi = s["success_ci95"]
    assert 0.0 < lo < 3 / 8 < hi < 1.0


def test_infra_failures_are_not_scored() -> None:
    eps = [_ep(1.0), _ep(0.0, "sandbox_lost"), _ep(0.0)]
    s = reward_stats(eps)
    assert s["episodes"] == 2 and s["infra_failures"] == 1
    assert s["mean_reward"] == 0.5
    assert s["terminations"] == {"turn_limit": 2, "sandbox_lost": 1}


def test_all_zero_interval_starts_at_zero() -> None:
    s = reward_stats([_ep(0.0)] * 16)
    assert s["mean_reward"] == 0.0 and s["stderr"] == 0.0
    lo, hi = s["success_ci95"]
    assert math.isclose(lo, 0.0, abs_tol=1e-12) and 0.1 < hi < 0.3


def test_demo_summary_reads_the_run_dir(tmp_path: Path) -> None:
    """lab.bench.train_demo.summarize: training figures, the command and the starting commit."""
    from lab.bench.train_demo import summarize
    from sandgym.trainer.episode import EpisodeWriter

    rows = [
        {
            "step": 1,
            "time": 10.0,
            "reward/mean": 0.25,
            "batch/samples": 8.0,
            "learner/tokens_per_s": 40.0,
        },
        {
            "step": 2,
            "time": 20.0,
            "reward/mean": 1.0,
            "batch/samples": 0.0,
            "learner/tokens_per_s": 0.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    writer = EpisodeWriter(tmp_path / "episodes.jsonl")
    for reward in (1.0, 0.0):
        ep = _ep(reward)
        ep.started_at = 0.0
        ep.metrics["generated_tokens"] = 30.0
        writer.write(ep)
    writer.close()
    (tmp_path / "code_commit.txt").write_text("abc1234\n")
    (tmp_path / "command.txt").write_text("python -m lab.bench.train_demo --out x.json\n")
    rec = summarize(tmp_path)
    assert rec["updates"] == 2 and rec["code_commit"] == "abc1234"
    assert rec["command"] == "python -m lab.bench.train_demo --out x.json"
    assert rec["groups_with_signal"] == 1 and rec["learner_tokens_per_s_mean"] == 40.0
    assert rec["episodes"] == 2 and rec["train_successes"] == 1
    assert math.isclose(rec["generated_tokens_per_s"], 60 / 20)


def test_plot_shows_the_sampled_eval(tmp_path: Path) -> None:
    from sandgym.trainer.plot_cli import plot_run

    rows = [
        {"step": 1, "time": 1.0, "reward/mean": 0.5},
        {"step": 2, "time": 2.0, "reward/mean": 1},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_run(tmp_path, tmp_path / "a.png")["sampled_points"] == 0
    sampled = {
        "before": {"mean_reward": 0.1, "stderr": 0.04, "temperature": 0.5},
        "after": {"mean_reward": 0.9, "stderr": 0.02, "temperature": 0.5},
    }
    (tmp_path / "sampled_eval.json").write_text(json.dumps(sampled))
    assert plot_run(tmp_path, tmp_path / "b.png")["sampled_points"] == 2
    assert (tmp_path / "b.png").stat().st_size > 0

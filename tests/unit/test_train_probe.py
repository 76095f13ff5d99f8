"""bench.train_probe.reward_stats: the held-out figures the training demo reports."""

from __future__ import annotations

import math

from bench.train_probe import reward_stats
from trainer.episode import Episode, Trajectory


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

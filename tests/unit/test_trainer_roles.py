"""Per-role advantages over multi-role groups (pure data, no server)."""

from __future__ import annotations

import pytest

from sandgym.trainer.algorithms import AlgorithmError
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.episode import Episode, Step, Trajectory
from sandgym.trainer.roles import parse_judgement, role_advantages, role_samples


def _traj(role: str, reward: float, tok: int) -> Trajectory:
    step = Step([1, 2], [tok, tok], [-1.0, -1.0], [1, 1])
    return Trajectory(role, [step], reward)


def _ep(solver: float, judge: float | None, i: int) -> Episode:
    trajs = [_traj("solver", solver, 10 + i)]
    if judge is not None:
        trajs.append(_traj("judge", judge, 50 + i))
    return Episode("t", i, trajs)


def test_each_role_is_normalised_over_its_own_trajectories() -> None:
    group = [_ep(1.0, 1.0, 0), _ep(0.0, 1.0, 1), _ep(0.0, 0.0, 2), _ep(1.0, None, 3)]
    (advs,) = role_advantages([group], {"solver": "rloo", "judge": "grpo"}, "grpo")
    # solver rloo over [1, 0, 0, 1]: r_i - mean(others)
    assert [a["solver"] for a in advs] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # judge grpo over its own three trajectories [1, 1, 0]; episode 3 has no judge
    assert "judge" not in advs[3]
    assert advs[0]["judge"] == pytest.approx(advs[1]["judge"]) and advs[0]["judge"] > 0
    assert advs[2]["judge"] < 0
    samples = role_samples([group], {"solver": "rloo", "judge": "grpo"}, "grpo")
    by_tok = {s.input_ids[2]: s.advantage for s in samples}
    assert by_tok[10] == pytest.approx(2 / 3) and by_tok[52] == pytest.approx(advs[2]["judge"])
    assert len(samples) == 7


def test_unnamed_roles_use_the_default_and_reinforce_pp_whitens_per_role() -> None:
    groups = [[_ep(1.0, 0.0, 0), _ep(0.0, 1.0, 1)], [_ep(1.0, 1.0, 2), _ep(1.0, 0.0, 3)]]
    advs = role_advantages(groups, {"judge": "reinforce_pp"}, "reinforce")
    assert [a["solver"] for g in advs for a in g] == [1.0, 0.0, 1.0, 1.0]
    judge = [a["judge"] for g in advs for a in g]
    assert sum(judge) == pytest.approx(0.0, abs=1e-6)


def test_duplicate_role_in_one_episode_is_refused() -> None:
    ep = Episode("t", 0, [_traj("solver", 1.0, 1), _traj("solver", 0.0, 2)])
    with pytest.raises(AlgorithmError, match="2 trajectories of role 'solver'"):
        role_advantages([[ep]], {}, "grpo")


def test_parse_judgement_and_config_roles() -> None:
    assert parse_judgement("PASS.") is True
    assert parse_judgement("it will fail") is False
    assert parse_judgement("unsure") is None
    cfg = TrainConfig.model_validate(
        {"env": {"task_ids": ["t"]}, "algorithm": {"roles": {"solver": "grpo", "judge": "rloo"}}}
    )
    assert cfg.algorithm.roles == {"solver": "grpo", "judge": "rloo"}
    with pytest.raises(ValueError):
        TrainConfig.model_validate(
            {"env": {"task_ids": ["t"]}, "algorithm": {"roles": {"judge": "ppo"}}}
        )


def test_role_metrics_report_each_role_over_the_batch() -> None:
    from sandgym.trainer.roles import role_metrics

    groups = [[_ep(1.0, 1.0, 0), _ep(0.0, 1.0, 1)], [_ep(0.0, 0.0, 2), _ep(1.0, None, 3)]]
    assert role_metrics(groups) == {
        "role/solver/reward_mean": 0.5,
        "role/solver/trajectories": 4.0,
        "role/judge/reward_mean": pytest.approx(2 / 3),
        "role/judge/trajectories": 3.0,
    }

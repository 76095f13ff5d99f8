"""Trainer configs, episode records and the plot command (no model, no Ray)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sandgym.trainer.config import ConfigError, TrainConfig, describe_fields, load_config
from sandgym.trainer.episode import Episode, EpisodeWriter, Step, Trajectory, read_episodes

CONFIGS = Path(__file__).resolve().parents[2] / "sandgym" / "trainer" / "configs"


@pytest.mark.parametrize("name", ["smoke.yaml", "demo.yaml"])
def test_shipped_configs_validate(name: str) -> None:
    cfg = load_config(CONFIGS / name)
    assert cfg.env.task_ids and cfg.run.num_updates >= 2


def test_overrides_parse_yaml_scalars_and_lists() -> None:
    cfg = load_config(
        CONFIGS / "smoke.yaml",
        [
            "algorithm.estimator=rloo",
            "learner.num_workers=2",
            'env.server_urls=["ws://a/v1/env","ws://b/v1/env"]',
        ],
    )
    assert cfg.algorithm.estimator == "rloo" and cfg.learner.num_workers == 2
    assert cfg.env.server_urls == ["ws://a/v1/env", "ws://b/v1/env"]


def test_invalid_configs_name_the_field() -> None:
    with pytest.raises(ConfigError, match="estimator"):
        load_config(CONFIGS / "smoke.yaml", ["algorithm.estimator=ppo"])
    with pytest.raises(ConfigError, match="lernr"):
        load_config(CONFIGS / "smoke.yaml", ["lernr.lr=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(CONFIGS / "smoke.yaml", ["learner.lr"])
    with pytest.raises(ConfigError, match="task_ids"):
        load_config(None)


def test_every_field_is_described() -> None:
    lines = describe_fields()
    assert len(lines) > 60
    assert not [line for line in lines if ": None (default" in line]
    assert any(line.startswith("algorithm.estimator: ") for line in lines)


def test_episode_jsonl_roundtrip(tmp_path: Path) -> None:
    ep = Episode(
        "builtin/x",
        3,
        [Trajectory(steps=[Step([1, 2], [3], [-0.5], [1], action={"kind": "submit"})], reward=1.0)],
        termination="submitted",
        group_id="g3",
    )
    w = EpisodeWriter(tmp_path / "episodes.jsonl", with_tokens=True)
    w.write(ep, version=2)
    w.close()
    (rec,) = read_episodes(tmp_path / "episodes.jsonl")
    assert rec["reward"] == 1.0 and rec["version"] == 2
    rec.pop("version")
    back = Episode.from_dict(rec)
    assert back.trajectories[0].steps[0].response_ids == [3] and back.reward == 1.0
    short = ep.to_dict(with_tokens=False)
    assert "prompt_ids" not in short["trajectories"][0]["steps"][0]


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sandgym.trainer import plot_cli

    rows = [{"step": i, "reward/mean": i / 10} for i in range(1, 4)]
    rows.append({"step": 3, "eval/reward_mean": 0.5})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    parser = argparse.ArgumentParser()
    plot_cli.add_arguments(parser)
    assert plot_cli.run(parser.parse_args([str(tmp_path), "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["train_points"] == 3 and out["eval_points"] == 1
    assert Path(out["png"]).read_bytes()[:4] == b"\x89PNG"
    assert plot_cli.run(parser.parse_args([str(tmp_path / "nope")])) == 2


def test_train_cli_dry_run_and_help_config(capsys: pytest.CaptureFixture[str]) -> None:
    from sandgym.cli import main

    assert (
        main(
            ["train", str(CONFIGS / "smoke.yaml"), "-o", "run.num_updates=5", "--dry-run", "--json"]
        )
        == 0
    )
    cfg = TrainConfig.model_validate(json.loads(capsys.readouterr().out))
    assert cfg.run.num_updates == 5
    assert main(["train", "--help-config"]) == 0
    assert "learner.micro_batch_size" in capsys.readouterr().out
    assert main(["train", str(CONFIGS / "smoke.yaml"), "-o", "agent.max_turns=0"]) == 2


def test_pass_at_k_unbiased_estimator() -> None:
    from sandgym.trainer.eval_cli import pass_at_k

    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(2, 1, 4) is None


def test_harness_agents_play_single_role_episodes_only() -> None:
    cfg = load_config(CONFIGS / "smoke.yaml", ["agent.kind=harness"])
    assert cfg.agent.kind == "harness" and cfg.agent.harness_timeout_s > 0
    with pytest.raises(ConfigError, match="agent.kind harness plays single-role episodes"):
        load_config(CONFIGS / "smoke.yaml", ["agent.kind=harness", "agent.workflow=solver_judge"])

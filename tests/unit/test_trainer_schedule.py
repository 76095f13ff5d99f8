"""Long runs (issue 31, item 4): the schedule continues across a resume, training and evaluation
seeds never meet, engines are not re-seeded identically, checkpoints are kept to a number, and a
checkpoint whose weights `save_pretrained` sharded is read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandgym.trainer.config import ConfigError, TrainConfig, load_config
from sandgym.trainer.schedule import (
    engine_seed,
    prune_checkpoints,
    read_schedule,
    training_seed,
    write_schedule,
)

CONFIGS = Path(__file__).resolve().parents[2] / "sandgym" / "trainer" / "configs"


def test_training_seeds_never_reach_evaluation_seeds() -> None:
    cfg = load_config(CONFIGS / "smoke.yaml", ["env.eval_seeds=[3, 5, 10000]", "env.seed_start=2"])
    seeds = [training_seed(cfg.env.seed_start, cfg.env.eval_seeds, g) for g in range(20_000)]
    assert not set(seeds) & set(cfg.env.eval_seeds)
    assert len(set(seeds)) == len(seeds)  # every group its own seed
    assert seeds[:5] == [2, 4, 6, 7, 8]
    # the default config: training used to reach the default evaluation seed 10000 at group 10000
    default = TrainConfig.model_validate({"env": {"task_ids": ["t"]}})
    assert training_seed(0, default.env.eval_seeds, 10_000) not in default.env.eval_seeds
    with pytest.raises(ConfigError, match="eval_seeds repeats"):
        load_config(CONFIGS / "smoke.yaml", ["env.eval_seeds=[7, 7]"])


def test_the_trainer_schedules_training_seeds_disjoint_from_evaluation(tmp_path: Path) -> None:
    from sandgym.trainer.train import Trainer

    cfg = load_config(CONFIGS / "smoke.yaml", ["env.eval_seeds=[0, 1]"])
    trainer = Trainer(cfg, tmp_path / "run")
    assert [trainer._group_task(g)[1] for g in range(3)] == [2, 3, 4]


class _FakeLearners:
    """What `Trainer._checkpoint` asks of the learners: `save(path)` as the real ones write it."""

    def __init__(self, version: int) -> None:
        self.version = version

    def save(self, path: str) -> None:
        out = Path(path)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"")
        (out.parent / "latest.json").write_text(
            json.dumps({"path": str(out), "version": self.version})
        )


def test_a_checkpoint_records_the_schedule_and_old_ones_are_pruned(tmp_path: Path) -> None:
    from sandgym.trainer.learner import latest_checkpoint
    from sandgym.trainer.train import Trainer

    cfg = load_config(CONFIGS / "smoke.yaml", ["run.keep_checkpoints=2"])
    trainer = Trainer(cfg, tmp_path / "run")
    for version, next_group in ((1, 3), (2, 7), (3, 11)):
        trainer.version = version
        trainer.learners = _FakeLearners(version)  # type: ignore[assignment]
        trainer._checkpoint(next_group)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step_000002", "step_000003"]
    path, version = latest_checkpoint(tmp_path / "run")  # type: ignore[misc]
    # a resumed run continues at group 11, not at group 0
    assert read_schedule(path, version, cfg.algorithm.groups_per_update) == 11
    # a checkpoint written without a schedule: at least the groups its updates consumed
    assert read_schedule(tmp_path, 4, 2) == 8
    write_schedule(tmp_path, 9, 4)
    assert read_schedule(tmp_path, 4, 2) == 9


def test_prune_keeps_the_latest_and_zero_keeps_all(tmp_path: Path) -> None:
    for v in (1, 2, 3):
        (tmp_path / f"step_{v:06d}").mkdir()
    # latest.json names an older step (a resumed run that has not saved yet): it stays
    (tmp_path / "latest.json").write_text(json.dumps({"path": str(tmp_path / "step_000001")}))
    assert prune_checkpoints(tmp_path, 0) == []
    removed = prune_checkpoints(tmp_path, 1)
    assert [Path(p).name for p in removed] == ["step_000002"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "step_000001",
        "step_000003",
    ]


def test_engine_seeds_differ_across_restarts_and_replacements() -> None:
    seeds = {
        engine_seed(0, worker, start, restart)
        for worker in range(4)
        for start in (0, 5, 10)
        for restart in range(3)
    }
    assert len(seeds) == 36
    assert engine_seed(0, 1, 5, 0) == engine_seed(0, 1, 5, 0)


@pytest.fixture(scope="module")
def learner_cfg(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        "env": {"task_ids": ["t"]},
        "model": {"source": "tiny", "tiny_hidden": 32, "tiny_heads": 2},
        "learner": {"lr": 1e-2},
        "run": {"output_dir": str(tmp_path_factory.mktemp("runs"))},
    }


def test_resume_reads_a_checkpoint_whose_weights_are_sharded(
    learner_cfg: dict[str, Any], tmp_path: Path
) -> None:
    """A model past `save_pretrained`'s shard size is written as model-0000K-of-0000N files and
    an index; resume used to read model.safetensors only."""
    import torch

    from sandgym.trainer.learner import LearnerWorker

    first = LearnerWorker(learner_cfg, 0, 1)
    first.setup("127.0.0.1", 0)
    with torch.no_grad():
        for p in first.model.parameters():
            p.add_(0.25)
    ckpt = tmp_path / "step_000001"
    first.save_checkpoint(str(ckpt))
    (ckpt / "model.safetensors").unlink()
    first.model.save_pretrained(ckpt, max_shard_size="200KB")  # what a large model gets
    assert len(list(ckpt.glob("model-*-of-*.safetensors"))) > 1
    second = LearnerWorker(learner_cfg, 0, 1)
    second.setup("127.0.0.1", 0)
    assert second.load_checkpoint(str(ckpt)) == 0
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)

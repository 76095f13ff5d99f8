"""Two data-parallel learner workers (real Ray actors, real gloo) stay identical, and resume."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgym.trainer.algorithms import Sample
from sandgym.trainer.config import TrainConfig


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(4, 12)
        ids = [rng.randrange(100, 2000) for _ in range(length)]
        mask = [0, 0] + [1] * (length - 2)
        out.append(Sample(ids, mask, [0.0, 0.0] + [-7.0] * (length - 2), rng.choice([-1.0, 1.0])))
    return out


def test_two_worker_data_parallel_step_keeps_replicas_identical(
    ray_session: None, tmp_path: Path
) -> None:
    from sandgym.trainer.learner import LearnerGroup

    cfg = TrainConfig.model_validate(
        {
            "env": {"task_ids": ["t"]},
            "model": {"source": "tiny", "tiny_hidden": 32, "tiny_heads": 2},
            "learner": {"num_workers": 2, "lr": 1e-2, "micro_batch_size": 2},
        }
    )
    group = LearnerGroup(cfg)
    before = group.checksums()
    assert before[0] == before[1]
    stats = group.train(_samples(7, seed=1))  # odd count: the shards differ in size
    after = group.checksums()
    assert after[0] == after[1], "replicas diverged after an all-reduced step"
    assert after[0] != before[0], "the step did not change the weights"
    assert stats["version"] == 1 and stats["loss_tokens"] > 0 and stats["grad_norm"] > 0

    ckpt = tmp_path / "checkpoints" / "step_000001"
    group.save(str(ckpt))
    assert (ckpt / "model.safetensors").exists() and (ckpt.parent / "latest.json").exists()
    group.train(_samples(4, seed=2))
    assert group.checksums()[0] != after[0]
    assert group.load(str(ckpt)) == 1
    restored = group.checksums()
    assert restored[0] == restored[1] == after[0]
    # an empty batch (every group dropped) advances the version but leaves the weights alone,
    # even though Adam's momentum from the previous step is non-zero
    assert group.train([])["version"] == 2
    assert group.checksums()[0] == after[0]
    group.shutdown()

"""The sharded learner (`learner.strategy: fsdp`): two real Ray actors, real gloo, torch FSDP2.

A 2-worker fsdp group and a single-process replicate learner (the reference, in this process)
take the same update on the same batch; the fsdp ranks hold half of the parameters, gradients
and AdamW moments each, the update equals the reference one, the gathered weights reach an hf
engine, and a sharded checkpoint loads back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.trainer.algorithms import Sample
from sandgym.trainer.config import TrainConfig

torch = pytest.importorskip("torch")


def _config(strategy: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "env": {"task_ids": ["t"]},
            "model": {"source": "tiny", "tiny_hidden": 32, "tiny_heads": 2, "tiny_layers": 2},
            "learner": {
                "num_workers": 2,
                "strategy": strategy,
                "lr": 1e-2,
                "micro_batch_size": 2,
            },
        }
    )


def _samples(seed: int) -> list[Sample]:
    """One long sequence and four short ones: balanced by tokens, one rank gets one micro-batch
    and the other two, so the fsdp rank with fewer runs a zero-loss filler."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, length in enumerate([40, 9, 8, 7, 6]):
        ids = torch.randint(100, 2000, (length,), generator=g).tolist()
        mask = [0, 0] + [1] * (length - 2)
        # behaviour logprobs near the random model's (log 1/49152 = -10.8): ratios near 1, so
        # both advantage signs carry gradient (far below, the negative ones would be clipped)
        old = [0.0, 0.0] + [-10.8] * (length - 2)
        out.append(Sample(ids, mask, old, 1.0 if i % 2 else -1.0))
    return out


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[str, Any]]:
    ray = pytest.importorskip("ray")
    # a private Ray instance (never another developer's running cluster)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    from sandgym.trainer.algorithms import aggregation_norm
    from sandgym.trainer.learner import LearnerGroup, LearnerWorker

    fsdp = LearnerGroup(_config("fsdp"))
    reference = LearnerWorker(_config("replicate").model_dump(), rank=0, world_size=1)
    reference.setup("127.0.0.1", 0)
    initial = reference.state_dict()
    batch = _samples(seed=1)
    stats = {
        "fsdp": fsdp.train(batch),
        "replicate": reference.train(batch, aggregation_norm(batch, reference.loss_settings)),
    }
    yield {"fsdp": fsdp, "reference": reference, "stats": stats, "initial": initial}
    fsdp.shutdown()
    ray.shutdown()


def test_fsdp_ranks_hold_half_of_parameters_gradients_and_optimizer_state(
    groups: dict[str, Any],
) -> None:
    infos = groups["fsdp"].shard_info()
    full = infos[0]["full_params"]
    assert full > 1_000_000  # the tiny Llama: 49152 x 32 tied embedding + 2 blocks
    for info in infos:
        assert info["local_params"] / full == pytest.approx(0.5, abs=0.01)
        assert info["local_grads"] / full == pytest.approx(0.5, abs=0.01)
        # AdamW's two moments per parameter exist after the step, and are sharded too
        assert info["full_optimizer"] == 2 * full
        assert info["local_optimizer"] / info["full_optimizer"] == pytest.approx(0.5, abs=0.01)
    assert sum(i["local_params"] for i in infos) == full
    # the contrast: the replicate learner holds everything
    replicate = groups["reference"].shard_info()
    assert replicate["local_params"] == full and replicate["local_optimizer"] == 2 * full


def test_fsdp_update_equals_replicate_update(groups: dict[str, Any], tmp_path: Path) -> None:
    import ray

    from sandgym.trainer.engines.weight_files import load_weights

    fs, rs = groups["stats"]["fsdp"], groups["stats"]["replicate"]
    assert fs["version"] == rs["version"] == 1
    assert fs["loss_tokens"] == rs["loss_tokens"] > 0
    assert fs["loss_sum"] == pytest.approx(rs["loss_sum"], rel=1e-5, abs=1e-7)
    assert fs["grad_norm"] == pytest.approx(rs["grad_norm"], rel=1e-5)
    fw = load_weights(ray.get(groups["fsdp"].state_dict_ref(str(tmp_path / "w"))))
    rw = groups["reference"].state_dict()
    assert sorted(fw) == sorted(rw)
    err = max(float((fw[k] - rw[k]).abs().max()) for k in rw)
    moved = max(float((rw[k] - groups["initial"][k]).abs().max()) for k in rw)
    # relative L2 error of the update itself (AdamW's first step is ~lr * g/|g|: elementwise,
    # a gradient entry near Adam's eps turns float rounding into up to ~1e-3 of the step)
    delta_err = sum(float((fw[k] - rw[k]).double().norm() ** 2) for k in rw) ** 0.5
    delta = sum(float((rw[k] - groups["initial"][k]).double().norm() ** 2) for k in rw) ** 0.5
    print(f"fsdp vs single-process replicate: max |w diff| {err:.2e}, relative update error "
          f"{delta_err / delta:.2e} (update moved weights by up to {moved:.2e})")  # fmt: skip
    assert moved > 1e-3, "the update did not change the weights"
    assert err < 1e-4, f"fsdp and replicate updates differ by {err}"
    assert delta_err / delta < 1e-4
    # both fsdp ranks gathered the same full weights
    c = groups["fsdp"].checksums()
    assert c[0] == c[1]


def test_gathered_weights_reach_the_engine(groups: dict[str, Any], tmp_path: Path) -> None:
    import ray

    from sandgym.trainer.algorithms import token_logprobs_and_entropy
    from sandgym.trainer.engines import create_engine
    from sandgym.trainer.models import load_model, load_tokenizer

    settings = _config("fsdp").model
    tok = load_tokenizer(settings)
    engine = create_engine(
        "hf",
        model=load_model(settings),
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
    )
    ids = torch.tensor([_samples(seed=3)[0].input_ids])

    def engine_logprobs() -> Any:
        with torch.no_grad():
            return token_logprobs_and_entropy(engine.model, ids, torch.ones_like(ids))[0]

    before = engine_logprobs()
    # the push is a directory of safetensors files rank 0 wrote one gathered tensor at a time
    # (no full state dict held: scripts/fsdp_push_memory.py measures it)
    from sandgym.trainer.engines.weight_files import load_weights, weight_files

    path = ray.get(groups["fsdp"].state_dict_ref(str(tmp_path / "push")))
    assert isinstance(path, str) and weight_files(path)
    engine.update_weights(load_weights(path), 1)
    after = engine_logprobs()
    assert float((after - before).abs().max()) > 1e-3, "the engine's policy did not change"
    # ... and it is the trained policy: the replicate learner's weights give the same logprobs
    ref = load_model(settings)
    ref.load_state_dict(groups["reference"].state_dict())
    with torch.no_grad():
        want = token_logprobs_and_entropy(ref, ids, torch.ones_like(ids))[0]
    assert float((after - want).abs().max()) < 1e-4


def test_sharded_checkpoint_loads_back_weights_and_optimizer(
    groups: dict[str, Any], tmp_path: Path
) -> None:
    group = groups["fsdp"]
    ckpt = tmp_path / "checkpoints" / "step_000001"
    saved = group.checksums()[0]
    group.save(str(ckpt))
    # sharded: one file per rank, no full-weights file
    assert sorted(p.name for p in (ckpt / "dcp").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not (ckpt / "model.safetensors").exists()
    assert (ckpt / "config.json").exists() and (ckpt.parent / "latest.json").exists()
    batch = _samples(seed=2)
    group.train(batch)
    stepped = group.checksums()[0]
    assert stepped != saved
    assert group.load(str(ckpt)) == 1
    restored = group.checksums()
    assert restored[0] == restored[1] == saved
    # the AdamW moments came back too: the same batch gives the same step again
    group.train(batch)
    assert group.checksums()[0] == pytest.approx(stepped, rel=1e-6, abs=1e-6)


def test_strategy_config_default_and_refusals() -> None:
    assert TrainConfig.model_validate({"env": {"task_ids": ["t"]}}).learner.strategy == "replicate"
    with pytest.raises(ValueError, match="lora_rank"):
        TrainConfig.model_validate(
            {"env": {"task_ids": ["t"]}, "learner": {"strategy": "fsdp", "lora_rank": 8}}
        )
    with pytest.raises(ValueError, match="strategy"):
        TrainConfig.model_validate({"env": {"task_ids": ["t"]}, "learner": {"strategy": "zero3"}})

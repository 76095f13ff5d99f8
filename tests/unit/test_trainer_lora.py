"""LoRA: a learner update moves only adapter weights; the hf engine loads the pushed adapter
and generates differently afterwards; checkpoints round-trip the adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from sandgym.trainer.algorithms import Sample, aggregation_norm  # noqa: E402
from sandgym.trainer.config import TrainConfig  # noqa: E402
from sandgym.trainer.engines import create_engine  # noqa: E402
from sandgym.trainer.engines.base import SamplingParams  # noqa: E402
from sandgym.trainer.learner import LearnerWorker  # noqa: E402
from sandgym.trainer.lora import LoraError, is_adapter_state  # noqa: E402
from sandgym.trainer.models import load_model  # noqa: E402


def _cfg(tmp_path: Path) -> dict[str, Any]:
    return {
        "env": {"task_ids": ["t"]},
        "model": {"source": "tiny"},
        "learner": {"lr": 0.05, "lora_rank": 4, "lora_alpha": 8.0, "micro_batch_size": 2},
        "run": {"output_dir": str(tmp_path)},
    }


def test_lora_update_changes_only_adapters_and_the_engine_follows(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    learner = LearnerWorker(cfg, 0, 1)
    info = learner.setup("127.0.0.1", 0)
    trainable = {n for n, p in learner.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert info["params"] > 10 * sum(
        p.numel() for p in learner.model.parameters() if p.requires_grad
    )
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}

    tc = TrainConfig.model_validate(cfg)
    engine = create_engine(
        "hf", model=load_model(tc.model), eos_token_ids=[0], pad_token_id=0, lora=tc.learner
    )
    prompt = list(range(5, 25))
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    (g0,) = engine.generate([prompt], params)

    def logp_777() -> float:
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([prompt])).logits[0, -1]
        return float(torch.log_softmax(logits.float(), -1)[777])

    lp0 = logp_777()

    # push probability up on one continuation: a positive advantage over its tokens
    target = prompt + [777] * 8
    samples = [
        Sample(target, [0] * 20 + [1] * 8, [-11.0] * 28, advantage=1.0),
        Sample(target, [0] * 20 + [1] * 8, [-11.0] * 28, advantage=1.0),
    ]
    learner.loss_settings.clip_high = 1e9  # let the ratio move in a single test step
    for _ in range(3):
        learner.train(samples, aggregation_norm(samples, learner.loss_settings))
    changed = {n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable  # base weights untouched, adapters moved

    adapter = learner.state_dict()
    assert is_adapter_state(adapter) and len(adapter) == len(trainable)
    engine.update_weights(adapter, version=1)
    (g1,) = engine.generate([prompt], params)
    assert engine.version == 1
    assert (g1.token_ids, g1.logprobs) != (g0.token_ids, g0.logprobs)
    assert logp_777() > lp0 + 1e-3  # the engine now leans to what the learner reinforced

    path = learner.save_checkpoint(str(tmp_path / "ckpt"))
    fresh = LearnerWorker(cfg, 0, 1)
    fresh.setup("127.0.0.1", 0)
    assert fresh.load_checkpoint(path) == learner.version
    assert fresh.state_dict().keys() == adapter.keys()
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, adapter[k])


def test_an_adapter_push_into_an_engine_without_adapters_is_refused(tmp_path: Path) -> None:
    tc = TrainConfig.model_validate(_cfg(tmp_path))
    engine = create_engine("hf", model=load_model(tc.model), eos_token_ids=[0], pad_token_id=0)
    with pytest.raises(LoraError, match="no adapters"):
        engine.update_weights({"base_model.model.x.lora_A.weight": torch.zeros(1)}, 1)

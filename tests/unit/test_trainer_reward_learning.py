"""A training run whose weight change comes from reward alone.

A tiny random Llama, the hf engine sampling one-token responses at T=1 with top-k 4, a toy task
whose reward is 1 when the response is one particular token (the policy's third choice: about
one sample in four succeeds), GRPO over groups of 8, entropy and KL coefficients 0. The real pieces, in process: engine sampling with
recorded logprobs, `Episode` -> `episode_to_samples`, GRPO advantages, `LearnerWorker.train`
(AdamW step), weight push to the engine. Asserts that the log-likelihood of the rewarded responses
rises, and, as a control, that zeroed advantages move no weight at all (so nothing but the reward
signal, e.g. an entropy bonus, can make this test pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sandgym.trainer.algorithms import (  # noqa: E402
    Sample,
    aggregation_norm,
    batch_advantages,
    collate,
    episode_to_samples,
    token_logprobs_and_entropy,
)
from sandgym.trainer.config import TrainConfig  # noqa: E402
from sandgym.trainer.engines import create_engine  # noqa: E402
from sandgym.trainer.engines.base import Generation, SamplingParams  # noqa: E402
from sandgym.trainer.engines.sampling import processed_logprobs  # noqa: E402
from sandgym.trainer.episode import Episode, Step, Trajectory  # noqa: E402
from sandgym.trainer.learner import LearnerWorker  # noqa: E402
from sandgym.trainer.models import load_model, load_tokenizer  # noqa: E402

GROUP = 8
STEPS = 6


def _config(tmp_path: Path) -> dict[str, Any]:
    return {
        "env": {"task_ids": ["toy/first-token"]},
        "model": {"source": "tiny", "tiny_hidden": 32, "tiny_heads": 2},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 4, "max_new_tokens": 1},
        "algorithm": {
            "estimator": "grpo",
            "group_size": GROUP,
            "entropy_coef": 0.0,
            "kl_coef": 0.0,
        },
        "learner": {"lr": 1e-2, "micro_batch_size": GROUP},
        "run": {"output_dir": str(tmp_path)},
    }


def _episodes(prompt: list[int], gens: list[Generation], target: int) -> list[Episode]:
    out = []
    for g in gens:
        r = 1.0 if g.token_ids[0] == target else 0.0
        step = Step(prompt, g.token_ids, g.logprobs, [1] * len(g.token_ids), reward=r, done=True)
        out.append(Episode("toy/first-token", 0, [Trajectory("agent", [step], r)]))
    return out


def _loglik(learner: LearnerWorker, samples: list[Sample]) -> float:
    """Mean log-likelihood (sampling distribution) of the samples' generated tokens."""
    batch = collate(samples, 0, "cpu")
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(
            learner.model,
            batch["input_ids"],
            batch["attention_mask"],
            False,
            learner.loss_settings.rule,
            batch["loss_mask"],
        )
    return float((lp * batch["loss_mask"]).sum() / batch["loss_mask"].sum())


def _weights(learner: LearnerWorker) -> list[Any]:
    return [p.detach().clone() for p in learner.model.parameters()]


def test_grpo_raises_the_likelihood_of_rewarded_responses(tmp_path: Path) -> None:
    raw = _config(tmp_path)
    cfg = TrainConfig.model_validate(raw)
    learner = LearnerWorker(raw, 0, 1)
    learner.setup("127.0.0.1", 0)
    tok = load_tokenizer(cfg.model)
    engine = create_engine(  # same seeded initialisation as the learner's copy
        "hf", model=load_model(cfg.model), eos_token_ids=[tok.eos_token_id], pad_token_id=0
    )
    s = cfg.sampling
    params = SamplingParams(s.temperature, s.top_p, s.max_new_tokens, s.top_k)
    prompt = list(tok("Pick one token:", add_special_tokens=False)["input_ids"])

    def first_token_probs() -> Any:
        with torch.no_grad():
            logits = learner.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
        return processed_logprobs(logits, params.rule).exp()

    p0 = first_token_probs()
    target = int(p0.argsort(descending=True)[2])  # the third most likely: learning must move mass
    assert 0.05 < float(p0[target]) < 0.5

    torch.manual_seed(0)
    episodes: list[Episode] = []
    while not 0 < sum(e.reward for e in episodes) < GROUP:  # a group with a signal
        episodes = _episodes(prompt, engine.generate([prompt] * GROUP, params), target)
    rewarded = [s for e in episodes if e.reward > 0 for s in episode_to_samples(e, 1.0)]

    # control: the same batch with its advantages zeroed leaves every weight where it was
    before = _weights(learner)
    zeroed = [s for e in episodes for s in episode_to_samples(e, 0.0)]
    learner.train(zeroed, aggregation_norm(zeroed, learner.loss_settings))
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(learner), strict=True))

    ll0 = _loglik(learner, rewarded)
    successes = []
    for step in range(STEPS):
        if step:
            episodes = _episodes(prompt, engine.generate([prompt] * GROUP, params), target)
        successes.append(sum(e.reward for e in episodes))
        (advs,) = batch_advantages([episodes], "grpo")
        samples = [
            s for e, a in zip(episodes, advs, strict=True) if a for s in episode_to_samples(e, a)
        ]
        stats = learner.train(samples, aggregation_norm(samples, learner.loss_settings))
        if samples:
            # the engine's logprobs are the learner's own (same distribution, same weights)
            assert stats["mismatch_abs_max"] < 1e-4
        engine.update_weights(learner.state_dict(), learner.version)
    ll1 = _loglik(learner, rewarded)
    p1 = first_token_probs()
    print(f"rewarded log-lik {ll0:.3f} -> {ll1:.3f}; p(target) {p0[target]:.3f} -> "
          f"{p1[target]:.3f}; successes per group {successes}")  # fmt: skip
    assert ll1 > ll0 + 0.4
    assert float(p1[target]) > float(p0[target]) + 0.2

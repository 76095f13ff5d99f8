"""Advantage estimators, sample building (loss mask) and the clipped loss."""

from __future__ import annotations

import math

import pytest
import torch

from sandgym.trainer.algorithms import (
    AlgorithmError,
    LossSettings,
    Sample,
    aggregation_norm,
    batch_advantages,
    clipped_policy_loss,
    collate,
    compute_loss,
    episode_to_samples,
    group_advantages,
)
from sandgym.trainer.episode import Episode, Step, Trajectory


def test_grpo_is_zscore_and_zero_for_equal_rewards() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], "grpo")
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-4)
    assert group_advantages([0.5, 0.5, 0.5], "grpo") == [0.0, 0.0, 0.0]
    assert group_advantages([1.0, 0.0], "grpo", std_normalize=False) == [0.5, -0.5]


def test_rloo_uses_leave_one_out_mean() -> None:
    adv = group_advantages([1.0, 0.0, 0.5], "rloo")
    assert adv == pytest.approx([1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5])
    assert group_advantages([3.0], "rloo") == [0.0]


def test_reinforce_and_reinforce_pp() -> None:
    assert group_advantages([1.0, 0.0], "reinforce") == [1.0, 0.0]
    groups = [
        [Episode("t", 0, [Trajectory(reward=r)]) for r in (1.0, 0.0)],
        [Episode("t", 1, [Trajectory(reward=r)]) for r in (0.0, 0.0, 3.0)],
    ]
    adv = batch_advantages(groups, "reinforce_pp")
    flat = [a for g in adv for a in g]
    assert sum(flat) == pytest.approx(0.0, abs=1e-6)
    assert math.sqrt(sum(a * a for a in flat) / len(flat)) == pytest.approx(1.0, abs=1e-4)
    # group baseline first: the best of group 2 beats the best of group 1
    assert adv[1][2] > adv[0][0] > 0


def test_unknown_estimator_is_a_named_error() -> None:
    with pytest.raises(AlgorithmError, match="expected one of"):
        group_advantages([1.0], "ppo")


def _multi_turn_episode() -> Episode:
    # turn 2's prompt extends turn 1's prompt+response (observation tokens 7, 8 appended);
    # turn 3's prompt was re-rendered after dropping context (no prefix): a second sequence
    s1 = Step([1, 2, 3], [4, 5], [-0.1, -0.2], [1, 1], policy_version=3)
    s2 = Step([1, 2, 3, 4, 5, 7, 8], [9], [-0.3], [1], policy_version=4)
    s3 = Step([1, 2, 30], [31, 32], [-0.4, -0.5], [1, 0], policy_version=4)
    submit = Step([], [], [], [])
    return Episode("t", 0, [Trajectory(steps=[s1, s2, s3, submit], reward=1.0)])


def test_multi_turn_loss_mask_covers_exactly_the_generated_tokens() -> None:
    samples = episode_to_samples(_multi_turn_episode(), advantage=0.5)
    assert len(samples) == 2
    first, second = samples
    assert first.input_ids == [1, 2, 3, 4, 5, 7, 8, 9]
    assert first.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert first.old_logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3]
    assert first.policy_version == 3
    assert second.input_ids == [1, 2, 30, 31, 32]
    assert second.loss_mask == [0, 0, 0, 1, 0]
    assert all(s.advantage == 0.5 for s in samples)


def test_misaligned_step_is_rejected() -> None:
    bad = Episode("t", 0, [Trajectory(steps=[Step([1], [2, 3], [-0.1], [1, 1])])])
    with pytest.raises(AlgorithmError, match="misaligned"):
        episode_to_samples(bad, 1.0)


def test_clipped_loss_matches_ppo_formula() -> None:
    old = torch.zeros(4)
    new = torch.log(torch.tensor([0.5, 1.1, 1.5, 1.5]))
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0])
    loss, clipped = clipped_policy_loss(new, old, adv, clip_low=0.2, clip_high=0.28)
    # ratio 0.5, A>0: min(0.5, 0.8) = 0.5 (unclipped, pessimistic)
    # ratio 1.1: inside the range; ratio 1.5, A>0: clipped at 1.28; A<0: min(-1.5, -1.28) = -1.5
    assert loss.tolist() == pytest.approx([-0.5, -1.1, -1.28, 1.5], abs=1e-6)
    assert clipped.tolist() == [0.0, 0.0, 1.0, 0.0]


class _Bigram(torch.nn.Module):
    """A tiny causal LM with the `model(input_ids=, attention_mask=).logits` interface."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, vocab)

    def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
        class Out:
            logits = self.emb(input_ids)

        return Out()


@pytest.mark.parametrize(
    "aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_shard_losses_with_global_norm_add_up_to_the_full_batch_loss(aggregation: str) -> None:
    model = _Bigram()
    samples = [
        Sample([1, 2, 3, 4], [0, 1, 1, 1], [0, -2.0, -2.5, -2.0], 1.0),
        Sample([5, 6], [0, 1], [0, -2.2], -0.5),
        Sample([7, 8, 9], [0, 0, 1], [0, 0, -2.4], 0.3),
    ]
    settings = LossSettings(aggregation=aggregation, max_tokens=8)
    norm = aggregation_norm(samples, settings)
    full, _ = compute_loss(model, collate(samples, 0, "cpu"), settings, norm)
    parts = [compute_loss(model, collate([s], 0, "cpu"), settings, norm)[0] for s in samples]
    assert float(full.detach()) == pytest.approx(float(sum(p.detach() for p in parts)), rel=1e-5)
    if aggregation == "token-mean":
        assert norm == 5.0


def test_entropy_bonus_and_kl_enter_the_loss() -> None:
    model, ref = _Bigram(), _Bigram()
    with torch.no_grad():
        ref.emb.weight.add_(torch.randn_like(ref.emb.weight))
    samples = [Sample([1, 2, 3], [0, 1, 1], [0, -2.0, -2.0], 0.0)]
    batch = collate(samples, 0, "cpu")
    base, _ = compute_loss(model, batch, LossSettings(), 2.0)
    assert float(base) == pytest.approx(0.0)  # zero advantage, no bonus: nothing to learn
    ent, st = compute_loss(model, batch, LossSettings(entropy_coef=0.1), 2.0)
    assert float(ent) < 0 and st["entropy_sum"] > 0
    kl, st = compute_loss(model, batch, LossSettings(kl_coef=0.1), 2.0, ref_model=ref)
    assert float(kl) > 0 and st["kl_sum"] > 0


def test_policy_version_ignores_steps_the_model_did_not_generate() -> None:
    # an automatic submit carries no tokens and no version; it must not make a group look stale
    ep = _multi_turn_episode()
    assert ep.min_policy_version == 3

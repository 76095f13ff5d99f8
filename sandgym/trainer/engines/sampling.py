"""The sampling distribution, defined once for the engines and the learner.

A sampler draws token t from `processed(logits)`: the logits divided by the temperature, then
top-k, then top-p (nucleus) masking, renormalised. PPO's ratio and the policy gradient are only
on-policy if the learner's logprobs refer to that same distribution, so both sides call
`processed_logprobs` (the hf engine while it samples; the learner over the whole sequence), and a
remote engine (vLLM, an OpenAI-compatible server) must report logprobs of the processed
distribution too (vLLM: `--logprobs-mode processed_logprobs`). Where they still differ (another
kernel, bf16, another server), the learner's truncated importance sampling corrects the update
(`algorithm.tis`, see `sandgym/trainer/algorithms.py`).

Rules (the same as transformers' and vLLM's warpers, written out so they are ours):

- temperature <= 0 means greedy decoding, which has no sampling distribution: logprobs are then
  those of the unmodified policy (temperature 1, no masking), on both sides.
- top-k (k > 0): a token is kept when its logit is >= the k-th largest logit (ties at the k-th
  value are all kept).
- top-p (p < 1): tokens are sorted by probability ascending (a stable sort, so ties keep their
  vocabulary order), and a token is dropped when the cumulative probability up to and including
  it is <= 1 - p; the most likely token is always kept. Applied after top-k, on the renormalised
  top-k distribution.
- `keep`: the learner passes the sampled token, which is then never masked. It changes nothing
  when the token lies inside the learner's kept set (always, on-policy, up to float rounding at
  the nucleus boundary); after an update it keeps the logprob finite instead of -inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingRule:
    """The parameters that define the processed distribution (not the length limit)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def truncates(self) -> bool:
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)


def processed_logits(logits: Any, rule: SamplingRule, keep: Any = None) -> Any:
    """`logits` [..., V] (float32) scaled and masked (-inf) by `rule`; `keep` [...] token ids that
    must stay unmasked (or None)."""
    import torch

    if rule.greedy:
        return logits
    out = logits / rule.temperature if rule.temperature != 1.0 else logits
    if not rule.truncates:
        return out
    remove = torch.zeros_like(out, dtype=torch.bool)
    vocab = out.shape[-1]
    if 0 < rule.top_k < vocab:
        kth = torch.topk(out, rule.top_k, dim=-1).values[..., -1:]
        remove |= out < kth
    if rule.top_p < 1.0:
        masked = out.masked_fill(remove, float("-inf"))
        sorted_logits, order = torch.sort(masked, dim=-1, descending=False, stable=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1.0 - rule.top_p
        drop_sorted[..., -1] = False  # the most likely token stays
        remove |= torch.zeros_like(remove).scatter(-1, order, drop_sorted)
    if keep is not None:
        remove.scatter_(-1, keep.unsqueeze(-1), False)
    return out.masked_fill(remove, float("-inf"))


def processed_logprobs(logits: Any, rule: SamplingRule, keep: Any = None) -> Any:
    """log-probabilities of the processed distribution ([..., V]; masked tokens -inf)."""
    return processed_logits(logits.float(), rule, keep).log_softmax(-1)


def entropy_of(logp: Any) -> Any:
    """Entropy of each distribution given its log-probabilities (masked -inf entries add 0)."""
    import torch

    p = logp.exp()
    # masked entries: p = 0 and logp = -inf; 0 * -inf would be nan, in the value and the grad
    return -(p * torch.where(p > 0, logp, 0.0)).sum(-1)

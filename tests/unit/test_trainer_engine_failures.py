"""Engine failures classed by who caused them (issue 58, item 5).

- in-process engines (the batcher of `sandgym/trainer/engines/base.py`, which hf and vllm share):
  a prompt over the context fails alone as the policy's (`PromptTooLongError`) before anything is
  generated, and its batch-mates get their replies; a batch whose `generate` raises is bisected,
  so a request that fails alone is its own `RequestFailedError` while the others are kept; a
  failure every request meets alone is the engine's (`EngineError`, masked);
- HTTP engines: a 400 context-length reply is the request's `PromptTooLongError`, a 422 the
  request caused (a one-token request with the same settings passes) its `RequestFailedError`,
  a 400 that one-token request meets too and a 503 are `EngineError`; the limit a server reports
  in `/v1/models` refuses a prompt before it is sent;
- a weight push whose reload succeeded advances the version when the cache reset fails (openai's
  `vllm_http` push, the in-process vllm engine);
- `algorithm.tis: off` with raw engine logprobs is refused at config validation.

Small fakes of the engine's `generate`, of vLLM's `LLM` and HTTP stubs: no GPU, no vLLM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import httpx
import pytest
import torch

from sandgym.trainer.config import ConfigError, TisConfigError, TrainConfig, load_config
from sandgym.trainer.engines import create_engine
from sandgym.trainer.engines.base import (
    EngineError,
    Generation,
    InferenceEngine,
    PolicyOutputError,
    PromptTooLongError,
    RequestFailedError,
    SamplingParams,
)
from sandgym.trainer.engines.openai import OpenAIEngine
from sandgym.trainer.failures import classify_failure, drops_group, is_masked
from tests.fakes.json_http import JsonHandler, serving

CONFIGS = Path(__file__).resolve().parents[2] / "sandgym" / "trainer" / "configs"
#: a token the fake engine's generate fails on (as a device-side assert on a bad id would)
BAD = 666


class FakeBatchEngine(InferenceEngine):
    """An in-process engine whose `generate` fails like a model does: a prompt past the model's
    positions raises (an embedding index out of range), a prompt holding `BAD` raises, and a
    `broken` engine raises on every call. Each call's prompts are recorded."""

    def __init__(
        self,
        n: int,
        context: int | None = None,
        max_context_tokens: int | None = None,
        broken: bool = False,
    ) -> None:
        # the batch closes when it holds n requests; the wait only bounds a test gone wrong
        super().__init__(max_batch_size=n, batch_wait_s=30.0, max_context_tokens=max_context_tokens)
        self.context = context
        self.broken = broken
        self.calls: list[list[list[int]]] = []

    def model_context_tokens(self) -> int | None:
        return self.context

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append([list(p) for p in prompts])
        if self.broken:
            raise RuntimeError("engine core died")
        if self.context is not None and any(len(p) > self.context for p in prompts):
            raise IndexError("index out of range in self")
        if any(BAD in p for p in prompts):
            raise RuntimeError("CUDA error: device-side assert triggered")
        return [Generation([len(p)], [-0.1], "length") for p in prompts]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


async def _run(engine: InferenceEngine, prompts: list[list[int]], max_new: int = 4) -> list[Any]:
    params = SamplingParams(max_new_tokens=max_new)
    try:
        return list(
            await asyncio.gather(
                *(engine.agenerate(p, params) for p in prompts), return_exceptions=True
            )
        )
    finally:
        await engine.aclose()


async def test_a_prompt_over_the_context_fails_alone_as_the_policys() -> None:
    engine = FakeBatchEngine(n=4, context=16)
    prompts = [[1] * 5, [2] * 5, [3] * 30, [4] * 5]
    results = await _run(engine, prompts)
    assert len(results) == 4
    assert type(results[2]) is PromptTooLongError, results[2]
    assert "30 tokens" in str(results[2]) and "16 tokens" in str(results[2])
    reason = classify_failure(results[2])
    assert reason == "policy_output" and drops_group(reason) and not is_masked(reason)
    # the N-1 others got their replies, from one generate that never saw the long prompt
    assert [r.token_ids for i, r in enumerate(results) if i != 2] == [[5], [5], [5]]
    assert engine.calls == [[[1] * 5, [2] * 5, [4] * 5]]


async def test_the_configured_context_budget_is_checked_too() -> None:
    """agent.max_context_tokens bounds prompt + max_new_tokens where the model's is unknown."""
    engine = FakeBatchEngine(n=2, max_context_tokens=10)
    results = await _run(engine, [[1] * 6, [2] * 7], max_new=4)
    assert len(results) == 2
    assert isinstance(results[0], Generation) and results[0].token_ids == [6]
    assert type(results[1]) is PromptTooLongError
    assert engine.calls == [[[1] * 6]]


async def test_a_request_that_fails_alone_is_its_own_and_the_others_get_replies() -> None:
    engine = FakeBatchEngine(n=4)
    prompts = [[1, 2], [1, BAD], [3, 4, 5], [6]]
    results = await _run(engine, prompts)
    assert len(results) == 4
    assert type(results[1]) is RequestFailedError, results[1]
    assert "3 of its batch of 4 got replies" in str(results[1])
    assert classify_failure(results[1]) == "policy_output"
    assert [r.token_ids for i, r in enumerate(results) if i != 1] == [[2], [3], [1]]
    # bisected: the batch, its halves, the failing half's singles
    assert [len(c) for c in engine.calls] == [4, 2, 1, 1, 2]


async def test_a_failure_every_request_meets_alone_is_the_engines() -> None:
    engine = FakeBatchEngine(n=3, broken=True)
    results = await _run(engine, [[1], [2], [3]])
    assert len(results) == 3
    for r in results:
        assert type(r) is EngineError, r
        assert classify_failure(r) == "engine" and is_masked("engine")
    # every request was tried alone before the engine was blamed
    assert sorted(c[0][0] for c in engine.calls if len(c) == 1) == [1, 2, 3]
    # a batch of one that fails cannot blame its request either
    lone = await _run(FakeBatchEngine(n=1, broken=True), [[7]])
    assert len(lone) == 1 and type(lone[0]) is EngineError


async def test_a_real_hf_model_serves_the_batch_and_refuses_the_prompt_past_its_positions() -> None:
    """A transformers Llama with 32 positions: a 40-token prompt fails alone as the policy's,
    the other prompts of its batch are generated."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sandgym.trainer.engines.hf import HFEngine

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    engine = HFEngine(LlamaForCausalLM(config), [1], 0, max_batch_size=3, batch_wait_s=30.0)
    results = await _run(engine, [[5] * 10, [6] * 40, [7] * 12], max_new=4)
    assert len(results) == 3
    assert type(results[1]) is PromptTooLongError and "32 tokens" in str(results[1])
    for r in (results[0], results[2]):
        assert isinstance(r, Generation) and 1 <= len(r.token_ids) <= 4
        assert len(r.logprobs) == len(r.token_ids)


def test_the_trainer_builds_engines_with_the_agents_context_budget() -> None:
    from sandgym.trainer.builders import build_engine

    served = ["engine.kind=openai", "engine.base_url=http://h:8000/v1"]
    served += ["engine.weight_sync=vllm_http", "engine.weight_dir=/tmp/w"]
    tok = NS(eos_token_id=2, pad_token_id=0)
    cfg = load_config(CONFIGS / "smoke.yaml", [*served, "agent.max_context_tokens=300"])
    assert build_engine(cfg, tok).max_context_tokens == 300
    # a harness keeps its own conversation (no turns dropped): only the model's limit holds
    harness = load_config(CONFIGS / "smoke.yaml", [*served, "agent.kind=harness"])
    assert build_engine(harness, tok).max_context_tokens is None


def test_the_in_process_engines_know_their_models_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sandgym.trainer.engines.hf import HFEngine

    class Model:
        config = NS(max_position_embeddings=32)

        def to(self, device: str) -> Model:
            return self

        def eval(self) -> Model:
            return self

    hf = HFEngine(Model(), [2], 0, max_context_tokens=64)
    assert hf.model_context_tokens() == 32 and hf.context_limit == 32
    with pytest.raises(PromptTooLongError):
        hf.check_prompt([1] * 30, SamplingParams(max_new_tokens=3))
    vllm = _fake_vllm(monkeypatch, tmp_path, max_model_len=100, max_context_tokens=64)
    assert vllm.model_context_tokens() == 100 and vllm.context_limit == 64


class _FakeLLM:
    """vLLM 0.34's `LLM` surface the engine uses; `reset_prefix_cache` fails as told."""

    reset: Any = True

    def __init__(self, **kw: Any) -> None:
        self.llm_engine = NS(model_config=NS(max_model_len=kw.pop("_max_model_len", None)))

    def collective_rpc(self, method: str, kwargs: Any = None, **_: Any) -> list[Any]:
        return [None]

    def reset_prefix_cache(self) -> bool:
        if isinstance(type(self).reset, BaseException):
            raise type(self).reset
        return bool(type(self).reset)


def _fake_vllm(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    max_model_len: int | None = None,
    max_context_tokens: int | None = None,
) -> Any:
    module = types.ModuleType("vllm")
    module.LLM = _FakeLLM  # type: ignore[attr-defined]
    module.SamplingParams = dict  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return create_engine(
        "vllm",
        model_path="/m",
        eos_token_ids=[2],
        weight_dir=str(tmp_path / "w"),
        llm_args={"_max_model_len": max_model_len},
        max_context_tokens=max_context_tokens,
    )


@pytest.mark.parametrize("failure", ["raises", "refused"])
def test_vllm_push_advances_when_the_cache_reset_fails(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    failure: str,
) -> None:
    monkeypatch.setattr(
        _FakeLLM, "reset", RuntimeError("engine busy") if failure == "raises" else False
    )
    engine = _fake_vllm(monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="sandgym.trainer.engines.vllm"):
        assert engine.update_weights({"w": torch.ones(2)}, 3) == 3
    assert engine.version == 3 and engine.cache_reset_failures == 1
    assert "prefix" in caplog.text


def test_a_vllm_without_processed_logprobs_is_refused_when_tis_is_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A vLLM before `logprobs_mode` reports raw logprobs: with tis off nothing would correct
    for them, so the engine refuses to start; with tis on it warns and runs."""

    class OldLLM(_FakeLLM):
        def __init__(self, **kw: Any) -> None:
            if "logprobs_mode" in kw:
                raise TypeError("unexpected keyword argument 'logprobs_mode'")
            super().__init__(**kw)

    monkeypatch.setattr(_FakeLLM, "reset", True)
    module = types.ModuleType("vllm")
    module.LLM = OldLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    kw = {"model_path": "/m", "eos_token_ids": [2], "weight_dir": str(tmp_path / "w")}
    with pytest.raises(EngineError, match="no logprobs_mode.*algorithm.tis is off"):
        create_engine("vllm", **kw, require_processed_logprobs=True)
    with caplog.at_level(logging.WARNING, logger="sandgym.trainer.engines.vllm"):
        engine = create_engine("vllm", **kw)
    assert isinstance(engine.llm, OldLLM) and "raw model's" in caplog.text
    # the trainer's builder asks for it exactly when the config turns tis off
    from sandgym.trainer.builders import build_engine

    vllm_cfg = ["engine.kind=vllm", "model.source=hf", "model.path=/m"]
    tok = NS(eos_token_id=2, pad_token_id=0)
    off = load_config(CONFIGS / "smoke.yaml", [*vllm_cfg, "algorithm.tis=off"])
    with pytest.raises(EngineError, match="no logprobs_mode"):
        build_engine(off, tok, weight_dir=str(tmp_path / "b"))
    auto = load_config(CONFIGS / "smoke.yaml", vllm_cfg)
    assert isinstance(build_engine(auto, tok, weight_dir=str(tmp_path / "b")).llm, OldLLM)


# --- HTTP engines -------------------------------------------------------------------------


def _openai_with(handler: Any, **kw: Any) -> OpenAIEngine:
    engine = OpenAIEngine("http://srv/v1", "m", **kw)
    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return engine


def _ok(prompt: list[int]) -> httpx.Response:
    choice = {"token_ids": [len(prompt)], "logprobs": {"token_logprobs": [-0.5]}}
    return httpx.Response(200, json={"choices": [{**choice, "finish_reason": "length"}]})


async def _one(engine: OpenAIEngine, prompt: list[int], max_new: int = 2) -> Any:
    try:
        return await engine.agenerate(prompt, SamplingParams(max_new_tokens=max_new))
    except EngineError as exc:
        return exc
    finally:
        await engine.aclose()


async def test_a_context_length_400_is_the_requests_policy_error_and_a_503_the_engines() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404)
        body = json.loads(request.content)
        if len(body["prompt"]) > 8:  # a server with no structured param (older vLLM)
            msg = "This model's maximum context length is 8 tokens. However, you requested 12"
            return httpx.Response(400, json={"error": {"message": msg, "param": None}})
        if body["prompt"][0] == 503:
            return httpx.Response(503, json={"error": "overloaded"})
        return _ok(body["prompt"])

    too_long = await _one(_openai_with(handler), list(range(1, 13)))
    assert type(too_long) is PromptTooLongError, too_long
    assert classify_failure(too_long) == "policy_output"
    unavailable = await _one(_openai_with(handler), [503, 1])
    assert type(unavailable) is EngineError and "503" in str(unavailable)
    assert classify_failure(unavailable) == "engine"
    fine = await _one(_openai_with(handler), [1, 2])
    assert isinstance(fine, Generation) and fine.token_ids == [2]


async def test_a_4xx_the_request_caused_is_its_own_and_one_every_request_meets_the_engines() -> (
    None
):
    sent: list[list[int]] = []

    def request_caused(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body["prompt"])
        if BAD in body["prompt"]:  # vLLM: a token id outside the vocabulary
            return httpx.Response(422, json={"error": {"message": f"token id {BAD} invalid"}})
        return _ok(body["prompt"])

    caused = await _one(_openai_with(request_caused), [5, BAD, 7])
    assert type(caused) is RequestFailedError, caused
    assert classify_failure(caused) == "policy_output"
    assert sent == [[5, BAD, 7], [5]]  # the request, then the one-token probe

    def settings_refused(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "top_k must be -1 or >= 1"}})

    refused = await _one(_openai_with(settings_refused), [5, 6])
    assert type(refused) is EngineError and "one-token request" in str(refused)
    assert classify_failure(refused) == "engine"


class _Chars:
    """A character tokenizer: id = code point + 10 (0 is BOS)."""

    bos_token_id = 0

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join("<s>" if i == 0 else chr(i - 10) for i in ids)


async def test_the_text_engine_classes_its_4xx_by_cause() -> None:
    """llama-cpp-python's server: its context error is a 400 naming the maximum context length
    (`context_length_exceeded`); a request it refuses for its content alone is the request's."""
    from sandgym.trainer.engines.openai_text import TextCompletionEngine

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/extras/tokenize":
            return httpx.Response(200, json={"tokens": [0, *(ord(c) + 10 for c in body["input"])]})
        if len(body["prompt"]) > 8:
            msg = "This model's maximum context length is 8 tokens. However, you requested 14"
            error = {"message": msg, "param": "messages", "code": "context_length_exceeded"}
            return httpx.Response(400, json={"error": error})
        if "!" in body["prompt"]:
            return httpx.Response(400, json={"error": {"message": "invalid grammar"}})
        toks = ["o", "k"]
        lp = {"tokens": toks, "token_logprobs": [-0.1, -0.2]}
        return httpx.Response(
            200, json={"choices": [{"text": "ok", "logprobs": lp, "finish_reason": "length"}]}
        )

    def engine(**kw: Any) -> TextCompletionEngine:
        eng = TextCompletionEngine("http://llama/v1", "m", tokenizer=_Chars(), **kw)
        eng._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        return eng

    def ids(text: str) -> list[int]:
        return [ord(c) + 10 for c in text]

    too_long = await _one(engine(), ids("abcdefghijkl"))
    assert type(too_long) is PromptTooLongError, too_long
    caused = await _one(engine(), ids("ab!"))
    assert type(caused) is RequestFailedError, caused  # its first character alone is taken
    fine = await _one(engine(), ids("abc"))
    assert isinstance(fine, Generation) and fine.token_ids == ids("ok")
    # the configured budget refuses before anything is sent
    budget = await _one(engine(max_context_tokens=4), ids("abc"), max_new=2)
    assert type(budget) is PromptTooLongError and "context of 4 tokens" in str(budget)


async def test_the_limit_a_server_reports_refuses_a_prompt_before_it_is_sent() -> None:
    """Our own completions server in front of a fake engine: it reports the engine's context as
    `max_model_len` (as vLLM does) and answers a prompt over it with vLLM's 400."""
    from sandgym.trainer.engines.server import completions_app

    served = FakeBatchEngine(n=1, context=10)
    app = completions_app(served, "m")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://srv") as client:
        models = (await client.get("/v1/models")).json()["data"]
        assert [m["max_model_len"] for m in models] == [10]
        resp = await client.post("/v1/completions", json={"prompt": [1] * 9, "max_tokens": 4})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_tokens"

    posts: list[str] = []

    async def count(request: httpx.Request) -> None:
        if request.method == "POST":
            posts.append(request.url.path)

    engine = OpenAIEngine("http://srv/v1", "m", max_context_tokens=64)
    engine._client = httpx.AsyncClient(transport=transport, event_hooks={"request": [count]})
    refused = await _one(engine, [1] * 9, max_new=4)
    assert type(refused) is PromptTooLongError and "10 tokens" in str(refused)
    assert posts == []  # refused here, before any completion was asked for
    engine = OpenAIEngine("http://srv/v1", "m")
    engine._client = httpx.AsyncClient(transport=transport)
    fits = await _one(engine, [1] * 6, max_new=4)
    await served.aclose()
    assert isinstance(fits, Generation) and fits.token_ids == [6]


class _PushServer(JsonHandler):
    """`vllm serve` in dev mode: the reload succeeds, `/reset_prefix_cache` answers
    `reset_status`."""

    paths: list[str] = []
    reset_status = 500

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).paths.append(self.path)
        if self.path == "/collective_rpc":
            return self._reply(200, {"results": [None]})
        return self._reply(type(self).reset_status, {"error": "reset failed"})


@pytest.fixture
def push_server() -> Iterator[str]:
    _PushServer.paths = []
    with serving(_PushServer) as url:
        yield url


def test_openai_push_advances_when_the_cache_reset_fails(
    push_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(
        "openai", base_url=push_server, model_name="m", weight_sync="vllm_http",
        weight_dir=str(tmp_path / "weights"),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="sandgym.trainer.engines.openai"):
        assert engine.update_weights({"w": torch.ones(2)}, 2) == 2
    assert _PushServer.paths == ["/collective_rpc", "/reset_prefix_cache"]
    assert engine.version == 2 and engine.cache_reset_failures == 1
    assert "reloaded" in caplog.text and "500" in caplog.text


# --- config -------------------------------------------------------------------------------


def test_tis_off_with_raw_engine_logprobs_is_refused() -> None:
    served = ["engine.kind=openai", "engine.base_url=http://h:8000/v1"]
    served += ["engine.weight_sync=vllm_http"]
    # `algorithm.tis=off` is YAML: a bare off reads as False, taken as "off"
    with pytest.raises(ConfigError, match="algorithm.tis off with engine.logprobs raw"):
        load_config(CONFIGS / "smoke.yaml", [*served, "algorithm.tis=off"])
    # the named error, under pydantic's wrapping
    data = {"env": {"task_ids": ["t"]}, "algorithm": {"tis": "off"}}
    data["engine"] = {"kind": "hf", "logprobs": "raw"}
    with pytest.raises(ValueError) as info:
        TrainConfig.model_validate(data)
    errors = info.value.errors()  # type: ignore[attr-defined]
    assert len(errors) == 1 and isinstance(errors[0]["ctx"]["error"], TisConfigError)
    # processed logprobs: the PPO ratio is taken against the engine's, tis off is allowed
    cfg = load_config(
        CONFIGS / "smoke.yaml", [*served, "algorithm.tis=off", "engine.logprobs=processed"]
    )
    assert not cfg.tis_enabled
    # nothing is trained: nothing is refused
    assert not load_config(
        CONFIGS / "smoke.yaml", [*served, "algorithm.tis=off", "run.num_updates=0"]
    ).tis_enabled
    # auto corrects raw logprobs whatever the engine
    assert load_config(CONFIGS / "smoke.yaml", ["engine.logprobs=raw"]).tis_enabled
    assert load_config(CONFIGS / "smoke.yaml", served).tis_enabled


def test_policy_errors_of_the_engines_are_classed_as_the_policys() -> None:
    for exc in (PromptTooLongError("x"), RequestFailedError("x")):
        assert isinstance(exc, PolicyOutputError)
        assert classify_failure(exc) == "policy_output"

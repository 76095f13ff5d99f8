"""`TextCompletionEngine` (llama-cpp-python's server: text in, token strings out) against a fake
server speaking that API, with a character-level tokenizer: ids recovered through the server's
tokenizer, an end token the server does not report said so, and a loud error whenever the prompt or
the reply does not line up. The real server: `lab/bench/openai_llamacpp.py`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from sandgym.trainer.engines.base import STOP_UNSCORED, EngineError, SamplingParams
from sandgym.trainer.engines.openai_text import TextCompletionEngine

EOS, BOS = 1, 0


class CharTokenizer:
    """id = code point + 10 (0 and 1 are BOS and EOS)."""

    bos_token_id = BOS
    eos_token_id = EOS

    def decode(self, ids: list[int], **_: Any) -> str:
        special = {BOS: "<s>", EOS: "</s>"}
        return "".join(special[i] if i in special else chr(i - 10) for i in ids)

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 10 for c in text]


class FakeLlamaServer:
    """Answers /v1/completions with `reply` (its token strings as sampled) and /extras/tokenize
    with the char tokenizer's split, plus the model's BOS as llama-cpp-python's endpoint does."""

    def __init__(self, reply_tokens: list[str], finish: str = "stop", split: Any = None) -> None:
        self.reply_tokens = reply_tokens
        self.finish = finish
        self.split = split or CharTokenizer().encode
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append({"path": request.url.path, **body})
        if request.url.path == "/extras/tokenize":
            return httpx.Response(200, json={"tokens": [BOS, *self.split(body["input"])]})
        toks = self.reply_tokens
        lp = {"tokens": toks, "token_logprobs": [-0.1 * (i + 1) for i in range(len(toks))]}
        return httpx.Response(
            200,
            json={
                "choices": [{"text": "".join(toks), "logprobs": lp, "finish_reason": self.finish}]
            },
        )


def engine_for(server: FakeLlamaServer) -> TextCompletionEngine:
    eng = TextCompletionEngine("http://llama/v1", "m", tokenizer=CharTokenizer())
    eng._client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    return eng


def generate(eng: TextCompletionEngine, prompt: str, **params: Any) -> Any:
    async def go() -> Any:
        try:
            return await eng.agenerate(CharTokenizer().encode(prompt), SamplingParams(**params))
        finally:
            await eng.aclose()

    return asyncio.run(go())


def test_ids_logprobs_and_an_unreported_end_token() -> None:
    server = FakeLlamaServer(["o", "k"])
    gen = generate(engine_for(server), "hi", temperature=0.5, top_p=0.9)
    # the end token the server stopped at is not reported: not in the ids, and said so
    assert gen.token_ids == [ord("o") + 10, ord("k") + 10]
    assert gen.logprobs == [-0.1, -0.2]
    assert gen.finish_reason == STOP_UNSCORED
    sent = next(b for b in server.bodies if b["path"] == "/v1/completions")
    assert sent["prompt"] == "hi" and sent["temperature"] == 0.5 and sent["top_p"] == 0.9
    # the server's own extra samplers are off: it samples from the rule asked for
    assert (sent["top_k"], sent["min_p"], sent["repeat_penalty"]) == (0, 0.0, 1.0)


def test_a_length_stop_has_no_end_token() -> None:
    gen = generate(engine_for(FakeLlamaServer(["o", "k"], finish="length")), "hi")
    assert gen.token_ids == [ord("o") + 10, ord("k") + 10] and gen.finish_reason == "length"


def test_a_sample_that_is_not_the_tokenizers_split_fails_loudly() -> None:
    # sampled as "ok" in one token; the tokenizer splits "ok" in two
    eng = engine_for(FakeLlamaServer(["ok"]))
    with pytest.raises(EngineError, match="cannot recover the sampled token ids"):
        generate(eng, "hi")
    assert eng.rejected_samples == 1


def test_a_prompt_that_does_not_survive_text_fails_loudly() -> None:
    def merge(text: str) -> list[int]:  # a server tokenizer that disagrees on the prompt
        return [ord(c) + 10 for c in text.replace("hi", "h")]

    with pytest.raises(EngineError, match="does not survive the trip through text"):
        generate(engine_for(FakeLlamaServer(["o"], split=merge)), "hi")

"""An engine that calls any OpenAI-compatible `/v1/completions` endpoint (e.g. `vllm serve`).

The prompt is sent as token ids and the reply must give the generated token ids and their
logprobs. vLLM returns them with `logprobs: 0` plus either `return_token_ids: true` (a
`token_ids` list per choice) or `return_tokens_as_token_ids: true` (tokens spelled
`token_id:N`); both are understood. Weights cannot be pushed over this API: the server keeps
whatever it serves, so `supports_weight_sync` is False and the trainer's staleness bound applies.

The logprobs must be those of the distribution the server sampled from (after temperature,
top-k, top-p), which is what the learner recomputes (`trainer/engines/sampling.py`). vLLM reports
the raw model's by default: start it with `--logprobs-mode processed_logprobs`. Whatever remains
(another kernel, another precision, another server) shows in the `tis/*` metrics and is corrected
by truncated importance sampling, on by default for this engine (`algorithm.tis: auto`).
`trainer.engines.server` serves an hf engine behind this same API.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from trainer.engines.base import EngineError, Generation, InferenceEngine, SamplingParams


def parse_completion_choice(choice: dict[str, Any]) -> Generation:
    """Token ids and logprobs of one `/v1/completions` choice."""
    lp = choice.get("logprobs") or {}
    logprobs = lp.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None:
        tokens = lp.get("tokens")
        if not tokens or not all(str(t).startswith("token_id:") for t in tokens):
            raise EngineError(
                "completion choice has neither token_ids nor logprobs.tokens spelled "
                f"'token_id:N' (ask the server with return_tokens_as_token_ids); found {choice!r}"[
                    :400
                ]
            )
        ids = [int(str(t).split(":", 1)[1]) for t in tokens]
    if logprobs is None or len(logprobs) != len(ids):
        raise EngineError(
            f"completion choice has {len(ids)} token ids but logprobs "
            f"{None if logprobs is None else len(logprobs)}: expected one logprob per token"
        )
    finish = "stop" if choice.get("finish_reason") == "stop" else "length"
    return Generation([int(i) for i in ids], [float(x) for x in logprobs], finish)


class OpenAIEngine(InferenceEngine):
    supports_weight_sync = False

    def __init__(
        self,
        base_url: str,
        model_name: str,
        api_key: str | None = None,
        eos_token_ids: list[int] | None = None,
        timeout_s: float = 120.0,
        max_concurrency: int = 64,
    ) -> None:
        super().__init__()
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.eos_token_ids = list(eos_token_ids or [])
        self.timeout_s = timeout_s
        self._sem = asyncio.Semaphore(max_concurrency)
        self._client: httpx.AsyncClient | None = None

    def _body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompt_ids,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if self.eos_token_ids:
            body["stop_token_ids"] = self.eos_token_ids
        return body

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        """POST `body` to `url`; its JSON reply, or EngineError (unreachable, not 200)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers)
        try:
            resp = await self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{url} unreachable: {exc!r}") from exc
        if resp.status_code != 200:
            raise EngineError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        async with self._sem:
            reply = await self._post(f"{self.base_url}/completions", self._body(prompt_ids, params))
        gen = parse_completion_choice(reply["choices"][0])
        gen.version = self.version
        self.generated_tokens += len(gen.token_ids)
        return gen

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        async def _all() -> list[Generation]:
            try:
                return list(await asyncio.gather(*(self.agenerate(p, params) for p in prompts)))
            finally:
                await self.aclose()

        return asyncio.run(_all())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # the served weights live in another process; the version still advances so that
        # callers see what they asked for, and `supports_weight_sync` tells them it is moot
        return None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await super().aclose()

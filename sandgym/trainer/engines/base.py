"""The inference-engine interface, and a micro-batcher that serves many concurrent episodes.

An engine takes prompts as token ids and returns, per prompt, the generated token ids with the
logprob of each under the distribution it was *sampled* from: the logits after temperature, top-k
and top-p (`sandgym/trainer/engines/sampling.py` defines it; greedy decoding reports the unmodified
policy's logprobs). The learner computes its logprobs under the same processed distribution, so
the PPO ratio is on-policy; what still differs between engine and learner (numerics, a remote
server) is measured in every update's `mismatch/*` metrics and corrected by truncated importance
sampling when `algorithm.tis` is on. `agenerate` is what agents call: engines that generate in
batches (hf, vllm) collect concurrent requests for up to `batch_wait_s` and run them together
in a worker thread, so the event loop that drives the episodes never blocks.

Failures by cause (issue 58). A request whose prompt with its `max_new_tokens` does not fit the
engine's context (`context_limit`: the least of the model's own, as the engine knows it, and the
configured `agent.max_context_tokens`) is refused before anything is generated, as that request's
`PromptTooLongError`; its batch-mates are generated as if it had not come. When `generate` of a
batch raises, the batcher finds who caused it by bisection: each half is generated again on its
own, down to single requests; the requests of every half that succeeds get their replies, and a
request that fails alone while others succeed is its own `RequestFailedError` (the policy's). A
failure every request meets alone (or the one request of a batch of one) is the engine's:
`EngineError` for each, masked (`sandgym/trainer/failures.py`). A broken engine costs 2N-1
generate calls of a batch of N before it says so; a healthy batch, one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from sandgym.trainer.engines.sampling import SamplingRule

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """An inference engine failed or was misconfigured."""


class PolicyOutputError(EngineError):
    """The engine could not use what the policy produced: a reply whose sampled ids cannot be
    recovered, a prompt (built from the policy's replies) that does not survive the trip through
    text, or one the server refuses as longer than its context. The policy can cause it, so an
    episode ending so is never masked as infrastructure (sandgym/trainer/failures.py)."""


class PromptTooLongError(PolicyOutputError):
    """A prompt that, with the tokens asked for, exceeds the engine's context (the model's, the
    server's reported `max_model_len`, or the configured `agent.max_context_tokens`): refused
    for that request alone, before generating (or by the server's 400)."""


class RequestFailedError(PolicyOutputError):
    """A request that the engine failed on alone while other requests of its batch got their
    replies, or one an HTTP server refused as invalid (a 4xx it caused) while a minimal request
    with the same settings passes: the request, so the policy that wrote it, caused it."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    #: 0 = no top-k masking
    top_k: int = 0

    @property
    def rule(self) -> SamplingRule:
        """The processed distribution these parameters sample from."""
        return SamplingRule(self.temperature, self.top_p, self.top_k)


#: `Generation.finish_reason` of a reply an end token ended that the engine cannot score
STOP_UNSCORED = "stop_unscored"


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    #: "stop" (an end token was generated; it is included in token_ids), "length", or
    #: STOP_UNSCORED (an end token ended it, but the engine cannot report it or its logprob:
    #: it is not in token_ids, and the conversation adds it as context)
    finish_reason: str
    #: policy version of the weights that produced it
    version: int = 0


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation] = field(repr=False)


class InferenceEngine(ABC):
    """Generate from token ids; take new weights from the learner."""

    #: whether `update_weights` really changes what the engine generates; an engine without it
    #: keeps reporting the version it serves (0: the weights it started with), whatever it is sent
    supports_weight_sync: bool = True

    def __init__(
        self,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.02,
        max_context_tokens: int | None = None,
    ) -> None:
        self.version = 0
        #: the configured context budget (`agent.max_context_tokens`); `context_limit` also
        #: takes the model's own
        self.max_context_tokens = max_context_tokens
        #: weight pushes whose reload succeeded but whose prefix-cache reset failed (the
        #: version advanced; a warning was logged each time)
        self.cache_reset_failures = 0
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._lock = threading.Lock()  # generate vs update_weights
        self._queue: asyncio.Queue[_Request] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.generated_tokens = 0

    def model_context_tokens(self) -> int | None:
        """The model's own context length as this engine knows it (None: unknown)."""
        return None

    @property
    def context_limit(self) -> int | None:
        """Prompt plus generated tokens a request may hold at most: the least of the model's
        context and the configured budget (None: no known limit)."""
        known = [n for n in (self.model_context_tokens(), self.max_context_tokens) if n]
        return min(known) if known else None

    def warn_if_budget_exceeds_model(self) -> None:
        """Log when the configured budget is larger than the model's context (the model's then
        bounds every request: the agent's own trimming does not keep prompts within it)."""
        model = self.model_context_tokens()
        if model is not None and self.max_context_tokens and self.max_context_tokens > model:
            log.warning(
                "agent.max_context_tokens %d exceeds the model's context of %d tokens: prompts "
                "between the two are refused as too long (the policy's failure)",
                self.max_context_tokens,
                model,
            )

    def check_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise `PromptTooLongError` when the prompt and its `max_new_tokens` exceed the
        context (`context_limit`)."""
        limit = self.context_limit
        if limit is not None and len(prompt_ids) + params.max_new_tokens > limit:
            raise PromptTooLongError(
                f"prompt of {len(prompt_ids)} tokens + max_new_tokens {params.max_new_tokens} "
                f"exceeds the context of {limit} tokens (model {self.model_context_tokens()}, "
                f"agent.max_context_tokens {self.max_context_tokens}): too long"
            )

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Blocking batched generation (call from a thread)."""

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Replace the weights (called under the engine lock)."""

    def update_weights(self, state_dict: dict[str, Any], version: int) -> int:
        """Load the learner's weights of `version`; returns the version the engine now serves.
        An engine that cannot take weights (`supports_weight_sync` False) loads nothing and keeps
        its version: generations are stamped with the weights that really made them, so the
        trainer's staleness bound sees the truth. A failed load raises and keeps the version."""
        if not self.supports_weight_sync:
            return self.version
        with self._lock:
            self.load_state_dict(state_dict)
            self.version = version
        return self.version

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Generate for one prompt, batched with whatever other episodes ask at the same time."""
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())
        fut: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(prompt_ids, params, fut))
        return await fut

    def _generate_locked(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]:
        with self._lock:
            gens = self.generate(prompts, params)
            for g in gens:
                g.version = self.version
            self.generated_tokens += sum(len(g.token_ids) for g in gens)
            return gens

    async def _batch_loop(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            deadline = asyncio.get_running_loop().time() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                timeout = deadline - asyncio.get_running_loop().time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), timeout))
                except TimeoutError:
                    break
            # one generate call per distinct sampling setting
            by_params: dict[tuple[float, float, int, int], list[_Request]] = {}
            for r in batch:
                p = r.params
                key = (p.temperature, p.top_p, p.max_new_tokens, p.top_k)
                by_params.setdefault(key, []).append(r)
            for reqs in by_params.values():
                await self._serve(reqs)

    async def _serve(self, reqs: list[_Request]) -> None:
        """Generate for requests of one sampling setting: a prompt over the context fails
        alone first; a batch whose generation raises is bisected to find who caused it (see
        the module docstring)."""
        fitting: list[_Request] = []
        for r in reqs:
            try:
                self.check_prompt(r.prompt_ids, r.params)
            except PromptTooLongError as too_long:
                if not r.future.done():
                    r.future.set_exception(too_long)
                continue
            fitting.append(r)
        if not fitting:
            return
        alone: list[tuple[_Request, Exception]] = []
        served = await self._bisect(fitting, alone)
        for r, exc in alone:
            if r.future.done():
                continue
            if served:  # others of its batch got replies: this request caused it
                r.future.set_exception(
                    RequestFailedError(
                        f"generation failed for this request alone ({served} of its batch of "
                        f"{len(fitting)} got replies): {exc!r}"
                    )
                )
            else:  # every request met it alone: the engine's
                r.future.set_exception(EngineError(f"generation failed: {exc!r}"))

    async def _bisect(self, reqs: list[_Request], alone: list[tuple[_Request, Exception]]) -> int:
        """Generate `reqs`; on failure, each half on its own. Requests that failed alone go to
        `alone`; returns how many requests got their replies."""
        try:
            gens = await asyncio.to_thread(
                self._generate_locked, [r.prompt_ids for r in reqs], reqs[0].params
            )
        except Exception as exc:
            if len(reqs) == 1:
                alone.append((reqs[0], exc))
                return 0
            mid = len(reqs) // 2
            return await self._bisect(reqs[:mid], alone) + await self._bisect(reqs[mid:], alone)
        for r, g in zip(reqs, gens, strict=True):
            if not r.future.done():
                r.future.set_result(g)
        return len(reqs)

    async def aclose(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None
            self._queue = None

"""The one episode loop every runner shares, and the one way an episode's ending is classified.

    reset (retrying a reset refused as retryable) -> the agent acts (`play(session)`) until it
    is done or the environment ends the episode -> an episode the environment did not end is
    submitted until it ends (once, or once per step left of a multi-step task) -> the ending.

Its users: `run_episodes` (below: many episodes at once, each result as it finishes), `sandgym run` (sandgym.cli.run_cli), the
trainer's `run_episode` (sandgym.trainer.episode_runner, which adds its model turns and token
records by subclassing `LoopSession`), verl's agent loop (sandgym.integrations.verl: its
model turns are `play`), and the doors' `SyncEpisode` (sandgym.integrations.episode,
which is driven one action at a time from outside, so it takes the session, `classify` and
`submit_to_the_end` from here rather than `play_episode`).

How an episode ended (`Outcome`), decided by the one error-code table (sandgym.wire.codes):
- `scored`: the environment ended it; the reward is the server's;
- `agent_failure`: a failure the agent can cause (`action_timeout`, `verifier_error`: the table's
  `agent` rows) ended it: reward 0.0, never masked;
- `masked`: anything else (a lost connection, whatever code the client gave it; a server fault;
  a lost sandbox; a refused task or token): no reward (None), never scored.

`play_episode` never raises for the environment's failures (they become the ending); any other
exception (a bug in an agent, a model server's error) propagates to the caller, which classifies
it itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from websockets.exceptions import ConnectionClosed

from sandgym.client.env_client import (
    AsyncEnvClient,
    ConnectionLostError,
    EnvError,
    StepResult,
    to_action,
)
from sandgym.wire.codes import agent_can_cause

log = logging.getLogger(__name__)

#: the most steps a multi-step task may have before an episode's closing submits give up
MAX_TASK_STEPS = 1000

Outcome = Literal["scored", "agent_failure", "masked"]
#: the failures of the environment (server, sandbox, connection) the loop turns into an ending
ENV_FAILURES: tuple[type[BaseException], ...] = (
    EnvError,
    ConnectionClosed,
    OSError,
    EOFError,
    TimeoutError,
)

SUBMIT: dict[str, Any] = {"kind": "submit"}


def classify(exc: BaseException) -> Outcome:
    """How an episode that failed with `exc` ended: `agent_failure` (scored 0) only for an
    `EnvError` the server sent with a code the agent can cause; a lost connection (whatever
    code the client gave it) and every other failure are `masked`."""
    if isinstance(exc, EnvError) and not isinstance(exc, ConnectionLostError):
        return "agent_failure" if agent_can_cause(exc.code) else "masked"
    return "masked"


def reward_of(outcome: Outcome, reward: float | None = None) -> float | None:
    """The reward an ending carries: the server's when scored, 0.0 for the agent's failure,
    None when masked."""
    if outcome == "scored":
        return reward
    return 0.0 if outcome == "agent_failure" else None


def failure_code(exc: BaseException | None) -> str | None:
    """The wire code of a failure (None for one that has none: a socket error the client did
    not wrap)."""
    return exc.code if isinstance(exc, EnvError) else None


class LoopSession:
    """One episode as the agent drives it: the client, the reset's observation and info, and
    the reply that ended the episode once there is one. Runners subclass it to record steps."""

    def __init__(self, client: Any, observation: dict[str, Any], info: dict[str, Any]) -> None:
        self.client = client
        #: the reset's observation and info
        self.observation = observation
        self.info = info
        #: the reply that ended the episode (terminated or truncated), once there is one
        self.result: Any = None
        #: actions sent (submits included)
        self.actions = 0

    @property
    def ended(self) -> bool:
        return self.result is not None

    async def step(self, action: dict[str, Any] | str) -> Any:
        """Apply one action; an ending reply is kept as `result`."""
        res = await self.client.step(action)
        self.actions += 1
        if res.terminated or res.truncated:
            self.result = res
        return res

    async def submit_to_the_end(self, max_submits: int = MAX_TASK_STEPS) -> Any:
        """Submit until the episode ends: once, or once per step left of a multi-step task
        (bounded: the server ends the episode after its last step)."""
        for _ in range(max_submits):
            res = await self.step(dict(SUBMIT))
            if self.ended:
                return res
        raise RuntimeError(f"the episode did not end after {max_submits} submits")


@dataclass
class EpisodeEnd:
    """How one episode ended."""

    outcome: Outcome
    #: the server's reward (scored), 0.0 (agent_failure) or None (masked)
    reward: float | None
    #: the session (None when the reset failed)
    session: LoopSession | None
    #: what `play` returned (e.g. "submitted", "turn_limit"); None when it failed
    ending: Any = None
    #: the environment's failure, when one ended the episode
    error: BaseException | None = None
    #: one of the agent's own steps (in `play`) ended it, not the loop's closing submits
    ended_in_play: bool = False

    @property
    def result(self) -> StepResult | None:
        """The reply that ended the episode (None when a failure did)."""
        return self.session.result if self.session is not None else None

    @property
    def code(self) -> str | None:
        return failure_code(self.error)

    @property
    def terminated(self) -> bool:
        return bool(self.result is not None and self.result.terminated)

    @property
    def truncated(self) -> bool:
        return bool(self.result is not None and self.result.truncated)


Play = Callable[[Any], Awaitable[Any]]


async def reset(
    client: Any,
    task_id: str,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    retries: int = 0,
) -> tuple[Any, Any]:
    """`client.reset`, retried up to `retries` times (with backoff) when refused as retryable
    (`capacity`, a lost connection)."""
    for attempt in range(retries + 1):
        try:
            if options:
                return await client.reset(task_id, seed=seed, options=options)
            return await client.reset(task_id, seed=seed)
        except Exception as exc:
            if getattr(exc, "retryable", False) and attempt < retries:
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            raise
    raise AssertionError("unreachable")


async def play_episode(
    client: Any,
    task_id: str,
    play: Play,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    reset_retries: int = 0,
    session_factory: Callable[[Any, dict[str, Any], dict[str, Any]], LoopSession] = LoopSession,
    on_start: Callable[[LoopSession], Awaitable[None]] | None = None,
) -> EpisodeEnd:
    """One episode of `task_id` on `client` (see the module docstring). `play(session)` takes
    the agent's actions through `session.step` and returns how it stopped; `on_start(session)`
    runs after the reset, before `play`. An environment failure ends the episode (classified,
    the episode closed on the server); any other exception propagates."""
    session: LoopSession | None = None
    try:
        obs, info = await reset(client, task_id, seed, options, reset_retries)
        session = session_factory(client, as_dict(obs), dict(info or {}))
        if on_start is not None:
            await on_start(session)
        ending = await play(session)
        ended_in_play = session.ended
        if not ended_in_play:
            await session.submit_to_the_end()
        assert session.result is not None
        return EpisodeEnd(
            "scored", float(session.result.reward), session, ending, ended_in_play=ended_in_play
        )
    except ENV_FAILURES as exc:
        outcome = classify(exc)
        if getattr(client, "in_episode", False):
            with contextlib.suppress(*ENV_FAILURES):
                await client.close()
        log.info("episode of %s ended %s: %s", task_id, outcome, exc)
        if session is not None:
            session.result = None  # a failure ended it, not a reply
        return EpisodeEnd(outcome, reward_of(outcome), session, None, exc)


def as_dict(obs: Any) -> dict[str, Any]:
    """An observation as a dict (the client's, a model's dump, or text as `output`)."""
    if obs is None:
        return {}
    if isinstance(obs, dict):
        return obs
    if hasattr(obs, "model_dump"):
        return dict(obs.model_dump())
    return {"output": str(obs)}


# -- many episodes at once ------------------------------------------------------------------------
@dataclass
class EpisodeRequest:
    """One episode for `run_episodes`: a task, a seed, reset options."""

    task_id: str
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EpisodeState:
    """What the agent callback sees: the task, the latest observation and the history."""

    request: EpisodeRequest
    index: int
    observation: dict[str, Any]
    info: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EpisodeResult:
    """One finished (or failed) episode. `outcome` says how it ended (see the module
    docstring): `reward` is the server's when `scored`, 0.0 for an `agent_failure`, None when
    `masked` (a lost connection, a server fault: never scored); `error` is the failure."""

    index: int
    task_id: str
    seed: int | None
    reward: float | None
    terminated: bool
    truncated: bool
    steps: list[dict[str, Any]]
    duration_s: float
    reset_info: dict[str, Any]
    error: BaseException | None = None
    outcome: Outcome = "scored"

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def code(self) -> str | None:
        """The wire code of the failure that ended it, if one did."""
        return failure_code(self.error)


#: An agent gets the episode state and returns the next action (dict or command string), or
#: None to submit. It may be a plain function or a coroutine function.
Agent = Callable[
    [EpisodeState], "dict[str, Any] | str | None | Awaitable[dict[str, Any] | str | None]"
]


class RecordingSession(LoopSession):
    """A `LoopSession` that keeps each action with its reply (the record `run_episodes` and
    `sandgym run` return)."""

    def __init__(self, client: Any, observation: dict[str, Any], info: dict[str, Any]) -> None:
        super().__init__(client, observation, info)
        self.steps: list[dict[str, Any]] = []

    async def step(self, action: dict[str, Any] | str) -> Any:
        res = await super().step(action)
        self.steps.append(
            {
                "action": to_action(action),
                "observation": res.observation,
                "reward": res.reward,
                "info": res.info,
            }
        )
        return res


async def run_episodes(
    url: str,
    episodes: Iterable[EpisodeRequest | str],
    agent: Agent,
    *,
    concurrency: int = 8,
    token: str | None = None,
    max_steps: int = 100,
    client_kwargs: dict[str, Any] | None = None,
) -> AsyncIterator[EpisodeResult]:
    """Play `episodes` with at most `concurrency` at once; yield each result as it finishes.

    Each worker keeps one connection for all its episodes. An agent returning None submits;
    after `max_steps` actions without an ending the episode is submitted to its end. A failure
    ends that episode (its `outcome` and `error` set, see `EpisodeResult`); other episodes
    carry on.
    """
    queue: asyncio.Queue[tuple[int, EpisodeRequest] | None] = asyncio.Queue()
    n = 0
    for i, ep in enumerate(episodes):
        queue.put_nowait((i, EpisodeRequest(ep) if isinstance(ep, str) else ep))
        n = i + 1
    results: asyncio.Queue[EpisodeResult | BaseException] = asyncio.Queue()
    workers_n = max(1, min(concurrency, n))
    for _ in range(workers_n):
        queue.put_nowait(None)

    async def worker() -> None:
        client = AsyncEnvClient(url, token, **(client_kwargs or {}))
        try:
            while (item := await queue.get()) is not None:
                idx, req = item
                await results.put(await _play(client, idx, req, agent, max_steps))
        except BaseException as exc:  # surfaced to the consumer, never swallowed
            await results.put(exc)
        finally:
            await client.close()

    tasks = [asyncio.create_task(worker()) for _ in range(workers_n)]
    try:
        for _ in range(n):
            item = await results.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _play(
    client: AsyncEnvClient, idx: int, req: EpisodeRequest, agent: Agent, max_steps: int
) -> EpisodeResult:
    """One episode of `run_episodes` through `play_episode`."""
    started = time.perf_counter()
    steps: list[dict[str, Any]] = []

    def recording(client: Any, observation: dict[str, Any], info: dict[str, Any]) -> LoopSession:
        session = RecordingSession(client, observation, info)
        session.steps = steps  # the agent's state reads the same list
        return session

    async def play(session: RecordingSession) -> str:
        state = EpisodeState(req, idx, session.observation, session.info, steps)
        while not session.ended and len(steps) < max_steps:
            action = agent(state)
            if inspect.isawaitable(action):
                action = await action
            res = await session.step(dict(SUBMIT) if action is None else action)
            state.observation, state.info = res.observation, res.info
        return "submitted" if session.ended else "turn_limit"

    end = await play_episode(
        client,
        req.task_id,
        play,
        seed=req.seed,
        options=req.options,
        session_factory=recording,
    )
    reset_info = end.session.info if end.session is not None else {}
    return EpisodeResult(
        idx, req.task_id, req.seed, end.reward, end.terminated, end.truncated, steps,
        time.perf_counter() - started, reset_info, error=end.error, outcome=end.outcome,
    )  # fmt: skip


__all__ = [
    "ENV_FAILURES",
    "Agent",
    "EpisodeRequest",
    "EpisodeResult",
    "EpisodeState",
    "RecordingSession",
    "run_episodes",
    "MAX_TASK_STEPS",
    "EpisodeEnd",
    "LoopSession",
    "Outcome",
    "Play",
    "as_dict",
    "classify",
    "failure_code",
    "play_episode",
    "reset",
    "reward_of",
]

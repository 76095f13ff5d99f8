"""`SyncEpisode`: one sandgym episode driven from synchronous code (the TRL and SkyRL doors).

Trainers call environments from plain functions; sandgym's client is asyncio. Every
`SyncEpisode` runs its `AsyncEnvClient` on one event loop shared by all of them, in a daemon
thread, so a batch of episodes costs one thread, not one per episode, and works whether or not
the caller has an event loop of its own. At interpreter exit an `atexit` hook tells the server to
close every episode still open (all at once, waiting at most `EXIT_CLOSE_TIMEOUT_S`; what is not
confirmed by then is left to the server's sweep) and stops the loop, so a script that never
closes its episodes still exits promptly.

Scores: the episode runs on the loop every runner shares (sandgym.client.episode_loop: its
`LoopSession`, its closing `submit_to_the_end`, its one classification of an ending), driven one
action at a time from synchronous code. `finish()` submits until the episode ends, so the task's
own verifier scores the state the policy left (as sandgym's own agents submit at their turn
limit); the reward is the one the server returns, never computed here. A failure the agent can
cause (the `agent` rows of the error-code table, sandgym.wire.codes: `action_timeout`,
`verifier_error`) ends the episode scored 0. Any other failure of the server, the sandbox or
the connection is raised as `InfrastructureError`, and the episode has no reward (`reward is
None`), so a trainer drops the rollout instead of scoring the policy for it. A refused action
(the table's `goes_on` codes: `invalid_message`, a bad path, an unknown kind) is the policy's
mistake, told to it, and the episode goes on.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from sandgym.client.env_client import AsyncEnvClient, ConnectionLostError, EnvError, StepResult
from sandgym.client.episode_loop import ENV_FAILURES, LoopSession, classify
from sandgym.client.episode_loop import reset as loop_reset
from sandgym.client.gym_env import THREAD_JOIN_TIMEOUT_S, stop_loop_thread
from sandgym.wire.codes import GOES_ON_CODES

T = TypeVar("T")

#: a refused action: the policy is told, the episode goes on (the table's `goes_on` codes; the
#: doors read this name, and `AGENT_CAUSABLE_CODES`, both from sandgym.wire.codes)
POLICY_ERROR_CODES = GOES_ON_CODES

log = logging.getLogger(__name__)

#: how long the exit hook waits, for all open episodes together, for the server's `close`
EXIT_CLOSE_TIMEOUT_S = 5.0

_loop: asyncio.AbstractEventLoop | None = None
_loop_thread: threading.Thread | None = None
_loop_lock = threading.Lock()
#: every episode made (weakly held): the exit hook closes those still open
_episodes: weakref.WeakSet[SyncEpisode] = weakref.WeakSet()


class EpisodeStateError(RuntimeError):
    """An action was sent with no episode running (before `reset`, or after it ended)."""


class InfrastructureError(RuntimeError):
    """The server or the sandbox failed (not the policy): the rollout should be dropped."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"sandgym infrastructure failure: {error}")
        #: the failure: an `EnvError` (its `code`), or a socket error the client did not wrap
        self.error = error


def _shared_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_thread
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="sandgym-episodes", daemon=True)
            thread.start()
            _loop, _loop_thread = loop, thread
        return _loop


@atexit.register
def _close_at_exit() -> None:
    """Close the episodes left open, waiting at most `EXIT_CLOSE_TIMEOUT_S` in all (atexit runs
    while daemon threads still do), then stop and close the shared loop."""
    with _loop_lock:
        loop, thread = _loop, _loop_thread
    if loop is None or loop.is_closed() or thread is None or not thread.is_alive():
        return
    clients = [ep._client for ep in list(_episodes)]

    async def close_all() -> None:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    fut = asyncio.run_coroutine_threadsafe(close_all(), loop)
    try:
        fut.result(EXIT_CLOSE_TIMEOUT_S)
    except Exception as exc:  # a timeout included: the server's sweep releases the rest
        fut.cancel()
        log.warning("sandgym episodes not confirmed closed at exit: %r", exc)
    stop_loop_thread(loop, thread, THREAD_JOIN_TIMEOUT_S)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the shared loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, _shared_loop()).result()


class SyncEpisode:
    """One episode at a time of a sandgym server, from synchronous code."""

    def __init__(
        self, server_url: str, token: str | None = None, *, max_output_chars: int = 4000
    ) -> None:
        self.server_url = server_url
        self.max_output_chars = max_output_chars
        self._client = AsyncEnvClient(server_url, token)
        _episodes.add(self)
        self.task_id: str | None = None
        self.seed: int | None = None
        self.running = False
        #: the reward of the step that ended the episode (None while it runs, or if it was
        #: closed without one)
        self.reward: float | None = None
        self.last: StepResult | None = None
        #: the wire code of the failure that ended the episode, if one did
        self.failure: str | None = None
        self._session: LoopSession | None = None

    @property
    def served_by(self) -> str:
        """The server this episode runs on (`server_url` itself, or with a fleet address the
        one placement chose at the last reset)."""
        return str(self._client.url)

    def reset(self, task_id: str, seed: int | None = None) -> str:
        """Start an episode (ending a running one); returns the task's instruction."""
        obs, info = run_sync(loop_reset(self._client, task_id, seed))
        self._session = LoopSession(self._client, obs, info)
        self.task_id, self.seed = task_id, seed
        self.running, self.reward, self.last, self.failure = True, None, None, None
        return str(obs.get("output", ""))

    def act(self, action: dict[str, Any] | str) -> StepResult:
        """Apply one ACTION; raises `EpisodeStateError` when no episode runs."""
        session = self._running_session()
        res: StepResult = self._drive(session.step(action))
        self.last = res
        if session.ended:
            self.running, self.reward = False, float(res.reward)
        return res

    def _running_session(self) -> LoopSession:
        if not self.running or self._session is None:
            raise EpisodeStateError(
                "no episode is running: the last one ended (submitted or truncated) or "
                "reset() was not called"
            )
        return self._session

    def _drive(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one step (or the closing submits) of the episode; a failure ends it as the loop
        classifies it: a refused action goes on (raised to the policy), the agent's failure is
        scored 0 (raised), anything else is `InfrastructureError` (no reward)."""
        try:
            return run_sync(coro)
        except ENV_FAILURES as exc:
            code = exc.code if isinstance(exc, EnvError) else None
            if code in POLICY_ERROR_CODES and not isinstance(exc, ConnectionLostError):
                raise
            self.running = False
            self.failure = code or type(exc).__name__
            if classify(exc) == "agent_failure":
                self.reward = 0.0
                raise
            raise InfrastructureError(exc) from exc

    def text(self, res: StepResult) -> str:
        """An observation as the text a model reads: output (cut to `max_output_chars`, keeping
        the tail) and the exit code."""
        out = str(res.observation.get("output", ""))
        if len(out) > self.max_output_chars:
            out = "[...]" + out[-self.max_output_chars :]
        code = res.observation.get("exit_code")
        return out if code is None else f"{out}\n[exit code {code}]"

    def finish(self, max_submits: int = 64) -> float:
        """The episode's reward: submits until it ends (a multi-step task scores each remaining
        step on the current state) and returns the server's reward; 0.0 when a failure the agent
        can cause ended it (`verifier_error` on these submits included); `InfrastructureError`
        when anything else did."""
        if self.running:
            session = self._running_session()
            try:
                self.last = self._drive(session.submit_to_the_end(max_submits))
                self.running, self.reward = False, float(self.last.reward)
            except EnvError:
                if self.reward is None:  # not the agent's failure: _drive scored it otherwise
                    raise
            except RuntimeError as exc:  # the loop's bound: still running after max_submits
                if isinstance(exc, InfrastructureError):
                    raise
                raise EpisodeStateError(
                    f"the episode did not end after {max_submits} submits"
                ) from exc
        if self.reward is None:
            raise EpisodeStateError(
                f"the episode of {self.task_id!r} ended without a reward "
                f"(failure: {self.failure or 'closed or never started'})"
            )
        return self.reward

    def close(self) -> None:
        """End the episode (if any) and close the connection."""
        self.running = False
        run_sync(self._client.close())

"""`SyncEpisode`: one sandgym episode driven from synchronous code (the TRL and SkyRL doors).

Trainers call environments from plain functions; sandgym's client is asyncio. Every
`SyncEpisode` runs its `AsyncEnvClient` on one event loop shared by all of them, in a daemon
thread, so a batch of episodes costs one thread, not one per episode, and works whether or not
the caller has an event loop of its own. At interpreter exit an `atexit` hook tells the server to
close every episode still open (all at once, waiting at most `EXIT_CLOSE_TIMEOUT_S`; what is not
confirmed by then is left to the server's sweep) and stops the loop, so a script that never
closes its episodes still exits promptly.

Scores (the policy of sandgym/trainer/failures.py): `finish()` submits until the episode ends, so the
task's own verifier scores the state the policy left (as sandgym's own agents submit at their
turn limit); the reward is the one the server returns, never computed here. An action that blew
its time limit (`action_timeout`) or a verifier that failed on what the agent left
(`verifier_error`) ends the episode scored 0: the agent can cause both. Any other failure of the
server, the sandbox or the connection is raised as `InfrastructureError`, and the episode has no
reward (`reward is None`), so a trainer drops the rollout instead of scoring the policy for it.
A refused action (`invalid_message`: a bad path, an unknown kind) is the policy's mistake, told
to it, and the episode goes on.
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

T = TypeVar("T")

#: failures the agent can cause: the episode ends scored 0 (sandgym/trainer/failures.py)
AGENT_CAUSABLE_CODES = frozenset({"action_timeout", "verifier_error"})
#: a refused action: the policy is told, the episode goes on
POLICY_ERROR_CODES = frozenset({"invalid_message"})

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

    def __init__(self, error: EnvError) -> None:
        super().__init__(f"sandgym infrastructure failure: {error}")
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
    loop.call_soon_threadsafe(loop.stop)
    thread.join(EXIT_CLOSE_TIMEOUT_S)
    if not loop.is_running():
        loop.close()


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

    def reset(self, task_id: str, seed: int | None = None) -> str:
        """Start an episode (ending a running one); returns the task's instruction."""
        obs, _info = run_sync(self._client.reset(task_id, seed=seed))
        self.task_id, self.seed = task_id, seed
        self.running, self.reward, self.last, self.failure = True, None, None, None
        return str(obs.get("output", ""))

    def act(self, action: dict[str, Any] | str) -> StepResult:
        """Apply one ACTION; raises `EpisodeStateError` when no episode runs."""
        if not self.running:
            raise EpisodeStateError(
                "no episode is running: the last one ended (submitted or truncated) or "
                "reset() was not called"
            )
        try:
            res = run_sync(self._client.step(action))
        except EnvError as exc:
            if exc.code in POLICY_ERROR_CODES and not isinstance(exc, ConnectionLostError):
                raise
            self.running, self.failure = False, exc.code
            if exc.code in AGENT_CAUSABLE_CODES and not isinstance(exc, ConnectionLostError):
                self.reward = 0.0
                raise
            raise InfrastructureError(exc) from exc
        self.last = res
        if res.terminated or res.truncated:
            self.running, self.reward = False, float(res.reward)
        return res

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
        step on the current state) and returns the server's reward."""
        for _ in range(max_submits):
            if not self.running:
                break
            self.act({"kind": "submit"})
        if self.running:
            raise EpisodeStateError(f"the episode did not end after {max_submits} submits")
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

"""`RemoteEnv`: a Gymnasium environment whose episodes run on a sandgym env server.

`import sandgym.client` registers it as `sandgym/Terminal-v0`:

    >>> import gymnasium, sandgym.client  # doctest: +SKIP
    >>> env = gymnasium.make("sandgym/Terminal-v0", server_url="ws://127.0.0.1:8765/v1/env",
    ...                      task_id="builtin/hello-file")  # doctest: +SKIP
    >>> obs, info = env.reset(seed=0)  # doctest: +SKIP
    >>> obs, reward, terminated, truncated, info = env.step("ls -la")  # doctest: +SKIP

Spaces:
- action: `Text` — a command line run in the episode's persistent shell. A full ACTION dict
  (`{"kind": "submit"}`, `{"kind": "keys", ...}`, ...) is accepted as well. `sample()` draws
  alphanumeric words, which a shell runs as harmless unknown commands.
- observation: `Dict(output=Text, screen=Text, image=Text, exit_code=Discrete(257, start=-1))`:
  the action's output, the rendered terminal screen, a base64 PNG for desktop tasks ("" when
  none), and the exit code (-1 when there is none). Text fields accept any characters; output
  longer than `max_output_chars` is cut.

It drives `AsyncEnvClient` from a private event loop in a daemon thread, so it works from plain
synchronous code and from inside another running event loop alike. Imports no server code.

Closing: `close()` tells the server to end the episode, waiting at most `close_timeout_s`. An env
the program never closes is closed at interpreter exit by an `atexit` hook (which holds the open
envs weakly, so an env the program drops is closed by its own finalizer instead): the server is
told `close` within `EXIT_CLOSE_TIMEOUT_S` for all of them together, and an episode it could not
reach in time is left to the server (a detached episode is released after its resume grace).
Nothing ever waits on a loop thread the interpreter has already stopped.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import string
import sys
import threading
import time
import weakref
from collections.abc import Coroutine
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeoutError
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sandgym.client.env_client import AsyncEnvClient
from sandgym.wire import protocol

T = TypeVar("T")

log = logging.getLogger(__name__)

#: How long the exit hook waits, for all forgotten envs together, for the server to confirm
#: `close`; what is not confirmed by then is left to the server's sweep.
EXIT_CLOSE_TIMEOUT_S = 5.0
#: How long a loop thread gets to stop once its loop is told to.
THREAD_JOIN_TIMEOUT_S = 2.0

#: Envs not closed yet (weakly held): `_close_forgotten` closes them at interpreter exit.
_open_envs: weakref.WeakSet[RemoteEnv] = weakref.WeakSet()

#: Server info keys that differ between otherwise identical steps (timings, sandbox identity;
#: the protocol's info models mark them). Gymnasium expects `info` to be deterministic for a seed,
#: so `RemoteEnv` keeps them out of `info` unless `volatile_info=True`; the full server info is
#: always in `last_server_info`.
VOLATILE_INFO_KEYS = protocol.VOLATILE_INFO_KEYS

#: What `Text.sample()` draws from: letters, digits and spaces only, never shell syntax.
SAMPLE_CHARSET = string.ascii_letters + string.digits + " "


class AnyText(spaces.Text):
    """A `Text` space that contains every string up to `max_length` characters.

    `spaces.Text` only contains strings over its sampling charset; terminal output holds any
    character, so membership here checks type and length only, while sampling keeps the safe
    charset.
    """

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"


class RemoteEnv(gym.Env[dict[str, Any], Any]):
    """A Gymnasium env backed by one websocket session of a sandgym server."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        server_url: str,
        task_id: str,
        token: str | None = None,
        render_mode: str | None = None,
        max_output_chars: int = 65_536,
        max_action_chars: int = 4096,
        request_timeout_s: float | None = 3600.0,
        close_timeout_s: float = 10.0,
        client_kwargs: dict[str, Any] | None = None,
        volatile_info: bool = False,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.server_url = server_url
        self.task_id = task_id
        self.max_output_chars = max_output_chars
        self.request_timeout_s = request_timeout_s
        self.close_timeout_s = close_timeout_s
        self.action_space = AnyText(
            max_length=max_action_chars, min_length=1, charset=SAMPLE_CHARSET
        )
        self.observation_space = spaces.Dict(
            {
                "output": AnyText(
                    max_length=max_output_chars, min_length=0, charset=SAMPLE_CHARSET
                ),
                "screen": AnyText(
                    max_length=max_output_chars, min_length=0, charset=SAMPLE_CHARSET
                ),
                "image": AnyText(max_length=64 * 1024 * 1024, min_length=0, charset=SAMPLE_CHARSET),
                "exit_code": spaces.Discrete(257, start=-1),
            }
        )
        self._client = AsyncEnvClient(server_url, token, **(client_kwargs or {}))
        self._last_obs: dict[str, Any] | None = None
        self.volatile_info = volatile_info
        self.last_server_info: dict[str, Any] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sandgym-remote-env", daemon=True
        )
        self._thread.start()
        _open_envs.add(self)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.request_timeout_s)

    def _convert(self, obs: dict[str, Any]) -> dict[str, Any]:
        code = obs.get("exit_code")
        return {
            "output": (obs.get("output") or "")[: self.max_output_chars],
            "screen": (obs.get("screen") or "")[: self.max_output_chars],
            "image": obs.get("image") or "",
            "exit_code": np.int64(-1 if code is None else max(-1, min(255, int(code)))),
        }

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        self.last_server_info = info
        if self.volatile_info:
            return info
        return {k: v for k, v in info.items() if k not in VOLATILE_INFO_KEYS}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start a new episode (ending the current one). `options["task_id"]` overrides the task;
        other options go to the server's reset."""
        super().reset(seed=seed)
        opts = dict(options or {})
        task_id = opts.pop("task_id", self.task_id)
        obs, info = self._call(self._client.reset(task_id, seed=seed, options=opts))
        self._last_obs = self._convert(obs)
        return self._last_obs, self._info(info)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply a command string or an ACTION dict; returns the Gymnasium five-tuple."""
        if not isinstance(action, str | dict):
            action = str(action)
        res = self._call(self._client.step(action))
        self._last_obs = self._convert(res.observation)
        return self._last_obs, res.reward, res.terminated, res.truncated, self._info(res.info)

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._last_obs is None:
            return None
        return self._last_obs["screen"] or self._last_obs["output"]

    def close(self) -> None:
        """End the episode on the server (waiting at most `close_timeout_s`; an episode not
        confirmed closed by then is left to the server's sweep) and stop the loop thread."""
        self._finish_close(self._begin_close(), self.close_timeout_s)
        super().close()

    def _begin_close(self) -> Future[None] | None:
        """Mark the env closed and send the server `close`; the future of that request, or None
        when there is nothing to wait on (already closed, or no live loop thread to run it)."""
        if self._closed:
            return None
        self._closed = True
        _open_envs.discard(self)
        if (
            sys.is_finalizing()  # daemon threads are frozen: nothing scheduled would run
            or not self._thread.is_alive()
            or threading.current_thread() is self._thread  # waiting here would deadlock
            or self._loop.is_closed()
        ):
            return None
        return asyncio.run_coroutine_threadsafe(self._client.close(), self._loop)

    def _finish_close(self, fut: Future[None] | None, timeout_s: float) -> None:
        """Wait at most `timeout_s` for the server's close, then stop the loop thread."""
        try:
            if fut is not None:
                try:
                    fut.result(timeout_s)
                except FuturesTimeoutError:
                    fut.cancel()
                    log.warning(
                        "sandgym env %s: the server did not confirm close within %.1f s; "
                        "its episode is left to the server's sweep",
                        self.task_id,
                        timeout_s,
                    )
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        stop_loop_thread(self._loop, self._thread, THREAD_JOIN_TIMEOUT_S)

    def __del__(self) -> None:  # a forgotten env must not leak its loop thread
        try:
            self.close()
        except Exception:
            pass


async def _cancel_pending(grace_s: float) -> None:
    """Cancel every other task of the running loop and give them `grace_s` to unwind; twice, as
    a task's cleanup may itself await (a websocket's closing handshake with a silent server)."""
    me = asyncio.current_task()
    for _ in range(2):
        tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=grace_s)


def stop_loop_thread(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, timeout_s: float
) -> None:
    """Stop `loop`, running in `thread`, within about `timeout_s`: its pending tasks are
    cancelled (a close the server never answered), then it is stopped, joined and closed. Never
    waits on a thread the interpreter has frozen (at finalization) or on the calling thread."""
    if loop.is_closed():
        return
    if sys.is_finalizing() or threading.current_thread() is thread:
        return  # a frozen (or the current) thread cannot be joined; the process is ending
    if thread.is_alive():
        fut = asyncio.run_coroutine_threadsafe(_cancel_pending(timeout_s / 4), loop)
        try:
            fut.result(timeout_s)
        except Exception as exc:  # the loop stops below all the same
            log.debug("cancelling the tasks of %s: %r", thread.name, exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
    if not loop.is_running():
        loop.close()


@atexit.register
def _close_forgotten() -> None:
    """Close, at interpreter exit, every env the program left open: `close` is sent to all of
    them at once and waited on for `EXIT_CLOSE_TIMEOUT_S` in all (atexit runs while the loop
    threads still do); each loop thread is then stopped."""
    envs = list(_open_envs)
    started = [(env, env._begin_close()) for env in envs]
    deadline = time.monotonic() + EXIT_CLOSE_TIMEOUT_S
    for env, fut in started:
        try:
            env._finish_close(fut, max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # one env's failure must not keep the others open
            log.warning("sandgym env %s: close at exit failed: %r", env.task_id, exc)

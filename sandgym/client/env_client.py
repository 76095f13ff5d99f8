"""`AsyncEnvClient`: the asyncio client of the env server (what the trainer uses).

It imports only the wire models (`sandgym.wire.protocol`), never server code. Requests are built
from those models (`reset.options` is validated as `ResetOptions` before it is sent) and every
reply is parsed as a `ServerReply`; `reset` and `step` still hand back plain dicts (what Gymnasium
users expect), with the typed `info` at `StepResult.typed_info` and `AsyncEnvClient.reset_info`.

Failures: an `error` reply raises `EnvError`, whose `code` is one of the protocol's `ErrorCode`s
(callers decide by the code, never by the message). A connection that dropped and could not be
resumed, or could not be opened, raises `ConnectionLostError` (an `EnvError`, so a caller that
only catches `EnvError` still catches it). `prewarm()` asks the server's pool to keep sandboxes
ready (`POST /v1/pool/prewarm`).

`url` may also be a fleet (`sandgym.client.fleet`: a comma-separated list of servers, or
`ray:ADDRESS`): each fresh connection goes to the server with the most room that answers (one
that refuses is held down and the next tried); a resume stays on the episode's server.

One client drives one episode at a time over one websocket. When the connection drops in the
middle of an episode, the client reconnects, sends `resume` with the session's token, and
resends the interrupted request under the same request_id; the server answers a resent step
from its cache, so no action ever runs twice.

Episodes are played through the one loop every runner shares, `sandgym.client.episode_loop`
(`run_episodes(...)` there plays many at once and yields each result as it finishes).

Example:
    >>> async def main(url):  # doctest: +SKIP
    ...     async with AsyncEnvClient(url) as env:
    ...         obs, info = await env.reset("builtin/hello-file", seed=0)
    ...         res = await env.step("echo hello > /app/hello.txt")
    ...         res = await env.step({"kind": "submit"})
    ...         return res.reward

Why over 400 lines: the reconnect-and-resend logic and the reply parsing share one connection's
state (the session, its token, the request in flight); split, that one state machine would be
spread over files.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import secrets
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from sandgym.client.fleet import (
    Fleet,
    FleetUnavailableError,
    is_ray_address,
    shared_fleet,
    ws_url_of,
)
from sandgym.wire.codes import retryable_for
from sandgym.wire.protocol import (
    CLOSE_UNAUTHORIZED,
    ERROR_CODES,
    ErrorCode,
    ErrorReply,
    HttpErrorBody,
    ObservationReply,
    PrewarmReply,
    PrewarmRequest,
    ResetInfo,
    ResetOptions,
    StepInfo,
    StepResultReply,
    parse_server_reply,
)

log = logging.getLogger(__name__)


class EnvError(Exception):
    """An `error` reply from the server: `code` (an `ErrorCode`), `message`, `retryable`."""

    def __init__(self, code: ErrorCode, message: str, retryable: bool = False) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"expected an error code in {ERROR_CODES}, got {code!r}")
        super().__init__(f"{code}: {message}")
        self.code: ErrorCode = code
        self.message = message
        self.retryable = retryable


class ConnectionLostError(EnvError):
    """The connection to the server dropped and could not be resumed, or could not be opened
    (refused, handshake refused, timed out). It is the network's doing, not the server's nor the
    sandbox's; `code` stays what earlier clients reported (`sandbox_lost` when an episode was
    running, since it is lost to this client, else `internal`) and `retryable` is True."""


@dataclass
class StepResult:
    """What `AsyncEnvClient.step` returns (the Gymnasium five-tuple, minus positional order)."""

    observation: dict[str, Any]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    def __iter__(self):  # type: ignore[no-untyped-def]
        """Unpacks like Gymnasium: `obs, reward, terminated, truncated, info = result`."""
        return iter((self.observation, self.reward, self.terminated, self.truncated, self.info))

    @property
    def typed_info(self) -> StepInfo:
        """`info` parsed as the protocol's `StepInfo`."""
        return StepInfo.model_validate(self.info)


def http_base(ws_url: str) -> str:
    """ws://host:port/v1/env -> http://host:port (where the HTTP ops endpoints are)."""
    url = ws_url.replace("wss://", "https://", 1).replace("ws://", "http://", 1)
    return url.split("/v1/", 1)[0].rstrip("/")


def to_action(action: dict[str, Any] | str) -> dict[str, Any]:
    """A command string is shorthand for `{"kind": "command", "command": ...}`."""
    if isinstance(action, str):
        return {"kind": "command", "command": action}
    if not isinstance(action, dict):
        raise TypeError(f"expected an action dict or a command string, got {type(action)!r}")
    return action


class AsyncEnvClient:
    """Asyncio client for `ws://HOST:PORT/v1/env`. One episode at a time per client."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        connect_timeout_s: float = 30.0,
        request_timeout_s: float | None = None,
        max_reconnects: int = 5,
        reconnect_backoff_s: float = 0.2,
        max_message_bytes: int | None = 64 * 1024 * 1024,
        ping_interval_s: float | None = 20.0,
    ) -> None:
        #: the servers behind a fleet address (None for one server's URL, used as given)
        self.fleet: Fleet | None = None
        if "," in url or is_ray_address(url):
            self.fleet = shared_fleet(url, token)
            url = ws_url_of(next(iter(self.fleet.servers)))
        self.url = url
        self.token = token
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_reconnects = max_reconnects
        self.reconnect_backoff_s = reconnect_backoff_s
        self.max_message_bytes = max_message_bytes
        self.ping_interval_s = ping_interval_s
        self.session_id: str | None = None
        self.resume_token: str | None = None
        #: the typed `info` of the latest reset
        self.reset_info: ResetInfo | None = None
        self.reconnects = 0
        self._ws: ClientConnection | None = None
        # request ids unique to this client: a client that resumes another's session (a
        # restarted trainer) must not send an id the server would take for a resend of the
        # other client's last request (and answer from its cache)
        prefix = secrets.token_hex(4)
        self._ids = (f"{prefix}-{n}" for n in itertools.count(1))
        self._lock = asyncio.Lock()

    # -- connection ----------------------------------------------------------------------------
    async def __aenter__(self) -> AsyncEnvClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the websocket (done lazily by the first request if not called). With a fleet
        and no episode to resume, on the best server that answers."""
        if self.fleet is None or self.session_id is not None:
            await self._connect_once()
            return
        try:
            servers = await self.fleet.candidates()
        except FleetUnavailableError as exc:
            raise ConnectionLostError(
                "internal",
                str(exc),
                retryable=retryable_for("episode", "internal", "connection_lost"),
            ) from exc
        failures = []
        for base in servers:
            self.url = ws_url_of(base)
            self.fleet.placed(base)  # before connecting: concurrent connects see it
            try:
                await self._connect_once()
            except BaseException as exc:
                self.fleet.unplace(base)
                # InvalidHandshake: a server dying under the handshake (no valid HTTP reply)
                if not isinstance(
                    exc, (OSError, TimeoutError, ConnectionLostError, InvalidHandshake)
                ):
                    raise
                self.fleet.mark_down(base, f"{type(exc).__name__}: {exc}")
                failures.append(f"{base}: {exc}")
                continue
            return
        raise ConnectionLostError(
            "internal",
            "expected a server of the fleet to accept the connection, found none: "
            + "; ".join(failures),
            retryable=retryable_for("episode", "internal", "connection_lost"),
        )

    async def _connect_once(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            self._ws = await asyncio.wait_for(
                connect(
                    self.url,
                    additional_headers=headers,
                    max_size=self.max_message_bytes,
                    ping_interval=self.ping_interval_s,
                    open_timeout=self.connect_timeout_s,
                    compression=None,  # observations are small; deflate costs more than it saves
                ),
                self.connect_timeout_s,
            )
        except InvalidStatus as exc:
            raise ConnectionLostError(
                "internal",
                f"websocket handshake refused: {exc}",
                retryable=retryable_for("episode", "internal", "connection_lost"),
            ) from exc

    @property
    def in_episode(self) -> bool:
        return self.session_id is not None

    async def close(self) -> None:
        """End the episode (if any) and close the connection."""
        ws = self._ws
        if ws is None:
            return
        try:
            if self.session_id is not None:
                await self._request({"type": "close"}, resumable=False)
        except (EnvError, ConnectionClosed, OSError):
            pass
        finally:
            self.session_id = self.resume_token = None
            self._ws = None
            await ws.close()

    async def drop_connection(self) -> None:
        """Close the socket without ending the episode (tests and failure drills use this)."""
        if self._ws is not None:
            await self._ws.close()

    # -- the episode API -------------------------------------------------------------------------
    async def reset(
        self,
        task_id: str,
        seed: int | None = None,
        options: ResetOptions | dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode of `task_id`; returns (observation, info). `options` is a
        `ResetOptions` or its dict; one that is not valid raises `EnvError("invalid_message")`
        without a round trip, as the server would."""
        try:
            opts = (
                options
                if isinstance(options, ResetOptions)
                else ResetOptions.model_validate(options or {})
            )
        except ValidationError as exc:
            raise EnvError("invalid_message", f"reset.options: {exc}") from exc
        msg = {
            "type": "reset",
            "task_id": task_id,
            "seed": seed,
            "options": opts.model_dump(exclude_unset=True),
        }
        reply = await self._request(msg, resumable=False)
        if not isinstance(reply, ObservationReply):
            raise _unexpected(reply, "observation")
        self.session_id = reply.session_id
        self.resume_token = reply.resume_token
        self.reset_info = ResetInfo.model_validate(reply.info)
        return reply.observation.model_dump(exclude_unset=True), reply.info

    async def resume(
        self, session_id: str, resume_token: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Attach this client to an episode the server kept (its session id and resume token,
        from the reset of another client, even of a process that is gone); returns (the last
        observation, info). `EnvError("no_episode")` when the server no longer has it."""
        msg = {"type": "resume", "session_id": session_id, "resume_token": resume_token}
        self.session_id, self.resume_token = session_id, resume_token
        try:
            reply = await self._request(msg, resumable=False)
        except BaseException:
            self.session_id = self.resume_token = None
            raise
        if not isinstance(reply, ObservationReply):
            self.session_id = self.resume_token = None
            raise _unexpected(reply, "observation")
        return reply.observation.model_dump(exclude_unset=True), reply.info

    async def step(self, action: dict[str, Any] | str) -> StepResult:
        """Apply one action (an ACTION dict, or a command string)."""
        reply = await self._request({"type": "step", "action": to_action(action)}, resumable=True)
        if not isinstance(reply, StepResultReply):
            raise _unexpected(reply, "step_result")
        result = StepResult(
            observation=reply.observation.model_dump(exclude_unset=True),
            reward=reply.reward,
            terminated=reply.terminated,
            truncated=reply.truncated,
            info=reply.info,
        )
        if result.terminated or result.truncated:
            self.session_id = self.resume_token = None
        return result

    async def replay(self, request_id: str) -> StepResult:
        """The reply to this session's request `request_id`, resent: the server answers a resend
        of a session's last request from its cache (or, while it still runs, with its reply
        when it ends) and never runs it again. For a client that resumed another's session (a
        restarted trainer): the resume's `info.last_request_id` names the last request."""
        msg = {"type": "step", "action": {"kind": "submit"}}
        reply = await self._request(msg, resumable=True, request_id=request_id)
        if not isinstance(reply, StepResultReply):
            raise _unexpected(reply, "step_result")
        if reply.terminated or reply.truncated:
            self.session_id = self.resume_token = None
        return StepResult(
            observation=reply.observation.model_dump(exclude_unset=True),
            reward=reply.reward,
            terminated=reply.terminated,
            truncated=reply.truncated,
            info=reply.info,
        )

    async def prewarm(
        self, task_ids: list[str], count: int = 1, *, timeout_s: float = 2.0
    ) -> PrewarmReply:
        """Ask the server's pool to keep `count` sandboxes ready for each task's environment
        (`POST /v1/pool/prewarm`, with this client's token). A refusal raises `EnvError` with
        the server's code (`unknown_task` for an id it does not serve); an unreachable server
        raises `ConnectionLostError`."""
        import httpx  # lazy: only prewarm callers pay for it

        body = PrewarmRequest(task_ids=task_ids, count=count)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = f"{http_base(self.url)}/v1/pool/prewarm"
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as http:
                r = await http.post(url, json=body.model_dump(), headers=headers)
        except httpx.HTTPError as exc:
            raise ConnectionLostError(
                "internal",
                f"prewarm: {url} unreachable: {exc!r}",
                retryable=retryable_for("episode", "internal", "connection_lost"),
            ) from exc
        if r.status_code >= 400:
            try:
                err = HttpErrorBody.model_validate_json(r.content)
            except ValidationError:
                code: ErrorCode = "unauthorized" if r.status_code in (401, 403) else "internal"
                raise EnvError(code, f"prewarm: HTTP {r.status_code}: {r.text[:200]}") from None
            raise EnvError(err.code, err.message, err.retryable)
        return PrewarmReply.model_validate_json(r.content)

    # -- plumbing --------------------------------------------------------------------------------
    async def _request(
        self, msg: dict[str, Any], *, resumable: bool, request_id: str | None = None
    ) -> ObservationReply | StepResultReply | Any:
        async with self._lock:
            msg["request_id"] = request_id or next(self._ids)
            text = json.dumps(msg)
            attempt = 0
            while True:
                try:
                    if self._ws is None:
                        await self.connect()
                    return await self._roundtrip(text, msg["request_id"])
                except (ConnectionClosed, OSError) as exc:
                    self._raise_if_unauthorized(exc)
                    # A reset or close is not resent: a reset would orphan (the server reaps
                    # it), a close after a drop is moot.
                    if not resumable or self.session_id is None or attempt >= self.max_reconnects:
                        self._ws = None
                        code: ErrorCode = "sandbox_lost" if self.session_id else "internal"
                        raise ConnectionLostError(
                            code,
                            f"connection to {self.url} lost: {exc!r}",
                            retryable=retryable_for("episode", code, _lost_condition(code)),
                        ) from exc
                    attempt += 1
                    await self._reconnect_and_resume(attempt)

    async def _roundtrip(self, text: str, request_id: str) -> Any:
        ws = self._ws
        assert ws is not None
        await ws.send(text)
        while True:
            raw = await asyncio.wait_for(ws.recv(), self.request_timeout_s)
            try:
                reply = parse_server_reply(raw)
            except ValidationError as exc:
                raise EnvError(
                    "internal", f"the server sent a reply this client cannot read: {exc}"
                ) from exc
            rid = reply.request_id
            if rid is not None and rid != request_id:
                continue  # a stale reply to a request given up on before a reconnect
            if isinstance(reply, ErrorReply):
                if reply.code in ("sandbox_lost", "no_episode"):
                    self.session_id = self.resume_token = None
                raise EnvError(reply.code, reply.message, reply.retryable)
            return reply

    def _raise_if_unauthorized(self, exc: BaseException) -> None:
        rcvd = getattr(exc, "rcvd", None)
        if rcvd is not None and rcvd.code == CLOSE_UNAUTHORIZED:
            self._ws = None
            raise EnvError("unauthorized", rcvd.reason or "bearer token refused") from exc

    async def _reconnect_and_resume(self, attempt: int) -> None:
        self.reconnects += 1
        delay = self.reconnect_backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random())
        log.info("connection dropped; resuming session %s in %.2fs", self.session_id, delay)
        await asyncio.sleep(delay)
        if self._ws is not None:
            await self._ws.close()
        self._ws = None
        try:
            await self.connect()
        except (OSError, ConnectionClosed, TimeoutError, EnvError):
            return  # the caller's loop retries (or gives up after max_reconnects)
        rid = f"resume-{attempt}-{next(self._ids)}"
        resume = {
            "type": "resume",
            "request_id": rid,
            "session_id": self.session_id,
            "resume_token": self.resume_token,
        }
        try:
            await self._roundtrip(json.dumps(resume), rid)
        except (ConnectionClosed, OSError):
            self._ws = None


def _lost_condition(code: ErrorCode) -> str | None:
    """The table's condition for a lost connection reported as `code` (sandgym.wire.codes)."""
    return "connection_lost" if code == "internal" else None


def _unexpected(reply: Any, expected: str) -> EnvError:
    return EnvError(
        "internal", f"expected a {expected!r} reply, got {getattr(reply, 'type', reply)!r}"
    )


__all__ = [
    "AsyncEnvClient",
    "ConnectionLostError",
    "EnvError",
    "StepResult",
    "http_base",
    "to_action",
]

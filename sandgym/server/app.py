"""The FastAPI application: websocket `/v1/env` and the HTTP ops endpoints.

`create_app(settings, backend=None)` builds an app whose lifespan starts an `EnvService`
(backend, warm pool, task registry, session sweeper) and drains it on shutdown.

The websocket loop is receive -> validate -> dispatch -> reply. Frames are read concurrently
with handling, so a second request while one is in flight is answered at once with an error
(`invalid_message`, `retryable: true`) instead of queueing behind a long command.

HTTP: `GET /healthz` (never authenticated), `GET /metrics`, `GET /v1/tasks`, `GET /v1/pool`,
`GET /v1/sessions`, `POST /v1/pool/prewarm {"task_ids": [...], "count": N}`, and the sandbox API
under `/v1/sandboxes` (protocol 1.2, `sandgym.server.sandbox_api`). With a token set,
all but `/healthz` need `Authorization: Bearer T` (or `?token=T`); a websocket without it is
accepted and closed at once with code 4401.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from sandgym.sandboxes import SandboxBackend
from sandgym.server.errors import BusyError, MessageTooLargeError, to_wire_error
from sandgym.server.fastws import DIRECT_EXTENSION
from sandgym.server.openenv_wire import OPENENV_PATH, create_openenv_app
from sandgym.server.sandbox_api import SandboxApi, sandbox_router
from sandgym.server.sessions import EnvService, Session
from sandgym.server.settings import ServerSettings
from sandgym.wire.protocol import (
    CLOSE_UNAUTHORIZED,
    CloseMsg,
    ErrorReply,
    HttpErrorBody,
    PrewarmReply,
    PrewarmRequest,
    ResetMsg,
    ResumeMsg,
    SessionsReply,
    StepMsg,
    parse_client_message,
)

log = logging.getLogger(__name__)

_REQUEST_ID = re.compile(rb'"request_id"\s*:\s*"((?:[^"\\]|\\.){0,200})"')


def _request_id_of(raw: bytes) -> str | None:
    """Best-effort request_id of a frame that failed validation, so the error can echo it."""
    m = _REQUEST_ID.search(raw)
    if m is None:
        return None
    try:
        import json

        value = json.loads(b'"' + m.group(1) + b'"')
        return value if isinstance(value, str) else None
    except ValueError:
        return None


def _reply_json(reply: BaseModel) -> str:
    """A reply as JSON text. A string holding a lone surrogate (a client may send one as a
    `\\udXXX` escape, e.g. in its request_id, and it is echoed back) cannot be encoded as UTF-8;
    such a reply goes out with every non-ASCII character escaped instead of killing the
    connection."""
    try:
        return reply.model_dump_json()
    except PydanticSerializationError:
        import json

        return json.dumps(reply.model_dump(mode="json"), ensure_ascii=True)


class Connection:
    """One websocket: at most one episode, at most one request being handled."""

    def __init__(self, ws: WebSocket, service: EnvService) -> None:
        self.ws = ws
        self.service = service
        self.session: Session | None = None
        self._handler: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        # The ASGI callables under the Starlette wrapper (its state checks hold by construction
        # here: accepted before `serve`, and nothing is read after the disconnect message).
        self._raw_send = ws._send
        self._raw_receive = ws._receive
        self._open = True
        self._send_now: Callable[[str], bool] | None = None  # fastws: write a reply at once

    @property
    def open(self) -> bool:
        """False once the peer is gone (a late reply is then dropped, and cached)."""
        return self._open

    async def serve(self) -> None:
        # Under sandgym's own websocket protocol (sandgym/server/fastws.py) whole messages are
        # handed to `_on_direct_message` as they are parsed, without the ASGI receive queue;
        # the queue then carries only the disconnect (and the messages of a connection that
        # protocol handed back to uvicorn's code path).
        direct = self.ws.scope.get("extensions", {}).get(DIRECT_EXTENSION)
        if direct is not None:
            self._send_now = direct["send_now"]
            direct["set_receiver"](self._on_direct_message)
        try:
            while True:
                frame = await self._raw_receive()
                if frame["type"] == "websocket.disconnect":
                    break
                raw = frame.get("bytes")
                refused = self._on_message(frame.get("text") or "" if raw is None else raw)
                if refused is not None:
                    await self._reply_error(*refused)
        except WebSocketDisconnect:
            pass
        finally:
            self._open = False
            # The handler keeps running: its result is cached for a resend after `resume`.
            self.service.detach(self)

    def _on_direct_message(self, data: bytes) -> None:
        refused = self._on_message(data)
        if refused is not None and self._open:
            # At once, in order: the protocol stops reading while replies back up.
            assert self._send_now is not None
            if not self._send_now(_reply_json(self._error_reply(*refused))):
                self._open = False

    def _on_message(self, data: str | bytes) -> tuple[str | None, BaseException] | None:
        """One whole client message: validated, then handled by a task of its own, so the
        next message is read (and refused as busy) while a long command runs. Returns the
        (request_id, error) to answer instead, when it is refused."""
        raw = data.encode() if isinstance(data, str) else data
        max_bytes = self.service.settings.max_message_bytes
        if len(raw) > max_bytes:
            return _request_id_of(raw[:4096]), MessageTooLargeError(
                f"message of {len(raw)} bytes exceeds max_message_bytes={max_bytes}"
            )
        try:
            msg = parse_client_message(raw)
        except ValidationError as exc:
            # Without its traceback: this frame would hold the error that holds the frame, a
            # reference cycle per refused message left to the cyclic collector.
            return _request_id_of(raw), exc.with_traceback(None)
        if self._handler is not None and not self._handler.done():
            return msg.request_id, BusyError(
                "a request is already being handled on this connection; send one request at a time"
            )
        self._handler = asyncio.create_task(self._handle(msg))
        return None

    async def _handle(self, msg: ResetMsg | StepMsg | CloseMsg | ResumeMsg) -> None:
        svc = self.service
        try:
            if isinstance(msg, StepMsg):
                reply: BaseModel = await svc.step(self, msg)
            elif isinstance(msg, ResetMsg):
                reply = await svc.reset(self, msg)
            elif isinstance(msg, CloseMsg):
                reply = await svc.close(self, msg)
            else:
                reply = await svc.resume(self, msg)
        except Exception as exc:
            await self._reply_error(msg.request_id, exc)
            return
        await self._send(_reply_json(reply))

    def _error_reply(self, request_id: str | None, exc: BaseException) -> ErrorReply:
        err = to_wire_error(exc)
        self.service.metrics.errors_by_code[err.code].inc()
        return ErrorReply(
            request_id=request_id, code=err.code, message=err.message, retryable=err.retryable
        )

    async def _reply_error(self, request_id: str | None, exc: BaseException) -> None:
        await self._send(_reply_json(self._error_reply(request_id, exc)))

    async def _send(self, text: str) -> None:
        if not self._open:
            return
        if self._send_now is not None:
            # fastws writes whole frames at once, in call order (it stops reading while
            # replies back up, so nothing piles up behind a slow reader).
            if not self._send_now(text):
                self._open = False
            return
        # Straight to the ASGI send (Starlette's WebSocket.send only re-checks its state
        # machine); the lock keeps replies whole and in order if the server's send waits.
        message = {"type": "websocket.send", "text": text}
        async with self._send_lock:
            try:
                await self._raw_send(message)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self._open = False  # the peer is gone; the reply is cached for a resend


ENV_PATH = "/v1/env"


class _EnvServerApp(FastAPI):
    """The FastAPI app, with one shortcut: a websocket to ENV_PATH goes straight to its
    endpoint instead of through a dozen middleware and routing layers (about a tenth of the
    server's CPU per connection in the sessions benchmark). The route stays registered, so
    schema, route listings and tests see it; lifespan and HTTP are FastAPI's as before."""

    env_endpoint: Callable[[WebSocket], Awaitable[None]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "websocket"
            and scope["path"] == ENV_PATH
            and self.env_endpoint is not None
        ):
            await self.env_endpoint(WebSocket(scope, receive, send))
            return
        await super().__call__(scope, receive, send)


def create_app(
    settings: ServerSettings | None = None, backend: SandboxBackend | None = None
) -> FastAPI:
    """Build the server app. `backend` overrides `settings.backend` (tests pass a fake one)."""
    settings = settings or ServerSettings()
    service = EnvService(settings, backend)
    sandbox_api = SandboxApi(service)  # the sandbox API (protocol 1.2), over the same pool

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        await sandbox_api.start()
        try:
            yield
        finally:
            await asyncio.shield(sandbox_api.stop())
            await service.stop()

    # With a token, the schema and docs pages are not served: FastAPI would serve them
    # unauthenticated, and the contract says every endpoint but /healthz needs the token.
    hidden: dict[str, Any] = (
        {"openapi_url": None, "docs_url": None, "redoc_url": None} if settings.token else {}
    )
    app = _EnvServerApp(title="sandgym env server", version="1", lifespan=lifespan, **hidden)
    app.state.service = service
    app.state.sandbox_api = sandbox_api
    app.state.settings = settings

    def _token_ok(header: str | None, query: str | None) -> bool:
        if settings.token is None:
            return True
        given = None
        if header and header.lower().startswith("bearer "):
            given = header[7:].strip()
        elif query:
            given = query
        return given is not None and secrets.compare_digest(given, settings.token)

    def require_token(request: Request) -> None:
        if not _token_ok(request.headers.get("authorization"), request.query_params.get("token")):
            raise HTTPException(
                status_code=401,
                detail="unauthorized: expected header 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    auth = [Depends(require_token)]

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "backend": service.backend.name if service.backend else None,
            "sessions": len(service.sessions),
        }

    @app.get("/metrics", dependencies=auth)
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/tasks", dependencies=auth)
    async def list_tasks() -> dict[str, Any]:
        ids = service.task_ids()
        errors = getattr(service.tasks, "errors", {}) if service.tasks is not None else {}
        return {
            "count": len(ids),
            "tasks": ids,
            "errors": [{"path": p, "error": m} for p, m in errors.items()],
        }

    @app.get("/v1/pool", dependencies=auth)
    async def pool() -> dict[str, Any]:
        return service.pool.snapshot().model_dump() if service.pool else {}

    @app.get("/v1/sessions", dependencies=auth)
    async def sessions() -> SessionsReply:
        view = service.sessions_view()
        return SessionsReply(
            count=len(view),
            resetting=service.resetting,
            max_sessions=settings.max_sessions,
            sessions=view,
        )

    @app.post("/v1/pool/prewarm", dependencies=auth)
    async def prewarm(body: PrewarmRequest) -> JSONResponse:
        assert service.pool is not None and service.tasks is not None
        pairs = []
        for task_id in body.task_ids:
            try:
                pairs.append((service.spec_for(service.tasks.get(task_id)), body.count))
            except Exception as exc:
                err = to_wire_error(exc)
                return JSONResponse(
                    HttpErrorBody(**err._asdict()).model_dump(),
                    status_code=404 if err.code == "unknown_task" else 500,
                )
        await service.pool.prewarm(pairs)
        return JSONResponse(PrewarmReply(scheduled=len(pairs), count=body.count).model_dump())

    @app.websocket(ENV_PATH)
    async def env(ws: WebSocket) -> None:
        await ws.accept()
        if settings.token is not None and not _token_ok(
            ws.headers.get("authorization"), ws.query_params.get("token")
        ):
            service.metrics.errors_by_code["unauthorized"].inc()
            await ws.close(code=CLOSE_UNAUTHORIZED, reason="unauthorized: bearer token required")
            return
        service.connections += 1
        try:
            await Connection(ws, service).serve()
        finally:
            service.connections -= 1

    app.include_router(sandbox_router(sandbox_api, _token_ok))
    app.env_endpoint = env
    # OpenEnv's wire protocol over the same episodes (sandgym/server/openenv_wire.py).

    app.mount(
        OPENENV_PATH,
        create_openenv_app(
            service,
            settings.openenv_max_concurrent_envs or settings.max_sessions,
            _token_ok,
            hide_docs=settings.token is not None,
        ),
    )
    return app

"""sandgym's episodes on OpenEnv's wire protocol: a sub-app mounted at `/openenv`.

OpenEnv's released clients (`openenv.core.GenericEnvClient`, any `EnvClient` subclass, TRL's
OpenEnv path) speak to `BASE/ws` and to plain HTTP routes under BASE. With BASE =
`http://HOST:PORT/openenv` they run sandgym episodes unchanged, with the server's pool, resume
and the task's own verifier behind them. The shapes are those of `openenv==0.10.0`
(`openenv/core/env_server/http_server.py` and `types.py`), re-declared here as typed models so
the server never imports OpenEnv:

- `/ws`: `{"type": "reset", "data": {"task_id": ..., "seed": ..., "options": {...}}}`,
  `{"type": "step", "data": ACTION}`, `{"type": "state"}`, `{"type": "close"}`; replies
  `{"type": "observation", "data": {"observation", "reward", "done", "metadata"}}`,
  `{"type": "state", "data": {...}}` or `{"type": "error", "data": {"message", "code"}}` with
  OpenEnv's `WSErrorCode`s (plus `sandgym_code` and `retryable`). One socket holds one episode
  at a time; at most `max_concurrent_envs` sockets are open (`ServerSettings.
  openenv_max_concurrent_envs`, default `max_sessions`): beyond it the socket gets
  `CAPACITY_REACHED` and is closed, as OpenEnv's server does. A socket that drops without
  `close` leaves its episode for `resume_grace_s`; `/ws?session_id=S&resume_token=T` (both
  from the reset's `metadata`) re-attaches it.
- HTTP, stateless as OpenEnv's is (each request gets a fresh environment): `POST /reset`
  starts an episode, returns its first observation and ends it; `POST /step` plays the one
  action in a fresh episode of `task_id` (a body field) and ends it; `GET /state`, `/health`,
  `/metadata`, `/schema`; `POST /mcp` answers JSON-RPC "method not found" (no MCP tools).

`done` is `terminated or truncated`; `metadata` keeps both and sandgym's `info`. An action is
sandgym's ACTION dict (`{"kind": "command", "command": "ls"}`, `{"kind": "submit"}`, ...);
the `metadata` key OpenEnv's typed actions carry is dropped before validation.
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Body, Depends, FastAPI, HTTPException, Request, WebSocket
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.websockets import WebSocketDisconnect

from sandgym.server.errors import InvalidMessageError, to_wire_error
from sandgym.wire.protocol import (
    CLOSE_UNAUTHORIZED,
    Action,
    CloseMsg,
    Observation,
    ResetMsg,
    ResetOptions,
    ResumeMsg,
    StepMsg,
    parse_action,
)

if TYPE_CHECKING:
    from sandgym.server.episode_table import EpisodeConnection
    from sandgym.server.sessions import EnvService, Session

log = logging.getLogger(__name__)

OPENENV_PATH = "/openenv"
#: the OpenEnv release whose wire shapes this module follows (tests/e2e/test_openenv_wire.py
#: drives it with that release's own client and validator)
OPENENV_VERSION = "0.10.0"
#: the OpenAPI info.version OpenEnv's servers declare (its validator reads the runtime
#: standard's profile, openenv-http/1.x, off it)
OPENENV_HTTP_API_VERSION = "1.0.0"

# OpenEnv's `WSErrorCode` values.
WSCode = Literal[
    "INVALID_JSON",
    "UNKNOWN_TYPE",
    "VALIDATION_ERROR",
    "EXECUTION_ERROR",
    "CAPACITY_REACHED",
    "FACTORY_ERROR",
    "SESSION_ERROR",
]


class OpenEnvResetData(BaseModel):
    """`reset`'s `data` (ws) or body (HTTP): which task, which seed."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(description="the sandgym task to run, e.g. builtin/hello-file")
    seed: int | None = Field(None, ge=0, description="the task instance's seed")
    episode_id: str | None = Field(
        None, max_length=255, description="OpenEnv's episode id (echoed in `state`)"
    )
    options: ResetOptions = Field(default_factory=ResetOptions, description="sandgym's options")


class OpenEnvStepBody(BaseModel):
    """`POST /step`'s body: OpenEnv's StepRequest, plus the task of the one-action episode."""

    model_config = ConfigDict(extra="forbid")

    action: dict[str, Any] = Field(description="a sandgym ACTION dict")
    task_id: str = Field(description="the task of the fresh episode the action runs in")
    seed: int | None = Field(None, ge=0)
    timeout_s: float | None = Field(None, gt=0, description="a command action's timeout")
    request_id: str | None = Field(None, max_length=255)


class OpenEnvObservation(BaseModel):
    """`data.observation`: sandgym's observation fields plus OpenEnv's nested `metadata`."""

    output: str
    exit_code: int | None
    screen: str
    image: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class OpenEnvResult(BaseModel):
    """OpenEnv's serialized observation (`serialize_observation`): the ws `data` and the HTTP
    /reset and /step body."""

    observation: OpenEnvObservation
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)


class OpenEnvState(BaseModel):
    """`state`: OpenEnv's State fields (`episode_id`, `step_count`) and sandgym's session."""

    episode_id: str | None = None
    step_count: int = 0
    task_id: str | None = None
    session_id: str | None = None
    done: bool = False


class OpenEnvMetadata(BaseModel):
    """`GET /metadata` (OpenEnv's EnvironmentMetadata)."""

    name: str
    description: str
    version: str | None = None
    documentation_url: str | None = None


def _result(obs: Observation, reward: float | None, done: bool, meta: dict[str, Any]) -> Any:
    o = OpenEnvObservation(**obs.model_dump(), metadata=meta)
    return OpenEnvResult(observation=o, reward=reward, done=done, metadata=meta).model_dump()


def _error(code: WSCode, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def _ws_error(exc: BaseException) -> str:
    """An exception as OpenEnv's error frame; the code sandgym's own protocol would give rides
    along as `sandgym_code` (callers decide by code, never by message)."""
    err = to_wire_error(exc)
    code: WSCode = {"invalid_message": "VALIDATION_ERROR", "capacity": "CAPACITY_REACHED"}.get(
        err.code, "EXECUTION_ERROR"
    )  # type: ignore[assignment]
    return _error(code, err.message, sandgym_code=err.code, retryable=err.retryable)


def _action(data: dict[str, Any]) -> Any:
    """A sandgym ACTION from an OpenEnv action payload (its typed Action's `metadata` dropped)."""
    if not isinstance(data, dict):
        raise InvalidMessageError(f"expected an ACTION object, got {type(data).__name__}")
    return parse_action({k: v for k, v in data.items() if k != "metadata"})


class WireConnection:
    """What `EnvService` needs of a connection (`session`, `open`: an `EpisodeConnection`), for
    one OpenEnv socket or one stateless HTTP request."""

    def __init__(self) -> None:
        self.session: Session | None = None
        self.open = True
        self.episode_id: str | None = None
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:12]

    def next_id(self) -> str:
        # Unique across sockets: a resumed episode answers a step whose request_id equals the
        # last one it handled from its cache (sessions.py), so ids must never repeat.
        return f"openenv-{self._prefix}-{next(self._ids)}"

    def as_connection(self) -> EpisodeConnection:
        # EnvService reads and writes only `session` and `open` of a connection.
        return self


async def _reset(svc: EnvService, conn: WireConnection, data: OpenEnvResetData) -> Any:
    msg = ResetMsg(
        request_id=conn.next_id(), task_id=data.task_id, seed=data.seed, options=data.options
    )
    reply = await svc.reset(conn.as_connection(), msg)
    conn.episode_id = data.episode_id or reply.session_id
    meta = {
        "session_id": reply.session_id,
        "resume_token": reply.resume_token,
        "task_id": data.task_id,
        "seed": data.seed,
        "info": reply.info,
    }
    return _result(reply.observation, None, False, meta)


async def _step(svc: EnvService, conn: WireConnection, action: Any) -> Any:
    reply = await svc.step(conn.as_connection(), StepMsg(request_id=conn.next_id(), action=action))
    meta = {"terminated": reply.terminated, "truncated": reply.truncated, "info": reply.info}
    return _result(reply.observation, reply.reward, reply.terminated or reply.truncated, meta)


def _state(conn: WireConnection) -> dict[str, Any]:
    s = conn.session
    return OpenEnvState(
        episode_id=conn.episode_id,
        step_count=s.steps if s is not None else 0,
        task_id=s.task_id if s is not None else None,
        session_id=s.id if s is not None else None,
        done=s.done if s is not None else False,
    ).model_dump()


async def _end(svc: EnvService, conn: WireConnection) -> None:
    if conn.session is not None:
        await svc.close(conn.as_connection(), CloseMsg(request_id=conn.next_id()))


_ACTION_SCHEMA = TypeAdapter(Action).json_schema()  # type: ignore[arg-type]


def create_openenv_app(
    service: EnvService,
    max_concurrent_envs: int,
    token_ok: Callable[[str | None, str | None], bool],
    *,
    hide_docs: bool,
) -> FastAPI:
    """The OpenEnv wire sub-app over `service` (mounted at OPENENV_PATH by sandgym/server/app.py)."""
    hidden: dict[str, Any] = (
        {"openapi_url": None, "docs_url": None, "redoc_url": None} if hide_docs else {}
    )
    app = FastAPI(
        title="sandgym on OpenEnv's wire protocol", version=OPENENV_HTTP_API_VERSION, **hidden
    )
    open_sockets = 0

    def require_token(request: Request) -> None:
        if not token_ok(request.headers.get("authorization"), request.query_params.get("token")):
            raise HTTPException(
                status_code=401,
                detail="unauthorized: expected header 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    auth = [Depends(require_token)]

    def http_error(exc: BaseException) -> HTTPException:
        err = to_wire_error(exc)
        status = {"invalid_message": 422, "unknown_task": 404, "capacity": 503}.get(err.code, 500)
        return HTTPException(status_code=status, detail={"code": err.code, "message": err.message})

    @app.get("/health", dependencies=auth)
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata", dependencies=auth)
    async def metadata() -> OpenEnvMetadata:
        return OpenEnvMetadata(
            name="sandgym",
            description="sandgym terminal and desktop episodes: reset with data.task_id "
            "(GET /v1/tasks lists them), step with sandgym ACTION dicts, reward from the "
            "task's own verifier on {'kind': 'submit'}",
            version=OPENENV_VERSION,
        )

    @app.get("/schema", dependencies=auth)
    async def schema() -> dict[str, Any]:
        return {
            "action": _ACTION_SCHEMA,
            "observation": OpenEnvObservation.model_json_schema(),
            "state": OpenEnvState.model_json_schema(),
            "reset_observation": OpenEnvObservation.model_json_schema(),
        }

    @app.get("/state", dependencies=auth)
    async def state() -> OpenEnvState:
        return OpenEnvState()  # stateless HTTP: a fresh environment's state

    @app.post("/reset", dependencies=auth)
    async def reset(body: OpenEnvResetData = Body(...)) -> OpenEnvResult:
        conn = WireConnection()
        try:
            result = await _reset(service, conn, body)
        except Exception as exc:
            raise http_error(exc) from exc
        finally:
            await _end(service, conn)
        return OpenEnvResult.model_validate(result)

    @app.post("/step", dependencies=auth)
    async def step(body: OpenEnvStepBody) -> OpenEnvResult:
        conn = WireConnection()
        try:
            action = _action(body.action)
            if body.timeout_s is not None and getattr(action, "kind", None) == "command":
                action.timeout_s = body.timeout_s
            await _reset(service, conn, OpenEnvResetData(task_id=body.task_id, seed=body.seed))
            result = await _step(service, conn, action)
        except Exception as exc:
            raise http_error(exc) from exc
        finally:
            await _end(service, conn)
        return OpenEnvResult.model_validate(result)

    @app.post("/mcp", dependencies=auth)
    async def mcp(request: Request) -> dict[str, Any]:
        try:
            rid = (await request.json()).get("id")
        except (ValueError, AttributeError):
            rid = None
        return {
            "jsonrpc": "2.0",
            "id": rid,
            "error": {"code": -32601, "message": "sandgym offers no MCP tools; use /ws"},
        }

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        nonlocal open_sockets
        await websocket.accept()
        q = websocket.query_params
        if not token_ok(websocket.headers.get("authorization"), q.get("token")):
            await websocket.close(CLOSE_UNAUTHORIZED, "unauthorized: bearer token required")
            return
        if open_sockets >= max_concurrent_envs:
            await websocket.send_text(
                _error(
                    "CAPACITY_REACHED",
                    f"server is at capacity: {open_sockets} OpenEnv sessions open, "
                    f"max_concurrent_envs={max_concurrent_envs}",
                    active_sessions=open_sockets,
                    max_sessions=max_concurrent_envs,
                )
            )
            await websocket.close()
            return
        open_sockets += 1
        service.connections += 1
        conn = WireConnection()
        closed = False
        try:
            if q.get("session_id") is not None:
                rid = conn.next_id()
                sid, token = q.get("session_id") or "", q.get("resume_token") or ""
                try:
                    await service.resume(
                        conn.as_connection(),
                        ResumeMsg(request_id=rid, session_id=sid, resume_token=token),
                    )
                    conn.episode_id = sid
                except Exception as exc:
                    await websocket.send_text(_ws_error(exc))
                    await websocket.close()
                    return
            closed = await _serve(service, conn, websocket)
        finally:
            conn.open = False
            open_sockets -= 1
            service.connections -= 1
            if not closed:
                service.detach(conn.as_connection())  # kept for resume_grace_s

    return app


async def _serve(service: EnvService, conn: WireConnection, websocket: WebSocket) -> bool:
    """receive -> validate -> dispatch -> reply, until `close` (True) or a drop (False)."""
    while True:
        try:
            raw = await websocket.receive_text()
        except WebSocketDisconnect:
            return False
        try:
            msg = json.loads(raw)
        except ValueError as exc:
            await websocket.send_text(_error("INVALID_JSON", f"Invalid JSON: {exc}"))
            continue
        kind = msg.get("type") if isinstance(msg, dict) else None
        try:
            if kind == "reset":
                data = OpenEnvResetData.model_validate(msg.get("data") or {})
                reply = {"type": "observation", "data": await _reset(service, conn, data)}
            elif kind == "step":
                action = _action(msg.get("data"))
                reply = {"type": "observation", "data": await _step(service, conn, action)}
            elif kind == "state":
                reply = {"type": "state", "data": _state(conn)}
            elif kind == "close":
                await _end(service, conn)
                await websocket.close()
                return True
            else:
                await websocket.send_text(
                    _error(
                        "UNKNOWN_TYPE",
                        f"Unknown message type: {kind!r}; expected reset, step, state or close",
                    )
                )
                continue
        except ValidationError as exc:
            text = _error(
                "VALIDATION_ERROR", to_wire_error(exc).message, errors=json.loads(exc.json())
            )
        except Exception as exc:
            text = _ws_error(exc)
        else:
            text = json.dumps(reply)
        try:
            await websocket.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            return False

"""`sandgym route`: OpenEnv's wire protocol for a fleet of env servers, behind one address.

OpenEnv's released client (`openenv.core.EnvClient`, `GenericEnvClient`, TRL's OpenEnv path)
takes one `base_url`; every other door takes a fleet address itself (sandgym/client/fleet.py).
This router is that one base URL: it serves `/openenv` (the websocket `/openenv/ws` and the
stateless HTTP routes) and `/healthz`, and places work on the servers of a fleet address (one
URL, `http://A,http://B`, or `ray:...`) with the client's own `Fleet` placement, not a second
scheduler:

- `/openenv/ws`: each new socket is placed on the server `Fleet.candidates()` puts first (up,
  with room, most room first); the router opens that server's `/openenv/ws` and relays frames
  both ways, unchanged, for the socket's life. A server that refuses the connection is held down
  and the next candidate is tried. A resume (`?session_id=S&resume_token=T`) goes to the server
  whose reset reply carried S (the router remembers it for as long as it runs).
- When the server holding a socket is lost (its socket ends without a close frame: killed,
  reset, keepalive timeout), the fleet holds it down (new sockets go to the others) and the
  client's pending request (or, if none is pending, its next one) is answered with OpenEnv's
  error form for a session that failed, `{"type": "error", "data": {"code": "SESSION_ERROR",
  "message": ..., "sandgym_code": "sandbox_lost", "retryable": true}}`, then the socket is
  closed: OpenEnv's client raises `RuntimeError("Server error: ... (code: SESSION_ERROR)")`.
  Never a made-up `done` or reward. A `close` from the client then is simply closed.
- HTTP (`POST /openenv/reset`, `/step`, `/mcp`; `GET /openenv/health`, `/metadata`, `/schema`,
  `/state`, ...): stateless, as OpenEnv's own; each request is forwarded to the first candidate
  and, when that server does not answer, to the next. 503 when no server is up with room.
- `/healthz`: the router's own, with each server's state as the fleet sees it (refreshed as
  placement refreshes it: at most once a poll interval, a down server once its backoff ends).

With `--token T` the router asks every client for `Authorization: Bearer T` (or `?token=T`, as
`sandgym serve` does) and sends the same token to the servers.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
from fastapi import FastAPI, Request, Response, WebSocket
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidHandshake

from sandgym.client.fleet import Fleet, FleetUnavailableError
from sandgym.wire.protocol import CLOSE_UNAUTHORIZED

log = logging.getLogger(__name__)

OPENENV_PATH = "/openenv"
DEFAULT_PORT = 8770
#: resumable sessions remembered (session id -> server), oldest forgotten first
MAX_REMEMBERED = 100_000
#: headers never forwarded on the HTTP routes (hop-by-hop, or set by httpx itself)
_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "upgrade"}


def error_frame(code: str, message: str, **extra: Any) -> str:
    """An OpenEnv error frame (`WSErrorResponse`): `data.code` is one of its `WSErrorCode`s."""
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def lost_frame(server: str, why: str) -> str:
    """OpenEnv's form for a session that failed under it (its server's outer handler sends
    `SESSION_ERROR` and closes): the server holding the episode is gone."""
    return error_frame(
        "SESSION_ERROR",
        f"the env server holding this session ({server}) was lost: {why}; the episode is gone, "
        "start a new one (it goes to another server of the fleet)",
        sandgym_code="sandbox_lost",
        retryable=True,
    )


@dataclass
class Relay:
    """One client socket and the server socket it is relayed to."""

    server: str  # the server's http base
    upstream: ClientConnection
    outstanding: int = 0  # requests sent upstream and not yet answered
    lost: str | None = None  # why the server's socket ended abnormally
    answered: bool = False  # the client got the lost-session error (or was closed)


class OpenEnvRouter:
    """Placement, relay and the HTTP forwarding over one `Fleet` (see the module doc)."""

    def __init__(
        self, fleet: Fleet, token: str | None = None, *, connect_timeout_s: float = 10.0
    ) -> None:
        self.fleet = fleet
        self.token = token
        self.connect_timeout_s = connect_timeout_s
        self.sessions: OrderedDict[str, str] = OrderedDict()  # session id -> server
        self.relayed: dict[str, int] = {u: 0 for u in fleet.servers}  # sockets per server
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    # -- auth -------------------------------------------------------------------------------------
    def token_ok(self, header: str | None, query: str | None) -> bool:
        if self.token is None:
            return True
        given = query or (header or "").removeprefix("Bearer ").strip()
        return hmac.compare_digest(given.encode(), self.token.encode())

    # -- placement --------------------------------------------------------------------------------
    async def open_upstream(self, query: list[tuple[str, str]]) -> tuple[str, ClientConnection]:
        """Place a new socket: the first candidate that accepts `/openenv/ws`; a resume goes to
        the server that holds its session. Raises FleetUnavailableError when none accepts."""
        sid = dict(query).get("session_id")
        if sid is not None:
            held = self.sessions.get(sid)
            if held is None:
                raise FleetUnavailableError(
                    f"expected session {sid!r} to be one this router placed, found it unknown", []
                )
            urls = [held]
        else:
            urls = await self.fleet.candidates()
        tried: list[str] = []
        for url in urls:
            self.fleet.placed(url)
            target = "ws" + url.removeprefix("http") + OPENENV_PATH + "/ws"
            if query:
                target += "?" + urlencode(query)
            try:
                upstream = await connect(
                    target,
                    additional_headers=self._headers,
                    open_timeout=self.connect_timeout_s,
                    max_size=None,
                    proxy=None,
                )
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                self.fleet.unplace(url)
                self.fleet.mark_down(url, f"{type(exc).__name__}: {exc}")
                tried.append(f"{url}: {type(exc).__name__}: {exc}")
                continue
            self.relayed[url] = self.relayed.get(url, 0) + 1
            return url, upstream
        raise FleetUnavailableError(
            f"expected a server of the fleet to accept the session, found none ({'; '.join(tried)})",
            list(self.fleet.servers.values()),
        )

    def remember(self, server: str, frame: str) -> None:
        """Note which server holds the session a reset reply names (for a later resume)."""
        if '"session_id"' not in frame:
            return
        try:
            sid = json.loads(frame)["data"]["metadata"]["session_id"]
        except (ValueError, KeyError, TypeError):
            return
        if isinstance(sid, str):
            self.sessions[sid] = server
            self.sessions.move_to_end(sid)
            while len(self.sessions) > MAX_REMEMBERED:
                self.sessions.popitem(last=False)

    # -- the relay --------------------------------------------------------------------------------
    async def _answer_lost(self, client: WebSocket, relay: Relay) -> None:
        if relay.answered:
            return
        relay.answered = True
        try:
            await client.send_text(lost_frame(relay.server, relay.lost or "its socket ended"))
            await client.close()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def _client_to_server(self, client: WebSocket, relay: Relay) -> None:
        """Client frames upstream, until the client goes (or is answered for a lost server)."""
        while True:
            try:
                text = await client.receive_text()
            except (WebSocketDisconnect, RuntimeError):
                return
            is_close = _is_close(text)
            if relay.lost is not None:
                if is_close:
                    relay.answered = True
                    await client.close()
                else:
                    await self._answer_lost(client, relay)
                return
            if not is_close:
                relay.outstanding += 1
            try:
                await relay.upstream.send(text)
            except ConnectionClosed as exc:
                relay.lost = relay.lost or f"{type(exc).__name__}: {exc}"
                self.fleet.mark_down(relay.server, relay.lost)
                await self._answer_lost(client, relay)
                return

    async def _server_to_client(self, client: WebSocket, relay: Relay) -> bool:
        """Server frames to the client. True when the client socket is done with (closed
        cleanly by the server, or answered for a lost one); False when the server was lost with
        no request pending (the client's next request gets the error)."""
        try:
            async for frame in relay.upstream:
                text = frame if isinstance(frame, str) else frame.decode()
                relay.outstanding = max(0, relay.outstanding - 1)
                self.remember(relay.server, text)
                await client.send_text(text)
        except ConnectionClosedOK:
            pass
        except (ConnectionClosed, OSError) as exc:
            relay.lost = f"{type(exc).__name__}: {exc}"
        except (WebSocketDisconnect, RuntimeError):
            return True  # the client went while we wrote to it
        code = relay.upstream.close_code
        if relay.lost is None and code not in (None, 1000):  # 1001: the server is going away
            relay.lost = f"it closed the socket with code {code}"
        if relay.lost is None:  # the server closed the session itself (after `close`, capacity)
            if relay.outstanding > 0:  # ... with a request unanswered: still a failed session
                relay.lost = "it closed the socket with a request unanswered"
                await self._answer_lost(client, relay)
                return True
            try:
                await client.close(1000)
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass
            return True
        log.warning("openenv router: env server %s lost mid-session: %s", relay.server, relay.lost)
        self.fleet.mark_down(relay.server, relay.lost)
        if relay.outstanding > 0:
            await self._answer_lost(client, relay)
            return True
        return False

    async def serve_socket(self, client: WebSocket) -> None:
        await client.accept()
        q = client.query_params
        if not self.token_ok(client.headers.get("authorization"), q.get("token")):
            await client.close(CLOSE_UNAUTHORIZED, "unauthorized: bearer token required")
            return
        query = [(k, v) for k, v in parse_qsl(str(client.url.query)) if k != "token"]
        try:
            server, upstream = await self.open_upstream(query)
        except FleetUnavailableError as exc:
            resume = dict(query).get("session_id") is not None
            code, ours = (
                ("SESSION_ERROR", "no_episode") if resume else ("CAPACITY_REACHED", "capacity")
            )
            await client.send_text(error_frame(code, str(exc), sandgym_code=ours))
            await client.close()
            return
        relay = Relay(server=server, upstream=upstream)
        up = asyncio.create_task(self._client_to_server(client, relay))
        down = asyncio.create_task(self._server_to_client(client, relay))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if down in done and not down.result():
                await up  # the server is lost: the client's next request gets the error
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            await upstream.close()  # a client gone without `close`: its episode stays resumable

    # -- stateless HTTP ---------------------------------------------------------------------------
    async def forward(self, request: Request, path: str) -> Response:
        """One stateless request, forwarded to the first candidate that answers."""
        if not self.token_ok(
            request.headers.get("authorization"), request.query_params.get("token")
        ):
            return Response(
                json.dumps(
                    {"detail": "unauthorized: expected header 'Authorization: Bearer <token>'"}
                ),
                status_code=401,
                media_type="application/json",
                headers={"WWW-Authenticate": "Bearer"},
            )
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers.update(self._headers)
        try:
            urls = await self.fleet.candidates()
        except FleetUnavailableError as exc:
            return _unavailable(str(exc))
        tried: list[str] = []
        async with httpx.AsyncClient(timeout=None) as http:
            for url in urls:
                self.fleet.placed(url)
                try:
                    r = await http.request(
                        request.method,
                        f"{url}{OPENENV_PATH}/{path}",
                        params=[
                            (k, v) for k, v in request.query_params.multi_items() if k != "token"
                        ],
                        content=body,
                        headers=headers,
                    )
                except httpx.TransportError as exc:
                    self.fleet.mark_down(url, f"{type(exc).__name__}: {exc}")
                    tried.append(f"{url}: {type(exc).__name__}")
                    continue
                finally:
                    self.fleet.unplace(url)  # stateless: it holds nothing once answered
                out = {
                    k: v
                    for k, v in r.headers.items()
                    if k.lower() not in _HOP | {"content-encoding"}
                }
                return Response(r.content, status_code=r.status_code, headers=out)
        return _unavailable(f"no server of the fleet answered ({'; '.join(tried)})")


def _is_close(text: str) -> bool:
    """A client's `{"type": "close"}` (it gets no reply)."""
    if '"close"' not in text:
        return False
    try:
        return bool(json.loads(text).get("type") == "close")
    except (ValueError, AttributeError):
        return False


def _unavailable(message: str) -> Response:
    return Response(
        json.dumps({"detail": {"code": "capacity", "message": message}}),
        status_code=503,
        media_type="application/json",
    )


def create_router_app(router: OpenEnvRouter) -> FastAPI:
    """The router's ASGI app: `/healthz`, `/openenv/ws`, and `/openenv/*` forwarded."""
    app = FastAPI(title="sandgym OpenEnv router", openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        await router.fleet.refresh()  # at most once a poll interval; a down server after backoff
        return {"status": "ok", "servers": router.fleet.describe(), "sockets": router.relayed}

    @app.websocket(OPENENV_PATH + "/ws")
    async def ws(websocket: WebSocket) -> None:
        await router.serve_socket(websocket)

    @app.api_route(OPENENV_PATH + "/{path:path}", methods=["GET", "POST"])
    async def http_route(path: str, request: Request) -> Response:
        return await router.forward(request, path)

    return app


# -- `sandgym route` ------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fleet",
        required=True,
        metavar="ADDRESS",
        help="the servers: http://A:8765,http://B:8765, or ray:auto / ray://HEAD:10001 "
        "(the servers `sandgym cluster up` placed)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument("--token", help="bearer token asked of clients and sent to the servers")


def run(args: argparse.Namespace) -> int:
    import uvicorn  # the server extra's; only this command needs it

    fleet = Fleet.from_address(args.fleet, args.token)
    app = create_router_app(OpenEnvRouter(fleet, args.token))
    log.info(
        "openenv router on http://%s:%d%s over %s",
        args.host,
        args.port,
        OPENENV_PATH,
        ", ".join(fleet.servers),
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


__all__ = ["OpenEnvRouter", "create_router_app", "error_frame", "lost_frame"]

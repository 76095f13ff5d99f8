"""uvicorn's websockets-sansio protocol with a short path for whole data frames.

In the sessions benchmark about a third of the server's CPU per step went to the websocket
layer: every frame was parsed by websockets' generator-based parser, queued as an event,
dispatched, and every reply was serialised by it; after each message uvicorn also paused and
resumed reading the socket (two epoll changes per message).

`FastWebSocketProtocol` keeps uvicorn's protocol for everything but the common case:

- the opening handshake, close, ping/pong, keepalive, denial responses, shutdown: uvicorn's
  code, unchanged;
- a whole, unfragmented, masked text or binary frame no larger than `ws_max_size` (what every
  request of the env protocol is): parsed here with a few byte reads and unmasked by
  websockets' C `apply_mask`, then queued for the app like uvicorn does;
- control frames (ping, pong, close) are collected whole and handed to websockets' parser,
  which therefore always sits at a frame boundary;
- anything else (a fragmented message, reserved bits, an unmasked or oversized frame, a
  reserved opcode) switches the connection to uvicorn's path for good, with every byte not yet
  parsed handed over, so websockets answers it exactly as before (close 1002, 1009, ...);
- a reply (`websocket.send`) on an open connection is framed here (server frames are unmasked:
  a 2 to 10 byte header) and written in one call.

The opening handshake of a plain request (no extensions taken up) is answered here too, with
the checks websockets makes. An app that asks for it through the `DIRECT_EXTENSION` scope
extension (sandgym/server/app.py does) gets whole messages by a synchronous call instead of the
ASGI receive queue, and can write error replies at once; without it, reading is paused only
when the app falls behind by `PAUSE_AFTER` messages, not after each one.
Selected by `ServerSettings.ws_impl = "sandgym"` (the default).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import Protocol, Side, State

try:  # websockets' C extension; the pure-Python fallback is the same function, slower
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

#: The releases these overrides were written and verified against. constraints/server.txt (what
#: setup, CI and the images install) holds exactly these; pyproject.toml allows a range. With any
#: other release installed, or an internal below missing, sandgym/server/runner.py logs one
#: warning and uses uvicorn's own websockets-sansio protocol instead (`unusable_reason`).
#: tests/unit/test_fastws_pins.py checks both; an upgrade is a deliberate step: re-verify
#: (tests/e2e/test_server_frames.py, `sandgym bench sessions`), then bump this and the constraints.
VERIFIED_AGAINST = {"uvicorn": "0.54.0", "websockets": "17.4"}

#: methods of uvicorn's protocol classes these overrides call through `super()` or replace
PROTOCOL_METHODS = (
    "data_received", "connection_lost", "on_task_complete", "pause_writing", "resume_writing",
    "send", "run_asgi", "start_keepalive", "handle_events", "handle_parser_exception",
)  # fmt: skip
#: what the overrides read or call on websockets' frame-layer `Protocol` (`self.conn`)
CONN_ATTRS = ("reader", "parser", "parser_exc", "close_rcvd", "state", "receive_data", "send_close")
#: uvicorn `Config` arguments read here
CONFIG_ARGS = ("ws_max_size", "ws_per_message_deflate")

#: the app may fall this many messages behind before the socket stops being read
PAUSE_AFTER = 16
#: ASGI scope extension: `scope["extensions"][DIRECT_EXTENSION]["set_receiver"](fn)` makes
#: the protocol call `fn(payload)` for each whole message (bytes; a text frame's checked as
#: UTF-8) instead of queueing a `websocket.receive` event (the disconnect still comes through
#: `receive`), and
#: `["send_now"](text) -> bool` writes a text message at once (False: the connection is gone).
#: Direct delivery has no queue to bound it; instead the protocol stops reading while its
#: replies back up, and hands over at most `BATCH` messages per turn of the event loop (the
#: rest of a big read waits for the next turn), so one flooding peer cannot starve the others.
DIRECT_EXTENSION = "sandgym.direct_messages"
BATCH = 32

_TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x1, 0x2, 0x8, 0x9, 0xA
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def missing_internals() -> list[str]:
    """The internals of uvicorn and websockets these overrides use that the installed releases
    lack (empty: all there), checked on the classes, without a connection."""
    import inspect

    from uvicorn.config import Config

    missing = [
        f"WebSocketsSansIOProtocol.{m}"
        for m in PROTOCOL_METHODS
        if not callable(getattr(WebSocketsSansIOProtocol, m, None))
    ]
    if not callable(getattr(HttpToolsProtocol, "handle_websocket_upgrade", None)):
        missing.append("HttpToolsProtocol.handle_websocket_upgrade")
    config_args = inspect.signature(Config).parameters
    missing += [f"Config({a}=)" for a in CONFIG_ARGS if a not in config_args]
    protocol_args = inspect.signature(Protocol).parameters
    missing += [
        f"Protocol({a}=)" for a in ("state", "max_size", "logger") if a not in protocol_args
    ]
    if "state" in protocol_args and "max_size" in protocol_args:
        conn = Protocol(Side.SERVER, state=State.OPEN, max_size=1 << 20)
        missing += [f"Protocol.{a}" for a in CONN_ATTRS if not hasattr(conn, a)]
        reader = getattr(conn, "reader", None)
        if reader is not None and not hasattr(reader, "buffer"):
            missing.append("Protocol.reader.buffer")
        _drop_parser(conn)
    return missing


def unusable_reason(
    installed: Callable[[str], str] | None = None,
) -> str | None:
    """Why these overrides must not run on the installed releases (None: they may): a release
    other than `VERIFIED_AGAINST`, or a missing internal. `installed` maps a distribution to its
    installed version (default: importlib.metadata)."""
    import importlib.metadata

    version = installed or importlib.metadata.version
    for dist, verified in VERIFIED_AGAINST.items():
        try:
            found = version(dist)
        except importlib.metadata.PackageNotFoundError:
            found = "no release"
        if found != verified:
            return f"{dist} {found} is installed, fastws was verified against {dist} {verified}"
    missing = missing_internals()
    if missing:
        return f"internals it uses are missing: {', '.join(missing)}"
    return None


def _data_frame(payload: bytes, b0: int) -> bytes:
    """A server frame (unmasked) of `payload`; `b0` = FIN + opcode."""
    n = len(payload)
    if n < 126:
        return bytes((b0, n)) + payload
    if n < 65536:
        return bytes((b0, 126)) + n.to_bytes(2, "big") + payload
    return bytes((b0, 127)) + n.to_bytes(8, "big") + payload


def _drop_parser(conn: Protocol) -> None:
    """Break the cycle between a websockets protocol object and its parser generator (which
    holds the object): closing the generator lets reference counting free both."""
    parser = getattr(conn, "parser", None)
    if parser is not None:
        conn.parser = None  # type: ignore[assignment]
        parser.close()


def _tokens(values: list[bytes]) -> list[bytes]:
    """The comma-separated tokens of header values, stripped and lowercased."""
    return [t.strip().lower() for v in values for t in v.split(b",") if t.strip()]


class FastHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, which after handing a connection to the websocket
    protocol drops its parser (the parser holds the protocol: a cycle per connection)."""

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        self.parser = None  # type: ignore[assignment]


class FastWebSocketProtocol(WebSocketsSansIOProtocol):
    """See the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._buf = bytearray()
        # None: not decided yet (handshake not done); True: our path; False: uvicorn's for good
        self._fast: bool | None = None
        self._max = self.config.ws_max_size
        self._accept_key: bytes | None = None  # set when the handshake took the short path
        self._receiver: Callable[[bytes], None] | None = None
        # Reading, under direct delivery: stopped while replies back up (`_write_paused`) or
        # while a big read is handed over in batches (`_batching`).
        self._write_paused = False
        self._batching = False
        self._reading = True
        self._app_done = False

    def _set_receiver(self, receiver: Callable[[bytes], None]) -> None:
        self._receiver = receiver

    # -- teardown: no reference cycles left for the garbage collector --------------------------
    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._release_if_done()

    def on_task_complete(self, task: Any) -> None:
        super().on_task_complete(task)
        self._app_done = True
        self._release_if_done()

    def _release_if_done(self) -> None:
        """Once the peer is gone and the app has returned, nothing calls into this protocol
        again: drop the references that tie it, the app's connection and websockets' parser
        into cycles, so all of it is freed at once by reference counting. Left to the cyclic
        collector, each connection's ~50 objects reached the oldest generation, whose full
        collections (a few hundred ms with thousands of sessions) then paid to free them."""
        if not (self.disconnected and self._app_done):
            return
        self._receiver = None
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope.get("extensions", {}).pop(DIRECT_EXTENSION, None)
        _drop_parser(self.conn)

    def _sync_reading(self) -> None:
        want = not (self._write_paused or self._batching)
        if want != self._reading and not self.transport.is_closing():
            self._reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _send_now(self, text: str) -> bool:
        if self.close_sent or self.disconnected or self.conn.state is not State.OPEN:
            return False
        self.transport.write(_data_frame(text.encode(), 0x81))
        return True

    # -- opening handshake ------------------------------------------------------------------
    def _fast_connect(self, data: bytes) -> bool:
        """Take the upgrade request (as uvicorn's HTTP protocol re-serialised it) the short way:
        the checks websockets' `ServerProtocol.process_request` makes, then the ASGI scope
        uvicorn builds. False (nothing done) for anything else, which then goes to websockets:
        a bad or unusual request, extensions enabled, bytes after the request."""
        if self.config.ws_per_message_deflate:
            return False
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep or rest:
            return False
        lines = head.split(b"\r\n")
        method, _, target_version = lines[0].partition(b" ")
        target, _, version = target_version.rpartition(b" ")
        if method != b"GET" or version != b"HTTP/1.1":
            return False
        headers: list[tuple[bytes, bytes]] = []
        found: dict[bytes, list[bytes]] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b": ")
            if not sep:
                return False
            headers.append((name, value))
            lname = name.lower()
            if lname in (
                b"connection",
                b"upgrade",
                b"sec-websocket-key",
                b"sec-websocket-version",
                b"sec-websocket-protocol",
            ):
                found.setdefault(lname, []).append(value)
        keys = found.get(b"sec-websocket-key", [])
        if (
            b"upgrade" not in _tokens(found.get(b"connection", []))
            or _tokens(found.get(b"upgrade", [])) != [b"websocket"]
            or found.get(b"sec-websocket-version") != [b"13"]
            or len(keys) != 1
        ):
            return False
        try:
            if len(base64.b64decode(keys[0], validate=True)) != 16:
                return False
            path = target.decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            return False
        raw_path, _, query = path.partition("?")
        subprotocols = [
            t.decode("latin-1") for t in _tokens(found.get(b"sec-websocket-protocol", []))
        ]
        self._accept_key = base64.b64encode(hashlib.sha1(keys[0] + _GUID).digest())
        self.handshake_initiated = True
        self.scope = {
            "type": "websocket",
            "asgi": {"version": self.asgi_version, "spec_version": "2.4"},
            "http_version": "1.1",
            "scheme": self.scheme,
            "server": self.server,
            "client": self.client,
            "root_path": self.root_path,
            "path": self.root_path + unquote(raw_path),
            "raw_path": self.root_path.encode("ascii") + raw_path.encode("ascii"),
            "query_string": query.encode("ascii"),
            "headers": headers,
            "subprotocols": subprotocols,
            "state": self.app_state.copy(),
            "extensions": {
                "websocket.http.response": {},
                DIRECT_EXTENSION: {
                    "set_receiver": self._set_receiver,
                    "send_now": self._send_now,
                },
            },
        }
        self.queue.put_nowait({"type": "websocket.connect"})
        task = self.loop.create_task(self.run_asgi())
        task.add_done_callback(self.on_task_complete)
        self.tasks.add(task)
        return True

    def _fast_accept(self, message: Any) -> None:
        """Answer 101 to a handshake taken the short way, and open the frame layer."""
        assert self._accept_key is not None
        out = [
            b"HTTP/1.1 101 Switching Protocols",
            b"Upgrade: websocket",
            b"Connection: Upgrade",
            b"Sec-WebSocket-Accept: " + self._accept_key,
        ]
        for name, value in (*self.default_headers, *message.get("headers", [])):
            out.append(name + b": " + value)
        subprotocol = message.get("subprotocol")
        if subprotocol:
            out.append(b"Sec-WebSocket-Protocol: " + subprotocol.encode())
        if self.transport.is_closing():
            return
        self.handshake_complete = True
        _drop_parser(self.conn)  # the handshake's protocol object, never used again
        # websockets' frame layer from here on, as if its own handshake had just finished.
        # (typed as uvicorn's ServerProtocol; only frame-layer methods are used from now on)
        self.conn = Protocol(  # type: ignore[assignment]
            Side.SERVER,
            state=State.OPEN,
            max_size=self.config.ws_max_size,
            logger=logging.getLogger("uvicorn.error"),
        )
        self.transport.write(b"\r\n".join(out) + b"\r\n\r\n")
        self.start_keepalive()
        if self._buf:  # frames a client sent before our 101
            self._fast = True
            self._parse(self._buf)

    # -- incoming ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        fast = self._fast
        if fast is None:
            if not self.handshake_complete:
                if self._accept_key is not None:
                    self._buf += data  # early frames: parsed once the app has accepted
                elif self.handshake_initiated or not self._fast_connect(data):
                    super().data_received(data)
                return
            # The client waited for our 101 as it must: websockets' parser holds nothing, so
            # frames can be parsed here from a frame boundary. A client that sent frames
            # before the handshake finished stays on uvicorn's path.
            fast = self._fast = not self.conn.reader.buffer and not self.frames
        if not fast:
            super().data_received(data)
            return
        buf = self._buf
        buf += data
        self._parse(buf)

    def _parse(self, buf: bytearray) -> None:
        pos = 0
        n = len(buf)
        left = BATCH if self._receiver is not None else -1
        while n - pos >= 2:
            if left == 0:  # the rest on the next turn of the loop, after everyone else's
                del buf[:pos]
                if not self._batching:
                    self._batching = True
                    self._sync_reading()
                self.loop.call_soon(self._next_batch)
                return
            b0 = buf[pos]
            b1 = buf[pos + 1]
            length = b1 & 0x7F
            head = pos + 2
            if length == 126:
                if n - pos < 4:
                    break
                length = int.from_bytes(buf[head : head + 2], "big")
                head += 2
            elif length == 127:
                if n - pos < 10:
                    break
                length = int.from_bytes(buf[head : head + 8], "big")
                head += 8
            opcode = b0 & 0x0F
            # FIN set, no reserved bits, masked (b1's top bit): what a client must send.
            ok = (b0 & 0xF0) == 0x80 and b1 & 0x80
            if not ok or (opcode not in (_TEXT, _BINARY) and opcode < _CLOSE) or opcode > _PONG:
                self._hand_over(buf, pos)
                return
            # Never buffer what websockets refuses anyway: a control frame over 125 bytes (1002),
            # a data frame over ws_max_size (1009).
            limit = 125 if opcode >= _CLOSE else self._max
            if limit is not None and length > limit:
                self._hand_over(buf, pos)
                return
            end = head + 4 + length
            if end > n:
                break
            if opcode >= _CLOSE:
                # Control frames go to websockets' parser whole.
                self.conn.receive_data(bytes(buf[pos:end]))
                pos = end
                if self.conn.parser_exc is not None:
                    del buf[:pos]
                    self.handle_parser_exception()
                    return
                self.handle_events()
                if self.conn.close_rcvd is not None:
                    buf.clear()  # nothing after the peer's close frame counts
                    return
                continue
            payload = apply_mask(buf[head + 4 : end], buf[head : head + 4])
            pos = end
            left -= 1
            if not self._deliver(opcode, payload):
                return
        if pos:
            del buf[:pos]
        if self._batching:
            self._batching = False
            self._sync_reading()

    def _next_batch(self) -> None:
        if self._fast and not self.transport.is_closing():
            self._parse(self._buf)

    def _hand_over(self, buf: bytearray, pos: int) -> None:
        """Give every byte from `pos` on to uvicorn's path, for the rest of the connection."""
        self._fast = False
        rest = bytes(buf[pos:])
        buf.clear()
        if rest:
            super().data_received(rest)

    def _deliver(self, opcode: int, payload: bytes) -> bool:
        """Hand one message to the app; False when the connection failed instead."""
        if self.close_sent:
            return True  # past `websocket.close`: dropped, as uvicorn does
        text = None
        if opcode == _TEXT:
            try:
                text = payload.decode()
            except UnicodeDecodeError:
                self.logger.info("invalid UTF-8 in a text frame; closing with 1007")
                self._buf.clear()
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return False
        receiver = self._receiver
        if receiver is not None:
            try:
                receiver(payload)  # a text frame's bytes, checked as UTF-8 above
            except Exception:  # the app's bug must not kill the protocol's read loop
                self.logger.exception("message receiver failed")
            return True
        if text is not None:
            self.queue.put_nowait({"type": "websocket.receive", "text": text})
        else:
            self.queue.put_nowait({"type": "websocket.receive", "bytes": payload})
        if not self.read_paused and self.queue.qsize() >= PAUSE_AFTER:
            self.read_paused = True
            self.transport.pause_reading()
        return True

    # -- outgoing ---------------------------------------------------------------------------
    def pause_writing(self) -> None:
        """The peer reads slower than we reply: stop reading its requests until it catches
        up (messages delivered directly have no queue to bound them)."""
        super().pause_writing()
        if self._receiver is not None:
            self._write_paused = True
            self._sync_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_paused:
            self._write_paused = False
            self._sync_reading()

    async def send(self, message: Any) -> None:
        if (
            self._accept_key is not None
            and not self.handshake_complete
            and message["type"] == "websocket.accept"
            and self.initial_response is None
        ):
            if not self.writable.is_set():
                await self.writable.wait()
            if self.disconnected:
                raise ClientDisconnected()
            self._fast_accept(message)
            return
        if (
            message["type"] == "websocket.send"
            and self.handshake_complete
            and not self.close_sent
            and self.initial_response is None
            and self.conn.state is State.OPEN
        ):
            if not self.writable.is_set():
                await self.writable.wait()
            if self.disconnected:
                raise ClientDisconnected()
            text = message.get("text")
            if text is not None:
                self.transport.write(_data_frame(text.encode(), 0x81))
            else:
                self.transport.write(_data_frame(message.get("bytes") or b"", 0x82))
            return
        await super().send(message)

"""The env websocket at the frame level, through a real uvicorn server and a raw TCP socket.

Each test runs on the server's own protocol (`ws_impl="sandgym"`, sandgym/server/fastws.py) and on
uvicorn's websockets-sansio, which it shortcuts: both must answer every frame the same way
(bytes split anywhere, several frames in one write, 16- and 64-bit lengths, binary frames,
fragmented messages, pings, close, invalid UTF-8, oversized, unmasked or reserved-bit frames).
"""

from __future__ import annotations

import base64
import json
import os
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from sandgym.server.runner import BackgroundServer

NULL_TASK = "echo-task"  # served by the e2e conftest

IMPLS = ["sandgym", "websockets-sansio"]


def frame(
    payload: bytes, opcode: int = 1, fin: bool = True, mask: bool = True, rsv: int = 0
) -> bytes:
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv | opcode
    mbit = 0x80 if mask else 0
    if n < 126:
        head = bytes((b0, mbit | n))
    elif n < 65536:
        head = bytes((b0, mbit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((b0, mbit | 127)) + n.to_bytes(8, "big")
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class RawWs:
    """A websocket client that writes whatever bytes the test gives it."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=10)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        return chunk

    def _need(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.buf += self._recv()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_frame(self) -> tuple[int, bytes]:
        b0, b1 = self._need(2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(self._need(2), "big")
        elif n == 127:
            n = int.from_bytes(self._need(8), "big")
        return b0 & 0x0F, self._need(n)

    def read_json(self) -> dict[str, Any]:
        while True:
            op, data = self.read_frame()
            if op in (1, 2):
                return json.loads(data)
            assert op != 8, f"closed by the server: {data!r}"

    def close_code(self) -> int:
        """The code of the server's close frame (data frames before it are skipped)."""
        while True:
            op, data = self.read_frame()
            if op == 8:
                return int.from_bytes(data[:2], "big")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def msg(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


RESET = msg(type="reset", request_id="r", task_id=NULL_TASK)


def step(rid: str, command: str) -> bytes:
    return msg(type="step", request_id=rid, action={"kind": "command", "command": command})


@pytest.fixture(params=IMPLS)
def ws(request: pytest.FixtureRequest, make_server: Callable[..., BackgroundServer]) -> Any:
    srv = make_server("null", ws_impl=request.param, max_message_bytes=1024 * 1024)
    clients: list[RawWs] = []

    def connect() -> RawWs:
        c = RawWs(srv.url)
        clients.append(c)
        return c

    yield connect
    for c in clients:
        c.close()


def test_frames_split_byte_by_byte_and_batched(ws: Callable[[], RawWs]) -> None:
    c = ws()
    for b in frame(RESET):  # one byte per TCP write
        c.send(bytes([b]))
    assert c.read_json()["type"] == "observation"
    c.send(frame(step("1", "echo one")))
    assert c.read_json()["observation"]["output"] == "one\n"
    # Two bad messages in one write: two errors, in order, and the connection still serves.
    c.send(frame(b"{not json") + frame(msg(type="step", request_id="x", bogus=1)))
    first, second = c.read_json(), c.read_json()
    assert first["code"] == "invalid_message" and second["code"] == "invalid_message"
    assert second["request_id"] == "x"
    c.send(frame(step("2", "echo two")))
    assert c.read_json()["observation"]["output"] == "two\n"


def test_long_lengths_binary_and_fragmented_messages(ws: Callable[[], RawWs]) -> None:
    c = ws()
    c.send(frame(RESET, opcode=2))  # a binary frame carrying JSON is accepted too
    assert c.read_json()["type"] == "observation"
    for size in (300, 70_000):  # 16-bit and 64-bit payload lengths
        c.send(frame(step(f"s{size}", "echo " + "x" * size)))
        reply = c.read_json()
        assert reply["request_id"] == f"s{size}"
        assert reply["observation"]["output"] == "x" * size + "\n"
    # A message in three fragments, a ping between them; then whole frames again.
    data = step("frag", "echo pieces")
    c.send(
        frame(data[:10], fin=False)
        + frame(b"p1", opcode=9)
        + frame(data[10:20], opcode=0, fin=False)
    )
    c.send(frame(data[20:], opcode=0))
    op, payload = c.read_frame()
    assert (op, payload) == (0xA, b"p1")  # pong with the ping's payload
    assert c.read_json()["observation"]["output"] == "pieces\n"
    c.send(frame(step("after", "echo after")))
    assert c.read_json()["observation"]["output"] == "after\n"


def test_ping_is_answered_and_close_is_echoed(ws: Callable[[], RawWs]) -> None:
    c = ws()
    c.send(frame(b"hello", opcode=9) + frame(RESET))
    assert c.read_frame() == (0xA, b"hello")
    assert c.read_json()["type"] == "observation"
    c.send(frame((1000).to_bytes(2, "big"), opcode=8))
    assert c.close_code() == 1000


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (frame(b"\xff\xfe not utf-8"), 1007),
        (frame(b"x" * 200, mask=False), 1002),
        (frame(RESET, rsv=0x40), 1002),
        (frame(b"x", opcode=3), 1002),
        # The header alone gives it away: only its first bytes are sent.
        (frame(b"y" * (4 * 1024 * 1024 + 1))[:1000], 1009),
        # A ping whose header claims 2**40 bytes: refused at the header (websockets checks the
        # size first), nothing buffered.
        (bytes((0x89, 0xFF)) + (2**40).to_bytes(8, "big") + os.urandom(4) + b"z" * 1000, 1009),
        (frame(b"p" * 200, opcode=9), 1002),  # control frames carry at most 125 bytes
    ],
    ids=[
        "invalid-utf8",
        "unmasked",
        "reserved-bit",
        "reserved-opcode",
        "over-ws-max-size",
        "huge-control-frame",
        "long-ping",
    ],
)
def test_protocol_violations_close_the_connection_with_their_code(
    ws: Callable[[], RawWs], bad: bytes, code: int
) -> None:
    c = ws()
    c.send(frame(RESET))
    assert c.read_json()["type"] == "observation"
    c.send(bad)
    assert c.close_code() == code
    # Only that connection: a new one is served.
    other = ws()
    other.send(frame(RESET))
    assert other.read_json()["type"] == "observation"


def _handshake_status(url: str, path: str, extra: str = "", key: str | None = None) -> bytes:
    u = urlsplit(url)
    key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {u.hostname}\r\nUpgrade: websocket\r\n"
            f"Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: {key}\r\n{extra}\r\n".encode()
        )
        buf = b""
        while b"\r\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    return buf.split(b"\r\n", 1)[0]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("path", "extra", "key", "status"),
    [
        ("/v1/env", "Sec-WebSocket-Version: 13\r\n", None, b"HTTP/1.1 101 Switching Protocols"),
        # Offers the server does not take up: an extension, a subprotocol; still 101.
        (
            "/v1/env",
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate\r\n"
            "Sec-WebSocket-Protocol: chat, superchat\r\n",
            None,
            b"HTTP/1.1 101 Switching Protocols",
        ),
        ("/v1/env", "Sec-WebSocket-Version: 8\r\n", None, b"HTTP/1.1 400 Bad Request"),
        ("/v1/env", "", None, b"HTTP/1.1 400 Bad Request"),
        ("/v1/env", "Sec-WebSocket-Version: 13\r\n", "c2hvcnQ=", b"HTTP/1.1 400 Bad Request"),
        ("/no-such-socket", "Sec-WebSocket-Version: 13\r\n", None, b"HTTP/1.1 403 Forbidden"),
    ],
    ids=["ok", "offers-ignored", "bad-version", "no-version", "short-key", "unknown-path"],
)
def test_handshakes_are_answered_alike(
    make_server: Callable[..., BackgroundServer],
    impl: str,
    path: str,
    extra: str,
    key: str | None,
    status: bytes,
) -> None:
    srv = make_server("null", ws_impl=impl)
    assert _handshake_status(srv.url, path, extra, key) == status


@pytest.mark.parametrize("impl", IMPLS)
def test_keepalive_pings_answered_keep_the_connection_unanswered_end_it(
    make_server: Callable[..., BackgroundServer], impl: str
) -> None:
    srv = make_server("null", ws_impl=impl, ping_interval_s=0.2, ping_timeout_s=0.5)
    alive, silent = RawWs(srv.url), RawWs(srv.url)
    try:
        for c in (alive, silent):
            c.send(frame(RESET))
            assert c.read_json()["type"] == "observation"
        for _ in range(3):  # three pings, each answered with its payload
            op, payload = alive.read_frame()
            assert op == 0x9
            alive.send(frame(payload, opcode=0xA))
        alive.send(frame(step("k", "echo still here")))
        assert alive.read_json()["observation"]["output"] == "still here\n"
        assert silent.close_code() == 1011  # keepalive ping timeout
    finally:
        alive.close()
        silent.close()


def test_a_client_that_never_reads_is_not_read_either(
    make_server: Callable[..., BackgroundServer],
) -> None:
    """Messages go to the app without a queue on the short path, so the protocol itself stops
    reading while its replies to that peer back up; a reading peer then gets served again."""
    import time

    from sandgym.server.fastws import FastWebSocketProtocol

    srv = make_server("null", ws_impl="sandgym")
    c = RawWs(srv.url)
    try:
        c.send(frame(RESET))
        assert c.read_json()["type"] == "observation"
        (proto,) = [
            p for p in srv._server.server_state.connections if isinstance(p, FastWebSocketProtocol)
        ]
        junk = frame(b"{bad json") * 2000
        c.sock.setblocking(False)
        deadline = time.monotonic() + 120
        out = b""
        while not proto._write_paused and time.monotonic() < deadline:
            out = out or junk
            try:
                out = out[c.sock.send(out) :]  # whole frames only: a partial send continues
            except BlockingIOError:
                time.sleep(0.01)
        assert proto._write_paused, "the replies never backed up"
        time.sleep(0.2)
        assert not proto.transport.is_reading()
        # Another client is served meanwhile.
        other = RawWs(srv.url)
        other.send(frame(RESET))
        assert other.read_json()["type"] == "observation"
        other.close()
        # Reading the backlog lets the server read again: the last request gets its answer.
        deadline = time.monotonic() + 120
        pending = out + frame(step("last", "echo done"))
        while pending and time.monotonic() < deadline:
            try:
                pending = pending[c.sock.send(pending) :]
            except BlockingIOError:
                pass
            try:
                c.buf += c.sock.recv(1 << 20)
            except BlockingIOError:
                time.sleep(0.01)
        c.sock.settimeout(30)
        while True:
            reply = c.read_json()
            if reply.get("request_id") == "last":
                break
            assert reply["code"] == "invalid_message"
        assert reply["observation"]["output"] == "done\n"
    finally:
        c.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_flooding_client_does_not_starve_the_others(
    make_server: Callable[..., BackgroundServer], impl: str
) -> None:
    import time

    srv = make_server("null", ws_impl=impl)
    flood = RawWs(srv.url)
    try:
        junk = frame(b"{bad json") * 2000
        flood.sock.setblocking(False)
        out, until = b"", time.monotonic() + 3
        while time.monotonic() < until:  # 3 s of requests, never reading a reply
            out = out or junk
            try:
                out = out[flood.sock.send(out) :]
            except BlockingIOError:
                time.sleep(0.01)
        other = RawWs(srv.url)
        other.sock.settimeout(5)
        other.send(frame(RESET))
        assert other.read_json()["type"] == "observation"
        other.send(frame(step("1", "echo served")))
        assert other.read_json()["observation"]["output"] == "served\n"
        other.close()
    finally:
        flood.close()


@pytest.mark.parametrize("goodbye", ["close", "drop"])
def test_a_finished_connection_is_freed_without_the_cyclic_collector(
    make_server: Callable[..., BackgroundServer], goodbye: str
) -> None:
    """Once its peer is gone and the app has returned, a connection's protocol objects (HTTP,
    websocket, websockets' parser) hold no reference cycles: reference counting frees them
    at once. Left in cycles, thousands of sessions' objects reach the oldest generation and
    the server pays for long full collections."""
    import gc
    import time
    import weakref

    from sandgym.server import fastws

    srv = make_server("null", ws_impl="sandgym", resume_grace_s=0)
    born: list[weakref.ref[Any]] = []
    inits = {
        cls: cls.__init__ for cls in (fastws.FastWebSocketProtocol, fastws.FastHttpToolsProtocol)
    }

    def recording(cls: type) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            inits[cls](self, *args, **kwargs)
            born.append(weakref.ref(self))

        return __init__

    gc.collect()
    gc.disable()
    try:
        for cls in inits:
            cls.__init__ = recording(cls)  # type: ignore[misc]
        try:
            c = RawWs(srv.url)
            c.send(frame(RESET))
            assert c.read_json()["type"] == "observation"
            c.send(frame(step("1", "echo hi")))
            assert c.read_json()["observation"]["output"] == "hi\n"
            c.send(frame(b'{"type": "step", "request_id": "x", "bogus": 1}'))  # refused
            assert c.read_json()["code"] == "invalid_message"
            if goodbye == "close":
                c.send(frame((1000).to_bytes(2, "big"), opcode=0x8))
                assert c.read_frame()[0] == 0x8
            c.close()
            del c
        finally:
            for cls, init in inits.items():
                cls.__init__ = init  # type: ignore[misc]
        assert len(born) == 2, "expected one HTTP and one websocket protocol"
        deadline = time.monotonic() + 10
        while any(r() is not None for r in born) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [type(r()).__name__ for r in born if r() is not None]
        assert not alive, f"still alive without a cyclic collection: {alive}"
        # Nor did the refused message leave its error in a cycle with the frame that caught it.
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage if isinstance(o, BaseException)}
        assert "ValidationError" not in cyclic, cyclic
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()

"""A minimal websocket client for load generation: what the sessions benchmark drives servers with.

The benchmark's clients share the machine's CPUs with the server they measure, so every
microsecond a client spends per step is taken from the server. The `websockets` asyncio client
costs ~150 us of CPU per request/reply here; this one, an asyncio Protocol that does only what
a load generator needs, costs a fraction of that. It is the same client for every server
compared, and it speaks plain RFC 6455:

- the opening handshake (GET + Upgrade, `Sec-WebSocket-Accept` checked);
- masked text frames out (a random mask per frame, unmasked by websockets' C `apply_mask`);
- unfragmented or fragmented text/binary frames in, pings answered with pongs, a close frame
  answered and the connection ended;
- no extensions, no subprotocols.

Errors (refused handshake, protocol violations, a dropped connection) raise `WsClientError` or
`ConnectionError`, which the benchmark counts.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import random
from collections import deque
from urllib.parse import urlsplit

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class WsClientError(Exception):
    """The server broke the websocket protocol or refused the handshake."""


def _frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    b0 = 0x80 | opcode
    if n < 126:
        head = bytes((b0, 0x80 | n))
    elif n < 65536:
        head = bytes((b0, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((b0, 0x80 | 127)) + n.to_bytes(8, "big")
    mask = random.getrandbits(32).to_bytes(4, "big")
    return head + mask + apply_mask(payload, mask)


class _Proto(asyncio.Protocol):
    def __init__(self, key: bytes) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.key = key
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.messages: deque[str | bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.handshake_done = False
        self.partial: list[bytes] = []
        self.partial_op = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.handshake_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            del self.buf[: end + 4]
            self._check_handshake(head)
            if self.error is not None:
                return
        self._parse()

    def _check_handshake(self, head: str) -> None:
        lines = head.split("\r\n")
        if not lines[0].startswith("HTTP/1.1 101"):
            self._fail(WsClientError(f"handshake refused: {lines[0]!r}"))
            return
        want = base64.b64encode(hashlib.sha1(self.key + _GUID).digest()).decode()
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("sec-websocket-accept") != want:
            self._fail(WsClientError("handshake: wrong Sec-WebSocket-Accept"))
            return
        self.handshake_done = True
        if not self.opened.done():
            self.opened.set_result(None)

    def _parse(self) -> None:
        buf, pos, n = self.buf, 0, len(self.buf)
        got = False
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length, head = b1 & 0x7F, pos + 2
            if b1 & 0x80:
                self._fail(WsClientError("server frame is masked"))
                return
            if length == 126:
                if n - pos < 4:
                    break
                length, head = int.from_bytes(buf[head : head + 2], "big"), head + 2
            elif length == 127:
                if n - pos < 10:
                    break
                length, head = int.from_bytes(buf[head : head + 8], "big"), head + 8
            end = head + length
            if end > n:
                break
            payload = bytes(buf[head:end])
            pos = end
            op, fin = b0 & 0x0F, b0 & 0x80
            if op in (_TEXT, _BINARY, 0):
                if op:
                    self.partial_op, self.partial = op, [payload]
                else:
                    self.partial.append(payload)
                if fin:
                    data = b"".join(self.partial)
                    self.messages.append(data.decode() if self.partial_op == _TEXT else data)
                    self.partial = []
                    got = True
            elif op == _PING:
                assert self.transport is not None
                self.transport.write(_frame(_PONG, payload))
            elif op == _CLOSE:
                assert self.transport is not None
                self.transport.write(_frame(_CLOSE, payload[:2]))
                self.transport.close()
                self._fail(ConnectionError("server closed the connection"))
                return
        del buf[:pos]
        if got and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        for fut in (self.opened, self.waiter):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: nobody may be waiting

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection lost"))


class WsClient:
    """One websocket connection: `await connect(url)`, then `send`, `recv`, `close`."""

    def __init__(self, proto: _Proto) -> None:
        self._p = proto

    @classmethod
    async def connect(cls, url: str, timeout_s: float = 300.0) -> WsClient:
        u = urlsplit(url)
        if u.scheme != "ws" or not u.hostname:
            raise WsClientError(f"expected a ws://host:port/path URL, got {url!r}")
        key = base64.b64encode(os.urandom(16))
        loop = asyncio.get_running_loop()
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: _Proto(key), u.hostname, u.port or 80), timeout_s
        )
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port or 80}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key.decode()}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        )
        assert proto.transport is not None
        proto.transport.write(request.encode())
        await asyncio.wait_for(asyncio.shield(proto.opened), timeout_s)
        return cls(proto)

    async def send(self, text: str) -> None:
        p = self._p
        if p.error is not None:
            raise p.error
        assert p.transport is not None
        p.transport.write(_frame(_TEXT, text.encode()))

    async def recv(self) -> str | bytes:
        p = self._p
        while not p.messages:
            if p.error is not None:
                raise p.error
            p.waiter = asyncio.get_running_loop().create_future()
            await p.waiter
        return p.messages.popleft()

    async def close(self) -> None:
        p = self._p
        if p.transport is None or p.transport.is_closing():
            return
        p.transport.write(_frame(_CLOSE, (1000).to_bytes(2, "big")))
        p.transport.close()

"""The egress proxy that enforces an `allowlist` network policy.

A sandbox whose policy is `allowlist` has no network interface but loopback. Its processes reach
the listed hosts through an HTTP proxy at `127.0.0.1:PROXY_PORT` *inside its own network
namespace* (`HTTP_PROXY`/`HTTPS_PROXY` point there): the listening socket is made there (a
thread enters the namespace with setns(2), binds, and leaves), while the connections out are
made from the server's namespace. So nothing runs inside the sandbox, and a process that ignores
the proxy variables has no route anywhere.

The proxy speaks `CONNECT host:port` (TLS and any other tunnel) and absolute-form HTTP requests
(`GET http://host/...`, as apt and curl send them for http URLs). The target host must be listed,
matched exactly after Harbor's normalisation (lower case, no trailing dot; no wildcard, so
`pypi.org` does not admit `files.pythonhosted.org`); anything else gets `403` with the reason.
The policy can change while the sandbox lives (a phase switch): connections already open stay
open, new ones are checked against the new policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import socket
import threading
from collections import deque
from urllib.parse import urlsplit

from sandgym.sandboxes.errors import NetworkPolicyUnsupportedError
from sandgym.sandboxes.network import PROXY_HOST, PROXY_PORT, NetworkPolicy

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
#: largest request head (request line + headers) the proxy reads
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
_CHUNK = 64 * 1024


def proxy_env(host: str = PROXY_HOST, port: int = PROXY_PORT) -> dict[str, str]:
    """The variables that point a sandbox's programs at its proxy (both spellings: curl reads
    the lower-case ones, pip and uv either)."""
    url = f"http://{host}:{port}"
    no_proxy = "localhost,127.0.0.1,::1"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


def _listen_in_netns(netns_path: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to `host:port` in the network namespace `netns_path`
    (e.g. `/proc/PID/ns/net`). Runs in a thread of its own, which dies after it."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(netns_path, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(256)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
        finally:
            _setns(own)  # if this fails the thread stays in the sandbox's namespace: it exits
    finally:
        os.close(own)
    return sock


async def listen_in_netns(netns_path: str, host: str = PROXY_HOST, port: int = PROXY_PORT):  # type: ignore[no-untyped-def]
    """`_listen_in_netns` on a fresh thread (a thread whose namespace switch went wrong must
    never serve anything else). Raises NetworkPolicyUnsupportedError when the namespace cannot
    be entered (not root, or the sandbox's processes are on another host)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[socket.socket] = loop.create_future()

    def work() -> None:
        try:
            result = _listen_in_netns(netns_path, host, port)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(_set_exc, fut, exc)
        else:
            loop.call_soon_threadsafe(_set_result, fut, result)

    threading.Thread(target=work, name="sandgym-netns", daemon=True).start()
    try:
        return await fut
    except (PermissionError, FileNotFoundError, OSError) as exc:
        raise NetworkPolicyUnsupportedError(
            f"cannot open the allowlist proxy inside {netns_path}: {exc} (the server must run as "
            "root on the host whose kernel runs the sandbox)"
        ) from exc


def _set_result(fut: asyncio.Future[socket.socket], sock: socket.socket) -> None:
    if fut.cancelled():
        sock.close()
    else:
        fut.set_result(sock)


def _set_exc(fut: asyncio.Future[socket.socket], exc: BaseException) -> None:
    if not fut.cancelled():
        fut.set_exception(exc)


def split_host_port(target: str, default_port: int) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `host` -> (host, port); ValueError when malformed."""
    if target.startswith("["):
        end = target.find("]")
        if end < 0:
            raise ValueError(f"malformed address {target!r}")
        host, rest = target[1:end], target[end + 1 :]
        port = int(rest[1:]) if rest.startswith(":") else default_port
    elif target.count(":") == 1:
        host, _, p = target.partition(":")
        port = int(p)
    else:
        host, port = target, default_port
    if not host or not 0 < port < 65536:
        raise ValueError(f"malformed address {target!r}")
    return host, port


class EgressProxy:
    """One sandbox's proxy: a listener in its namespace and the policy it enforces."""

    def __init__(self, sandbox_id: str, policy: NetworkPolicy) -> None:
        self.sandbox_id = sandbox_id
        self.policy = policy
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.allowed = 0
        self.denied = 0
        #: the last hosts refused (for a verifier's or a user's diagnosis)
        self.denied_hosts: deque[str] = deque(maxlen=32)

    async def start(self, netns_path: str, port: int = PROXY_PORT) -> None:
        sock = await listen_in_netns(netns_path, PROXY_HOST, port)
        self._server = await asyncio.start_server(self._handle, sock=sock, limit=MAX_HEAD_BYTES)

    def set_policy(self, policy: NetworkPolicy) -> None:
        self.policy = policy

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            await self._serve(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.LimitOverrunError:
            await _reply(writer, 431, "request head too large")
        except Exception:  # noqa: BLE001 - one bad client must not stop the proxy
            log.exception("egress proxy of sandbox %s: connection failed", self.sandbox_id)
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await _reply(writer, 400, f"malformed request line {lines[0][:200]!r}")
            return
        method, target, version = parts
        try:
            if method.upper() == "CONNECT":
                host, port = split_host_port(target, 443)
                path = None
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    await _reply(
                        writer, 400, f"expected CONNECT or an absolute http:// URL, got {target!r}"
                    )
                    return
                host, port = url.hostname, url.port or 80
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        except ValueError as exc:
            await _reply(writer, 400, str(exc))
            return
        policy = self.policy
        if not policy.allows(host):
            self.denied += 1
            self.denied_hosts.append(host)
            why = (
                "the network is off in this phase"
                if policy.mode == "no-network"
                else f"allowed hosts: {', '.join(policy.allowed_hosts) or '(none)'}"
            )
            await _reply(writer, 403, f"sandgym egress proxy: {host} is not allowed ({why})")
            return
        try:
            up_r, up_w = await asyncio.wait_for(
                asyncio.open_connection(host, port), CONNECT_TIMEOUT_S
            )
        except (TimeoutError, OSError) as exc:
            await _reply(writer, 502, f"sandgym egress proxy: cannot reach {host}:{port}: {exc}")
            return
        self.allowed += 1
        try:
            if path is None:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            else:
                keep = [
                    h
                    for h in lines[1:]
                    if h and not h.lower().startswith(("proxy-", "connection:", "keep-alive:"))
                ]
                # one request per connection: a second request on it would go to this host
                # whatever its URL said, so the client is told to reconnect for the next one
                keep.append("Connection: close")
                up_w.write(f"{method} {path} {version}\r\n".encode("latin-1"))
                up_w.write(("\r\n".join(keep) + "\r\n\r\n").encode("latin-1"))
            await _splice(reader, writer, up_r, up_w)
        finally:
            up_w.close()
            with contextlib.suppress(Exception):
                await up_w.wait_closed()


async def _reply(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}
    body = (text + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reasons.get(status, 'Bad Gateway')}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        f"X-Sandgym-Egress: denied\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(Exception):
        await writer.drain()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await src.read(_CHUNK)
            if not data:
                break
            dst.write(data)
            await dst.drain()
    finally:
        with contextlib.suppress(Exception):
            if dst.can_write_eof():
                dst.write_eof()


async def _splice(
    a_r: asyncio.StreamReader,
    a_w: asyncio.StreamWriter,
    b_r: asyncio.StreamReader,
    b_w: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both sides are done (or one fails)."""
    results = await asyncio.gather(_pipe(a_r, b_w), _pipe(b_r, a_w), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, ConnectionError | OSError):
            raise r

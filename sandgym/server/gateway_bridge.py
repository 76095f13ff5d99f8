"""Gateway bridge: a unix socket inside a sandbox that forwards to a model gateway on the host.

A harness agent running *inside* a sandbox (an OpenAI-API client such as
`sandgym/trainer/harness/react_agent.py`) must reach the trainer's model gateway while the sandbox's
network stays off. With reset option `{"gateway_url": "http://127.0.0.1:PORT"}` the server
listens on `/run/sandgym/gateway.sock` inside the sandbox and pipes every connection made to it,
byte for byte, to that loopback address; the agent speaks plain HTTP over the socket. The
listener closes with the episode.

Only loopback targets are accepted (the server must not become a proxy to arbitrary hosts), and
only sandboxes that expose a host directory seen as `/run/sandgym` inside them
(`Sandbox.bridge_dir`) can hold the socket: `local` (a directory of the sandbox's root tree) and
`docker` (a per-container host directory bind-mounted read-only at `/run/sandgym`; the network
stays `none`). Elsewhere (e2b) such a reset is refused by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sandgym.server.errors import InvalidMessageError

log = logging.getLogger(__name__)

#: where the socket appears inside the sandbox
SANDBOX_SOCKET = "/run/sandgym/gateway.sock"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_MAX_UNIX_PATH = 107  # sun_path is 108 bytes with its terminating NUL


class GatewayBridgeError(InvalidMessageError):
    """A reset asked for a gateway bridge that cannot be made (target or backend)."""


def parse_target(url: Any) -> tuple[str, int]:
    """(host, port) of a loopback http URL, or GatewayBridgeError saying what was wrong."""
    if not isinstance(url, str):
        raise GatewayBridgeError(f"gateway_url must be a string, got {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in _LOOPBACK or parts.port is None:
        raise GatewayBridgeError(
            f"gateway_url must be http://127.0.0.1:PORT (a loopback address with a port); "
            f"got {url!r}"
        )
    return parts.hostname, parts.port


class GatewayBridge:
    """A listening unix socket at `host_path` that forwards connections to `target`."""

    def __init__(self, host_path: Path, target: tuple[str, int]) -> None:
        self.host_path = host_path
        self.target = target
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.connections = 0

    @classmethod
    async def open(cls, sandbox: Any, url: Any) -> GatewayBridge:
        target = parse_target(url)
        root = getattr(sandbox, "bridge_dir", None)
        if not isinstance(root, Path):
            raise GatewayBridgeError(
                f"backend of sandbox {getattr(sandbox, 'id', '?')} keeps no host directory for a "
                "gateway socket (supported: local, docker); give the harness a network route instead"
            )
        path = root / posixpath.basename(SANDBOX_SOCKET)
        if len(str(path)) > _MAX_UNIX_PATH:
            raise GatewayBridgeError(
                f"gateway socket path {path} is {len(str(path))} bytes; unix sockets allow "
                f"{_MAX_UNIX_PATH} (set a shorter backend root)"
            )
        # The local backend's bridge directory is inside the agent's tree: a symlink planted at
        # run/ or run/sandgym would make the server create the socket wherever it points on
        # the host. (At reset the sandbox is fresh; this holds for any later open too.)
        for p in (root.parent, root):
            if p.is_symlink():
                raise GatewayBridgeError(
                    f"gateway socket directory {p} is a symlink (to {os.readlink(p)!r}); "
                    "expected a plain directory of the sandbox"
                )
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        bridge = cls(path, target)
        bridge._server = await asyncio.start_unix_server(bridge._handle, path=str(path))
        os.chmod(path, 0o666)  # the task's agent user may not be root
        return bridge

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("gateway bridge: %s:%s unreachable: %s", *self.target, exc)
            writer.close()
            return
        a = asyncio.create_task(_pipe(reader, up_writer))
        b = asyncio.create_task(_pipe(up_reader, writer))
        for t in (a, b):
            self._pipes.add(t)
            t.add_done_callback(self._pipes.discard)
        await asyncio.gather(a, b, return_exceptions=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in list(self._pipes):
            t.cancel()
        with contextlib.suppress(FileNotFoundError):
            self.host_path.unlink()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()

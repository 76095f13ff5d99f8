"""The env server's gateway bridge: loopback-only targets, refusal on backends without a host
directory, and byte-for-byte forwarding from the in-sandbox unix socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from sandgym.server.errors import to_wire_error
from sandgym.server.gateway_bridge import (
    SANDBOX_SOCKET,
    GatewayBridge,
    GatewayBridgeError,
    parse_target,
)


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:80", "https://127.0.0.1:1", "http://127.0.0.1", "ftp://x", 5]
)
def test_only_loopback_http_with_a_port_is_accepted(url: object) -> None:
    with pytest.raises(GatewayBridgeError) as info:
        parse_target(url)
    assert to_wire_error(info.value).code == "invalid_message"
    assert parse_target("http://127.0.0.1:8000") == ("127.0.0.1", 8000)


async def test_a_sandbox_without_a_host_directory_is_refused() -> None:
    with pytest.raises(GatewayBridgeError, match="no host directory"):
        await GatewayBridge.open(SimpleNamespace(id="sbx-1"), "http://127.0.0.1:9")


async def test_bridge_forwards_both_ways_and_removes_its_socket(tmp_path: Path) -> None:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"echo:" + await r.readline())
        await w.drain()
        w.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    fs = tmp_path / "fs"
    fs.mkdir()
    sandbox = SimpleNamespace(id="s", bridge_dir=fs / "run" / "sandgym")
    bridge = await GatewayBridge.open(sandbox, f"http://127.0.0.1:{port}")
    sock = fs / SANDBOX_SOCKET.lstrip("/")
    assert sock.exists() and (sock.stat().st_mode & 0o777) == 0o666
    r, w = await asyncio.open_unix_connection(str(sock))
    w.write(b"hello\n")
    await w.drain()
    assert await asyncio.wait_for(r.read(), 5) == b"echo:hello\n"
    w.close()
    await bridge.close()
    assert not sock.exists() and bridge.connections == 1
    upstream.close()


@pytest.mark.parametrize("planted", ["run", "run/sandgym"])
async def test_a_symlinked_socket_directory_is_refused(tmp_path: Path, planted: str) -> None:
    """A symlink in the sandbox's tree must not make the server put a socket on the host."""
    host_dir = tmp_path / "host-etc"
    host_dir.mkdir()
    fs = tmp_path / "fs"
    (fs / planted).parent.mkdir(parents=True, exist_ok=True)
    (fs / planted).symlink_to(host_dir)
    sandbox = SimpleNamespace(id="s", bridge_dir=fs / "run" / "sandgym")
    with pytest.raises(GatewayBridgeError, match="symlink"):
        await GatewayBridge.open(sandbox, "http://127.0.0.1:9")
    assert list(host_dir.iterdir()) == []

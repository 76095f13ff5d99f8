"""The docker backend's bridge directory: a per-container host directory bind-mounted read-only
at /run/sandgym, through which a process in a network-less container reaches an HTTP server on
the host's loopback (the gateway bridge), removed on close, on a failed create and by the reaper.

Skipped only when no Docker engine answers or `sandgym/terminal:latest` is not built.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandgym.sandboxes.spec import SandboxSpec
from sandgym.server.gateway_bridge import GatewayBridge
from tests.e2e.conftest import docker_image_available

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]

#: an HTTP request over the bridge socket, from inside the container (stdlib only)
CLIENT = """
import http.client, json, socket
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("/run/sandgym/gateway.sock")
c = C("gateway")
c.request("POST", "/v1/echo", body=json.dumps({"ping": 1}), headers={"content-type": "application/json"})
r = c.getresponse()
print(r.status, r.read().decode())
"""


@pytest.fixture
def bridge_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sgb-", dir="/tmp"))  # short: unix socket paths
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def backend(bridge_root: Path) -> AsyncIterator[object]:
    from sandgym.sandboxes.docker import DockerBackend

    b = DockerBackend(owner_id="test-" + os.urandom(4).hex(), bridge_root=bridge_root)
    yield b
    await b.reap(only_expired=False)
    await b.aclose()


async def _http_server() -> tuple[asyncio.AbstractServer, int]:
    """A minimal HTTP/1.0 server on loopback that echoes the request line and body as JSON."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = (await r.readuntil(b"\r\n\r\n")).decode()
        length = next(
            (
                int(h.split(":")[1])
                for h in head.split("\r\n")
                if h.lower().startswith("content-length")
            ),
            0,
        )
        body = (await r.readexactly(length)).decode()
        out = json.dumps({"line": head.split("\r\n")[0], "body": body}).encode()
        w.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
        await w.drain()
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_container_without_network_reaches_host_loopback_over_the_bridge(
    backend, bridge_root: Path
) -> None:
    srv, port = await _http_server()
    sb = await backend.create(SandboxSpec())
    try:
        assert sb.bridge_dir == bridge_root / sb.id and sb.bridge_dir.is_dir()
        bridge = await GatewayBridge.open(sb, f"http://127.0.0.1:{port}")
        try:
            r = await sb.exec(["python3", "-c", CLIENT], timeout_s=30)
            assert r.exit_code == 0, r
            status, _, payload = r.stdout.strip().partition(" ")
            assert status == "200"
            assert json.loads(payload) == {"line": "POST /v1/echo HTTP/1.1", "body": '{"ping": 1}'}
            # an unprivileged user can use it too; nobody in the container can write there,
            # and the network is still off
            r = await sb.exec(["python3", "-c", CLIENT], user="nobody", timeout_s=30)
            assert r.exit_code == 0 and r.stdout.startswith("200 "), r
            r = await sb.exec(
                "touch /run/sandgym/x || rm -f /run/sandgym/gateway.sock; ls /run/sandgym"
            )
            assert r.stdout.split() == ["gateway.sock"], r
            r = await sb.exec(
                ["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), 2)"]
            )
            assert r.exit_code != 0
        finally:
            await bridge.close()
        assert bridge.connections == 2
    finally:
        await sb.close()
        srv.close()
    assert not (bridge_root / sb.id).exists()


async def test_bridge_directories_do_not_leak(bridge_root: Path) -> None:
    from sandgym.sandboxes.docker import BRIDGE_SWEEP_GRACE_S, DockerBackend
    from sandgym.sandboxes.errors import SandboxCreateError

    owner = "test-" + os.urandom(4).hex()
    # an expired lease: the next reap of anyone removes the container and its directory
    expired = DockerBackend(owner_id=owner, lease_s=-10, bridge_root=bridge_root)
    sb = await expired.create(SandboxSpec())
    assert (bridge_root / sb.id).is_dir()
    # a directory whose container is long gone (a server killed mid-create), and a fresh one
    stale, fresh = bridge_root / "sg-000000000001", bridge_root / "sg-000000000002"
    stale.mkdir()
    fresh.mkdir()
    old = time.time() - BRIDGE_SWEEP_GRACE_S - 10
    os.utime(stale, (old, old))
    reaper = DockerBackend(bridge_root=bridge_root)
    try:
        removed = await reaper.reap(only_expired=True)
        assert sb.id in removed
        assert os.listdir(bridge_root) == [fresh.name]
        # a create that the engine refuses (after the directory was made) leaves none behind
        broken = DockerBackend(runtime="sandgym-no-such-runtime", bridge_root=bridge_root)
        with pytest.raises(SandboxCreateError):
            await broken.create(SandboxSpec())
        await broken.aclose()
        fresh.rmdir()
        assert os.listdir(bridge_root) == []
    finally:
        await sb.close()
        await expired.aclose()
        await reaper.aclose()


def test_a_bridge_root_too_long_for_unix_sockets_is_refused() -> None:
    from sandgym.sandboxes.docker import DockerBackend

    with pytest.raises(ValueError, match="too long for unix sockets"):
        DockerBackend(bridge_root="/tmp/" + "x" * 90)
    with pytest.raises(ValueError, match="absolute"):
        DockerBackend(bridge_root="relative/dir")

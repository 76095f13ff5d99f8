"""Network policies enforced for real, on docker and local: a `no-network` sandbox reaches
nothing, an `allowlist` one reaches a listed host on this machine (through its egress proxy) and
nothing else, a `public` one reaches a local test server; a Harbor task whose phases differ gets
each phase's network through the env server, and the server's ceiling clamps them.

The test servers are on this machine only: HTTP servers on loopback addresses (local) or in
containers this test starts on the engine's bridge (docker).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import shutil
import socketserver
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandgym.sandboxes import NetworkPolicy, SandboxSpec, get_backend
from sandgym.sandboxes.network import NO_NETWORK, PUBLIC
from tests.e2e.conftest import docker_image_available

CURL = "curl -fsS -m 8"
#: ignore the proxy variables: a direct connection, as a program that does not read them makes
DIRECT = "curl -fsS -m 8 --noproxy '*'"


def _allow(*hosts: str) -> NetworkPolicy:
    return NetworkPolicy(mode="allowlist", allowed_hosts=list(hosts))


async def _fetch(sb: object, cmd: str, url: str) -> tuple[int | None, str]:
    res = await sb.exec(f"{cmd} {url}", timeout_s=30)  # type: ignore[attr-defined]
    return res.exit_code, (res.stdout + res.stderr).strip()


# -- docker -------------------------------------------------------------------------------------

docker_only = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]


@pytest.fixture
async def docker_backend() -> AsyncIterator[object]:
    from sandgym.sandboxes.docker import DockerBackend

    b = DockerBackend(owner_id="test-net-" + os.urandom(4).hex())
    yield b
    await b.reap(only_expired=False)
    await b.aclose()


@pytest.fixture
async def web(docker_backend: object) -> AsyncIterator[tuple[str, str]]:
    """Two HTTP servers in containers on the bridge: (allowed ip, other ip), each serving
    /ok.txt with its own name."""
    ips = []
    boxes = []
    for name in ("allowed", "other"):
        sb = await docker_backend.create(SandboxSpec(network=PUBLIC))  # type: ignore[attr-defined]
        boxes.append(sb)
        await sb.exec(
            f"mkdir -p /srv && echo {name} > /srv/ok.txt && cd /srv && "
            "(nohup python3 -m http.server 8000 >/dev/null 2>&1 &)",
            timeout_s=30,
        )
        ip = (await sb.exec("hostname -i", timeout_s=10)).stdout.split()[0]
        for _ in range(100):  # polled: the server is up once it answers itself
            if (
                await sb.exec(f"{DIRECT} http://127.0.0.1:8000/ok.txt", timeout_s=10)
            ).exit_code == 0:
                break
            await asyncio.sleep(0.1)
        else:  # a server that never came up would make every "cannot reach" check pass
            raise AssertionError(f"the http server in {sb.id} never answered")
        ips.append(ip)
    yield ips[0], ips[1]
    for sb in boxes:
        await sb.close()


class TestDocker:
    pytestmark = docker_only

    async def test_no_network_reaches_nothing(self, docker_backend, web) -> None:
        allowed, _ = web
        sb = await docker_backend.create(SandboxSpec(network=NO_NETWORK))
        try:
            code, out = await _fetch(sb, DIRECT, f"http://{allowed}:8000/ok.txt")
            assert code != 0, out
            assert (await sb.exec("cat /proc/net/route | wc -l")).stdout.strip() == "1"
            code, out = await _fetch(sb, CURL, "http://deb.debian.org/debian/")
            assert code != 0, out
        finally:
            await sb.close()

    async def test_allowlist_reaches_a_listed_host_and_nothing_else(
        self, docker_backend, web
    ) -> None:
        allowed, other = web
        sb = await docker_backend.create(SandboxSpec(network=_allow(allowed)))
        try:
            code, out = await _fetch(sb, CURL, f"http://{allowed}:8000/ok.txt")
            assert (code, out) == (0, "allowed")
            code, out = await _fetch(sb, f"{CURL} --proxytunnel", f"http://{allowed}:8000/ok.txt")
            assert (code, out) == (0, "allowed")  # CONNECT, as every https:// fetch makes
            code, out = await _fetch(sb, CURL, f"http://{other}:8000/ok.txt")
            assert code != 0 and "403" in out, out
            code, out = await _fetch(sb, DIRECT, f"http://{allowed}:8000/ok.txt")
            assert code != 0, out  # no route but through the proxy
        finally:
            await sb.close()

    async def test_public_reaches_a_local_test_server(self, docker_backend, web) -> None:
        allowed, other = web
        sb = await docker_backend.create(SandboxSpec(network=PUBLIC))
        try:
            assert await _fetch(sb, DIRECT, f"http://{other}:8000/ok.txt") == (0, "other")
        finally:
            await sb.close()

    async def test_switching_phases(self, docker_backend, web) -> None:
        allowed, other = web
        sb = await docker_backend.create(
            SandboxSpec(network=PUBLIC, network_later=(NO_NETWORK, _allow(allowed)))
        )
        url = f"http://{other}:8000/ok.txt"
        try:
            assert (await _fetch(sb, DIRECT, url))[0] == 0
            await sb.set_network(NO_NETWORK)
            assert (await _fetch(sb, DIRECT, url))[0] != 0
            assert (await _fetch(sb, CURL, url))[0] != 0
            await sb.set_network(_allow(allowed))
            assert (await _fetch(sb, CURL, f"http://{allowed}:8000/ok.txt"))[0] == 0
            assert (await _fetch(sb, CURL, url))[0] != 0
            await sb.set_network(PUBLIC)
            assert (await _fetch(sb, DIRECT, url))[0] == 0
        finally:
            await sb.close()


def _phased_task(root: Path, allowed_ip: str) -> str:
    """A Harbor task: public set-up, no network for the agent, only `allowed_ip` for the
    verifier, whose test passes only when it fetches the allowed server's file."""
    d = root / "net-phases"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    (d / "instruction.md").write_text("Nothing to do.\n")
    (d / "task.toml").write_text(
        textwrap.dedent(
            f"""\
            version = "1.0"
            [environment]
            network_mode = "public"
            [agent]
            network_mode = "no-network"
            [verifier]
            timeout_sec = 60
            network_mode = "allowlist"
            allowed_hosts = ["{allowed_ip}"]
            """
        )
    )
    (d / "tests" / "test.sh").write_text(
        textwrap.dedent(
            f"""\
            #!/bin/bash
            if [ "$({CURL} http://{allowed_ip}:8000/ok.txt)" = allowed ]; then r=1; else r=0; fi
            echo $r > /logs/verifier/reward.txt
            """
        )
    )
    return d.name


@pytest.mark.parametrize("ceiling", [None, "no-network"])
@docker_only[0]
@docker_only[1]
async def test_phases_and_ceiling_through_the_server(
    docker_backend, web, tmp_path: Path, ceiling: str | None
) -> None:
    from sandgym.client.env_client import AsyncEnvClient
    from sandgym.server.runner import BackgroundServer
    from sandgym.server.settings import ServerSettings

    allowed, other = web
    task_id = _phased_task(tmp_path, allowed)
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        backend="docker",
        task_dirs=[tmp_path],
        include_builtin=False,
        network_ceiling=ceiling,
    )
    srv = BackgroundServer(settings)
    srv.start()
    try:
        async with AsyncEnvClient(srv.url) as env:
            obs, info = await env.reset(task_id, seed=0)
            net = info["network"]
            assert net["agent"] == {"mode": "no-network"}
            if ceiling is None:
                assert net["environment"] == {"mode": "public"}
                assert net["verifier"] == {"mode": "allowlist", "allowed_hosts": [allowed]}
                assert net["clamped"] is False
            else:
                assert net["environment"] == net["verifier"] == {"mode": "no-network"}
                assert net["clamped"] is True and net["clamp"] == {"mode": "no-network"}
            # the agent reaches neither server, through the proxy or around it
            for cmd in (CURL, DIRECT):
                res = await env.step(
                    {"kind": "command", "command": f"{cmd} http://{allowed}:8000/ok.txt"}
                )
                assert res.observation["exit_code"] != 0, res.observation["output"]
            res = await env.step({"kind": "submit"})
            assert res.terminated
            assert res.reward == (1.0 if ceiling is None else 0.0)
    finally:
        srv.stop()


# -- local --------------------------------------------------------------------------------------

local_only = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="the local backend's namespaces need bubblewrap (and root for the proxy)",
)


class _Named(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def loopback_servers() -> Iterator[tuple[str, str]]:
    """Two HTTP servers on this machine's loopback: 127.0.0.1 and 127.0.0.2 (base URLs)."""
    servers = []
    for name, addr in (("allowed", "127.0.0.1"), ("other", "127.0.0.2")):
        srv = socketserver.ThreadingTCPServer((addr, 0), _Named)
        srv.name = name  # type: ignore[attr-defined]
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    yield tuple(f"http://{s.server_address[0]}:{s.server_address[1]}" for s in servers)  # type: ignore[misc]
    for srv in servers:
        srv.shutdown()
        srv.server_close()


#: the loopback is in NO_PROXY (a sandbox's own services stay its own): clear it to use the proxy
VIA_PROXY = "env NO_PROXY= no_proxy= " + CURL


@local_only
async def test_local_policies(tmp_path: Path, loopback_servers: tuple[str, str]) -> None:
    allowed, other = loopback_servers
    backend = get_backend("local", root=tmp_path / "sbx")
    results = {}
    try:
        for name, policy in (
            ("no-network", NO_NETWORK),
            ("allowlist", _allow("127.0.0.1")),
            ("public", PUBLIC),
        ):
            sb = await backend.create(SandboxSpec(network=policy))
            try:
                results[name] = [
                    await _fetch(sb, VIA_PROXY, f"{allowed}/"),
                    await _fetch(sb, VIA_PROXY, f"{other}/"),
                    await _fetch(sb, DIRECT, f"{allowed}/"),
                ]
            finally:
                await sb.close()
    finally:
        with contextlib.suppress(Exception):
            await backend.aclose()
    # no-network: nothing, by any path
    assert all(code != 0 for code, _ in results["no-network"]), results["no-network"]
    # allowlist: the listed host through the proxy, the other refused, no direct route
    via, unlisted, direct = results["allowlist"]
    assert via == (0, "allowed")
    assert unlisted[0] != 0 and "403" in unlisted[1], unlisted
    assert direct[0] != 0, direct
    # public: the host's network
    assert results["public"] == [(0, "allowed"), (0, "other"), (0, "allowed")]


@local_only
async def test_local_switches_between_allowlist_and_no_network(
    tmp_path: Path, loopback_servers: tuple[str, str]
) -> None:
    allowed, _ = loopback_servers
    backend = get_backend("local", root=tmp_path / "sbx")
    sb = await backend.create(SandboxSpec(network=NO_NETWORK, network_later=(_allow("127.0.0.1"),)))
    try:
        assert (await _fetch(sb, VIA_PROXY, f"{allowed}/"))[0] != 0
        await sb.set_network(_allow("127.0.0.1"))
        assert await _fetch(sb, VIA_PROXY, f"{allowed}/") == (0, "allowed")
        await sb.set_network(NO_NETWORK)
        assert (await _fetch(sb, VIA_PROXY, f"{allowed}/"))[0] != 0
    finally:
        await sb.close()

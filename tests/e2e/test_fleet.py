"""A fleet of two real `sandgym serve` processes (local backend) behind one address.

The sandbox client, given `http://A,http://B`, spreads creations over both by room, sends each
sandbox's calls to the server holding it, and prefers the server whose warm pool holds the
environment; SIGKILL of one server makes its sandboxes' calls raise `ServerLostError` (a
`SandboxLostError`: infrastructure) while new creations go to the survivor; the server restarted
on the same port gets work again. The episode client (`AsyncEnvClient`) given the same address
places its episode on a live server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from sandgym.client.env_client import AsyncEnvClient
from sandgym.client.fleet import FleetSpecError, parse_fleet
from sandgym.client.sandbox_client import SandboxClient, SandboxLostError, ServerLostError
from sandgym.server.runner import free_port
from sandgym.wire.sandbox_protocol import CreateSandboxRequest, ExecRequest, SandboxEnvironment
from tests.e2e.conftest import local_available
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not local_available(), reason="bubblewrap not installed")

MAX = 3


def start_answering(cmd: list[str], url: str, what: str) -> subprocess.Popen[bytes]:
    """Start `cmd` and wait (60 s at most) until `url`/healthz answers 200."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=dict(os.environ))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer /healthz in 60 s")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s, if it still runs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class Server:
    """`sandgym serve --backend local` on a fixed port (so it can come back on it)."""

    def __init__(self, port: int, pool_size: int = 1) -> None:
        self.port = port
        self.pool_size = pool_size
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "sandgym.server.serve_cli", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend", "local", "--max-sessions", str(MAX),
               "--pool-size", str(self.pool_size)]  # fmt: skip
        self.proc = start_answering(cmd, self.url, f"server on {self.port}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@pytest.fixture
def fleet2() -> Iterator[list[Server]]:
    servers: list[Server] = []
    try:
        for _ in range(2):
            servers.append(Server(free_port()))
        yield servers
    finally:
        for s in servers:
            s.stop()


def request(tag: str = "a") -> CreateSandboxRequest:
    return CreateSandboxRequest(
        environment=SandboxEnvironment(docker_image="sandgym/terminal", env={"TAG": tag})
    )


def test_parse_fleet_forms() -> None:
    assert parse_fleet("ws://h:1/v1/env") == ["http://h:1"]
    assert parse_fleet("http://a:1, http://b:2/,http://a:1") == ["http://a:1", "http://b:2"]
    with pytest.raises(FleetSpecError, match="expected a server URL"):
        parse_fleet("a:1,http://b:2")


def test_eval_takes_a_fleet_address() -> None:
    """`sandgym eval --server-url A,B` evaluates on both servers (their episode URLs)."""
    import argparse

    from sandgym.trainer.eval_cli import server_urls

    args = argparse.Namespace(server_url="http://a:1, ws://b:2/v1/env", ray_servers="off")
    assert server_urls(args) == (["ws://a:1/v1/env", "ws://b:2/v1/env"], None)


def test_ray_names_agree_with_cluster_up() -> None:
    """The client finds `sandgym cluster up`'s servers by the names the trainer gives them."""
    from sandgym.client import fleet
    from sandgym.trainer import cluster

    assert (fleet.RAY_NAMESPACE, fleet.RAY_ACTOR_PREFIX) == (
        cluster.NAMESPACE,
        cluster.ACTOR_PREFIX,
    )


async def test_spread_route_kill_and_come_back(fleet2: list[Server]) -> None:
    a, b = fleet2
    address = f"{a.url},{b.url}"
    async with SandboxClient(address, timeout_s=30) as client:
        client.fleet.poll_interval_s = 0.0  # a fresh picture for every creation
        # six creations of one environment fill both servers (3 each): spread by room
        infos = [await client.create(request()) for _ in range(2 * MAX)]
        where = Counter(client.placement[i.sandbox_id] for i in infos)
        assert where == {a.url: MAX, b.url: MAX}
        # each sandbox's calls go to its own server (the id is unknown to the other)
        for info in infos:
            res = await client.exec(info.sandbox_id, ExecRequest(command="echo $TAG"))
            assert res.stdout == "a\n"
        on_a = [i.sandbox_id for i in infos if client.placement[i.sandbox_id] == a.url]
        on_b = [i.sandbox_id for i in infos if client.placement[i.sandbox_id] == b.url]
        for sid in on_b:
            assert await client.close(sid)

        # A dies: its sandboxes' calls are the infrastructure's failure
        a.kill()
        for sid in on_a:
            with pytest.raises(ServerLostError) as err:
                await client.exec(sid, ExecRequest(command="true"))
            assert isinstance(err.value, SandboxLostError) and err.value.server == a.url
        # new creations go to the survivor, none of them fails
        later = [await client.create(request()) for _ in range(MAX)]
        assert {client.placement[i.sandbox_id] for i in later} == {b.url}
        for info in later:
            assert await client.close(info.sandbox_id)

        # A comes back on its port: once its backoff ends it gets work again
        await asyncio.to_thread(a.start)
        client.fleet.servers[a.url].down_until = 0.0  # end the backoff now (it would in <= 30 s)
        back = [await client.create(request()) for _ in range(2 * MAX)]
        assert Counter(client.placement[i.sandbox_id] for i in back) == {a.url: MAX, b.url: MAX}
        for info in back:
            assert await client.close(info.sandbox_id)


async def test_concurrent_creations_spread(fleet2: list[Server]) -> None:
    """Creations sent at once see each other's placement (counted before the request)."""
    a, b = fleet2
    async with SandboxClient(f"{a.url},{b.url}", timeout_s=30) as client:
        infos = await asyncio.gather(*(client.create(request("c")) for _ in range(4)))
        assert Counter(client.placement[i.sandbox_id] for i in infos) == {a.url: 2, b.url: 2}
        for info in infos:
            assert await client.close(info.sandbox_id)


async def test_warm_pool_is_preferred(fleet2: list[Server]) -> None:
    a, b = fleet2
    async with SandboxClient(f"{a.url},{b.url}", timeout_s=30) as client:
        client.fleet.poll_interval_s = 0.0
        first = await client.create(request("warm"))
        home = client.placement[first.sandbox_id]
        await client.close(first.sandbox_id)

        # the home server's pool refills that environment; the other has never seen it
        async def warm() -> bool:
            async with httpx.AsyncClient() as http:
                pool = (await http.get(f"{home}/v1/pool", timeout=5)).json()
            return bool(pool["keys"].get(first.fingerprint, {}).get("ready", 0) > 0)

        await wait_until(warm, 30, what=f"a ready sandbox of the environment on {home}")
        # the same environment again goes home (a pool hit), though both have equal room
        again = await client.create(request("warm"))
        assert client.placement[again.sandbox_id] == home and again.from_pool
        await client.close(again.sandbox_id)


async def test_episode_client_places_on_a_live_server(fleet2: list[Server]) -> None:
    a, b = fleet2
    a.kill()
    async with AsyncEnvClient(f"{a.url},{b.url}") as env:
        obs, _ = await env.reset("builtin/hello-file", seed=0)
        assert env.url == f"ws://127.0.0.1:{b.port}/v1/env"
        res = await env.step("echo hello")
        assert res.observation["output"] == "hello\n"

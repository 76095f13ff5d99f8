"""`ray:ADDRESS` as a fleet: the servers `sandgym cluster up` places (one per Ray node offering
the `sandgym` resource, on `ray.cluster_utils.Cluster`'s two nodes on this host) are what a
`SandboxClient` given `ray:<the cluster's address>` resolves to and spreads its sandboxes over."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.client.fleet import parse_fleet
from sandgym.client.sandbox_client import SandboxClient
from sandgym.wire.sandbox_protocol import CreateSandboxRequest, ExecRequest, SandboxEnvironment
from tests.e2e.conftest import local_available

MB = 1024 * 1024
pytestmark = [
    pytest.mark.skipif(not local_available(), reason="bubblewrap not installed"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def two_node_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from sandgym.trainer.cluster import EnvServerFleet

    monkeypatch.setenv("SANDGYM_LOCAL_ROOT", str(tmp_path / "sandboxes"))
    (tmp_path / "sandboxes").mkdir()
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
    monkeypatch.setenv("RAY_worker_niceness", "0")
    node = {"object_store_memory": 100 * MB}
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **node}
    )
    fleet = None
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, resources={"sandgym": 1}, **node)
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="sandgym")
        # what `sandgym cluster up --backend local --max-sessions 2` does
        fleet = EnvServerFleet({"backend": "local", "port": 0, "max_sessions": 2})
        servers = fleet.start()
        yield c, servers
    finally:
        if fleet is not None:
            fleet.stop(drain_timeout_s=10)
        ray.shutdown()
        c.shutdown()


def test_ray_address_resolves_to_cluster_up_servers(two_node_fleet: Any) -> None:
    cluster, servers = two_node_fleet
    placed = sorted(s.http_url for s in servers)
    assert len(placed) == 2
    assert sorted(parse_fleet(f"ray:{cluster.address}")) == placed

    async def spread() -> Counter[str]:
        async with SandboxClient(f"ray:{cluster.address}", timeout_s=60) as client:
            client.fleet.poll_interval_s = 0.0
            request = CreateSandboxRequest(
                environment=SandboxEnvironment(docker_image="sandgym/terminal")
            )
            infos = [await client.create(request) for _ in range(4)]
            where = Counter(client.placement[i.sandbox_id] for i in infos)
            for i in infos:
                res = await client.exec(i.sandbox_id, ExecRequest(command="echo ok"))
                assert res.stdout == "ok\n"
                await client.close(i.sandbox_id)
            return where

    assert asyncio.run(spread()) == {placed[0]: 2, placed[1]: 2}

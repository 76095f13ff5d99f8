"""`sandgym eval --ray-servers`: eval finds its env servers through Ray as `sandgym train` does
(sandgym.trainer.cluster.ray_servers), on a real one-node Ray cluster whose node offers `sandgym`.

- discover: servers another driver placed (here the test, as `sandgym cluster up` would) get the
  episodes; no URL is given;
- place: eval starts a server on the node itself, plays there, and removes it at the end;
- a cluster with no server: a named error, exit status 2, from the command line in a fresh
  process that connects to the cluster by its address.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.trainer.eval_cli import add_arguments, run

REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024


@pytest.fixture(scope="module")
def ray_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    mp = pytest.MonkeyPatch()
    # the node's env servers (Ray workers inherit this process's environment) keep their local
    # sandboxes here
    mp.setenv("SANDGYM_LOCAL_ROOT", str(tmp_path_factory.mktemp("sandboxes")))
    ray.init(
        address="local",  # a new instance, never a cluster someone else started on this host
        num_cpus=2,
        resources={"sandgym": 1},
        include_dashboard=False,
        object_store_memory=100 * MB,
        namespace="sandgym-test",
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        mp.undo()


def _sandgym_actors(ray: Any) -> list[str]:
    from sandgym.trainer.cluster import ACTOR_PREFIX, NAMESPACE

    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == NAMESPACE and str(a.get("name", "")).startswith(ACTOR_PREFIX)
    ]


def _wait_no_servers(ray: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _sandgym_actors(ray):
        assert time.monotonic() < deadline, f"servers still listed: {_sandgym_actors(ray)}"
        time.sleep(0.2)


def _eval(tmp_path: Path, *flags: str) -> tuple[int, list[dict[str, Any]]]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / f"episodes-{len(list(tmp_path.iterdir()))}.jsonl"
    argv = ["--tasks", "builtin/hello-file", "--agent", "noop", "--attempts", "3", "--json"]
    args = parser.parse_args([*argv, "--out", str(out), *flags])
    return run(args), [json.loads(line) for line in out.read_text().splitlines()]


def test_eval_discovers_the_servers_placed_on_the_cluster(
    ray_node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sandgym.trainer.cluster import EnvServerFleet

    fleet = EnvServerFleet({"backend": "local"}, resource="sandgym")
    try:
        (server,) = fleet.start()
        rc, episodes = _eval(tmp_path, "--ray-servers", "discover")
    finally:
        fleet.stop()
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["infra_failures"] == 0, report
    assert [e["server_url"] for e in episodes] == [server.url] * 3
    assert [e["termination"] for e in episodes] == ["submitted"] * 3


def test_eval_places_servers_and_removes_them(
    ray_node: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _wait_no_servers(ray_node)  # (what the previous test placed)
    rc, episodes = _eval(tmp_path, "--ray-servers", "place", "--server-backend", "local")
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["infra_failures"] == 0, report
    (url,) = {e["server_url"] for e in episodes}
    node_ip = ray_node.nodes()[0]["NodeManagerAddress"]
    assert url.startswith(f"ws://{node_ip}:") and url.endswith("/v1/env")
    _wait_no_servers(ray_node)  # eval removed what it placed


def test_eval_without_servers_on_the_cluster_says_so(ray_node: Any) -> None:
    _wait_no_servers(ray_node)
    address = ray_node.get_runtime_context().gcs_address
    proc = subprocess.run(
        [sys.executable, "-m", "sandgym.cli", "eval", "--tasks", "builtin/hello-file",
         "--agent", "noop", "--ray-servers", "discover", "--ray-address", address],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "no env server found through Ray" in proc.stderr

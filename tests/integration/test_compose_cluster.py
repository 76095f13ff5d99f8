"""docker-compose.yml's cluster: `up` of the Ray head, two Ray workers (each offering the
`sandgym` resource) and the `envservers` placer gives two healthy env servers, one per worker,
on the host's Docker engine, published on loopback ports; a Ray driver in the compose network
(where the trainer runs) finds both through Ray and reaches each at the URL it advertises.
`down -v` in a finally.

Images are built here (no registry): sandgym/envserver (on sandgym/terminal) when missing, and
sandgym/raynode (envserver + Ray, then this tree's sources) every time, from cache when the
sources did not change. Measured on the 2-core CI machine under load: envserver 9 min, Ray's
layer 7 min (both once), the sources' layers 80 s; the trainer image (torch) is not needed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]


def _compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
    if probe.returncode == 0:
        return ["docker", "compose"]
    pytest.skip("neither docker-compose nor `docker compose` is installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def _build(name: str, dockerfile: str, always: bool = False) -> None:
    if _image_exists(name) and not always:
        return
    # a second try: this busy engine (btrfs, other builds and prunes beside ours) sometimes
    # fails an export with "failed to get layer ...: layer does not exist"
    for attempt in (1, 2):
        res = subprocess.run(
            ["docker", "build", "-q", "-f", dockerfile, "-t", name, "."],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1500,
        )
        if res.returncode == 0:
            return
        if attempt == 2 or "layer does not exist" not in res.stderr:
            raise AssertionError(f"docker build of {name} failed:\n{res.stderr[-3000:]}")


def test_compose_up_gives_two_env_servers_the_trainer_reaches() -> None:
    import httpx

    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker engine")
    compose = _compose()
    if not _image_exists("sandgym/terminal:latest"):
        pytest.skip("sandgym/terminal:latest is missing (images/bootstrap-base.sh)")
    _build("sandgym/envserver:latest", "images/envserver/Dockerfile")
    # always: its last layers carry this tree's sources (seconds when they are unchanged)
    _build("sandgym/raynode:latest", "images/raynode/Dockerfile", always=True)

    project = f"sgtest{uuid.uuid4().hex[:8]}"
    ports = {"SANDGYM_WORKER1_PORT": _free_port(), "SANDGYM_WORKER2_PORT": _free_port(),
             "SANDGYM_DASHBOARD_PORT": _free_port()}  # fmt: skip
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}, "SANDGYM_POOL_SIZE": "0"}
    base = [*compose, "-p", project, "-f", str(REPO / "docker-compose.yml")]
    services = ["ray-head", "ray-worker-1", "ray-worker-2", "envservers"]
    try:
        t0 = time.monotonic()
        subprocess.run([*base, "up", "-d", *services], cwd=REPO, env=env, check=True,
                       timeout=300)  # fmt: skip
        healthy: dict[int, dict[str, object]] = {}
        deadline = time.monotonic() + 300
        while len(healthy) < 2 and time.monotonic() < deadline:
            for key in ("SANDGYM_WORKER1_PORT", "SANDGYM_WORKER2_PORT"):
                port = ports[key]
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                    if r.status_code == 200:
                        healthy[port] = r.json()
                except httpx.HTTPError:
                    pass
            time.sleep(2)
        up_s = time.monotonic() - t0
        if len(healthy) < 2:
            logs = subprocess.run([*base, "logs", "--tail=40"], cwd=REPO, env=env,
                                  capture_output=True, text=True).stdout  # fmt: skip
            pytest.fail(f"healthy env servers after 300 s: {healthy}\n{logs[-6000:]}")
        assert all(h["backend"] == "docker" for h in healthy.values()), healthy
        # two distinct servers (one per worker): their pools have different owners
        owners = {
            httpx.get(f"http://127.0.0.1:{p}/v1/pool", timeout=5).json()["owner_id"]
            for p in healthy
        }
        assert len(owners) == 2, owners

        # what the trainer does: find the servers through Ray, reach each advertised URL
        script = (
            "import json, ray, httpx\n"
            "from sandgym.trainer.cluster import discover_servers, http_base\n"
            "ray.init(address='auto', log_to_driver=False)\n"
            "out = []\n"
            "for s in discover_servers():\n"
            "    r = httpx.get(http_base(s.url) + '/v1/sessions', timeout=5)\n"
            "    out.append({'url': s.url, 'node': s.node_id, 'status': r.status_code,\n"
            "                'max_sessions': r.json()['max_sessions'], 'owner': s.owner_id})\n"
            "print(json.dumps(out))\n"
        )
        res = subprocess.run([*base, "exec", "-T", "envservers", "python3", "-c", script],
                             cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        found = json.loads(res.stdout.strip().splitlines()[-1])
        assert len(found) == 2 and {f["status"] for f in found} == {200}, found
        assert {f["owner"] for f in found} == owners
        assert len({f["node"] for f in found}) == 2
        print(f"compose up to two healthy env servers: {up_s:.1f} s")
    finally:
        subprocess.run([*base, "down", "-v", "--timeout", "60"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)  # fmt: skip

"""docker-compose.yml, as CI runs it: Debian's `docker-compose` (v1) brings the `envserver` service
up, one oracle episode of `builtin/hello-file` is played through it with `AsyncEnvClient`, and
`docker-compose down` leaves no container behind (neither the service nor a sandbox it created).

Needs a Docker engine, the `docker-compose` command and `sandgym/terminal:latest` (built by
images/bootstrap-base.sh); the envserver image is built here on the first run (pip inside the
build reaches PyPI) and comes from the build cache afterwards. The stack runs under a project name
and host port of its own, so it never touches another stack on this engine.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandgym.cli.run_cli import oracle_actions
from sandgym.client.env_client import AsyncEnvClient
from sandgym.sandboxes.labels import LABEL_OWNER_HOST
from sandgym.server.runner import free_port
from sandgym.tasks import TaskRegistry

REPO = Path(__file__).resolve().parents[2]
COMPOSE = shutil.which("docker-compose")


def _image_exists(name: str) -> bool:
    if shutil.which("docker") is None:
        return False
    out = subprocess.run(["docker", "image", "inspect", name], capture_output=True, timeout=30)
    return out.returncode == 0


pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(COMPOSE is None, reason="docker-compose not installed (apt docker-compose)"),
    pytest.mark.skipif(
        not _image_exists("sandgym/terminal:latest"),
        reason="image sandgym/terminal:latest not built (images/bootstrap-base.sh)",
    ),
]


def _containers(*filters: str) -> list[str]:
    args = ["docker", "ps", "-aq"]
    for f in filters:
        args += ["--filter", f]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


class Stack:
    """One compose project running docker-compose.yml from the repo root."""

    def __init__(self, project: str, port: int) -> None:
        self.project = project
        self.port = port
        self.env = {**os.environ, "SANDGYM_PORT": str(port), "SANDGYM_TOKEN": ""}

    def compose(self, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        assert COMPOSE is not None
        cmd = [COMPOSE, "-p", self.project, "-f", str(REPO / "docker-compose.yml"), *args]
        out = subprocess.run(
            cmd, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        if out.returncode != 0:
            raise AssertionError(
                f"`{' '.join(cmd[1:])}` exited with {out.returncode}, expected 0:\n"
                f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            )
        return out

    def service_container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        assert len(ids) == 1, f"expected one {service} container, found {ids}"
        return ids[0]


@pytest.fixture
def stack() -> Iterator[Stack]:
    s = Stack(f"sandgymci{os.getpid()}", free_port())
    try:
        yield s
    finally:
        # Whatever the test did: the stack goes (the test itself checks a clean `down`).
        subprocess.run(
            [COMPOSE or "docker-compose", "-p", s.project, "-f", str(REPO / "docker-compose.yml"),
             "down", "--timeout", "60"],
            cwd=REPO, env=s.env, capture_output=True, timeout=300,
        )  # fmt: skip


def _wait_healthz(url: str, timeout_s: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200:
                return dict(r.json())
            last = r.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 within {timeout_s:g}s (last: {last!r})")


def test_compose_envserver_plays_an_oracle_episode_and_downs_clean(stack: Stack) -> None:
    stack.compose("up", "-d", "--build", "envserver")
    health = _wait_healthz(f"http://127.0.0.1:{stack.port}/healthz", 120)
    assert health["status"] == "ok" and health["backend"] == "docker", health

    cid = stack.service_container("envserver")
    inspect = subprocess.run(
        ["docker", "inspect", cid], capture_output=True, text=True, timeout=60, check=True
    )
    server_host = json.loads(inspect.stdout)[0]["Config"]["Hostname"]

    task = TaskRegistry().get("builtin/hello-file")

    async def episode() -> tuple[float, bool, str]:
        url = f"ws://127.0.0.1:{stack.port}/v1/env"
        async with AsyncEnvClient(url, connect_timeout_s=60, request_timeout_s=300) as env:
            _, info = await env.reset(task.id, seed=0)
            assert info["backend"] == "docker", info
            # The server in the container runs its sandboxes on this engine, beside itself.
            mine = await asyncio.to_thread(_containers, f"label={LABEL_OWNER_HOST}={server_host}")
            assert mine, "expected a sandbox container labelled with the server's hostname"
            for action in oracle_actions(task):
                await env.step(action)
            final = await env.step({"kind": "submit"})
        return final.reward, final.terminated, str(final.info.get("verifier_output", ""))

    reward, terminated, verifier_output = asyncio.run(episode())
    assert terminated is True and reward == 1.0, verifier_output

    stack.compose("down", "--timeout", "60")
    left = _containers(f"label=com.docker.compose.project={stack.project}")
    assert left == [], f"compose containers left after down: {left}"
    sandboxes = _containers(f"label={LABEL_OWNER_HOST}={server_host}")
    assert sandboxes == [], f"sandbox containers of the server left after down: {sandboxes}"

"""What the suite's Docker-backend tests share: whether an engine answers, the base image they
run, and a `DockerBackend` of a fresh owner that is checked to leave nothing behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def engine_answers() -> bool:
    """Whether a Docker engine answers a ping (and the CLI is installed)."""
    if shutil.which("docker") is None:
        return False
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:
        return False


def bootstrap_terminal_image() -> None:
    """Make sandgym/terminal:latest (offline) unless it is there."""
    subprocess.run(["bash", str(REPO / "images" / "bootstrap-base.sh")], check=True, timeout=900)


async def owned_docker_backend() -> AsyncIterator[object]:
    """A DockerBackend of a fresh owner id; afterwards whatever a test left is reaped and none
    of the owner's containers may be left."""
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.labels import LABEL_OWNER

    b = DockerBackend(owner_id="test-" + os.urandom(4).hex())
    yield b
    await b.reap(only_expired=False)
    mine = [c for c in await b.managed_containers() if c["Labels"].get(LABEL_OWNER) == b.owner_id]
    assert mine == []
    await b.aclose()


def process_running(container_id: str, needle: str) -> bool:
    """Whether a process whose command line holds `needle` runs in the container (`docker top`,
    read from outside, as an operator would)."""
    top = subprocess.run(
        ["docker", "top", container_id, "-eo", "pid,args"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return needle in top.stdout

"""The docker backend's connection to the engine: one SDK client, connected on first use, and
the container removal every part of the backend uses."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from sandboxes.base import SandboxBackend
from sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES
from sandboxes.docker.bridge import resolve_bridge_root
from sandboxes.docker.names import DEFAULT_IMAGE
from sandboxes.errors import BackendUnavailableError


class DockerBackendBase(SandboxBackend):
    """The Docker client a backend shares among its parts (`images`, `reaping`, `backend`)."""

    name = "docker"

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 6 * 3600,
        default_image: str = DEFAULT_IMAGE,
        runtime: str | None = None,
        docker_cli: str = "docker",
        client_timeout_s: float = 600.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        bridge_root: str | Path | None = None,
        group_fork: str = "changes",
    ) -> None:
        super().__init__(owner_id, lease_s)
        if group_fork not in ("changes", "snapshot"):
            raise ValueError(
                f"docker backend option group_fork: expected 'changes' or 'snapshot', "
                f"got {group_fork!r}"
            )
        #: how a group's members copy member 0 (`sandboxes.docker.changes`): its changed files
        #: applied to sandboxes made meanwhile, or containers started from its `docker commit`
        self.forks_by_changes = group_fork == "changes"
        self.max_output_bytes = max_output_bytes
        self.bridge_root = resolve_bridge_root(bridge_root)
        self.default_image = default_image
        self.runtime = runtime
        self.docker_cli = docker_cli
        self.client_timeout_s = client_timeout_s
        self._docker: Any = None
        self._client_lock = threading.Lock()
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._storage_opt_ok: bool | None = None
        self._storage_driver: str | None = None  # `docker info` Driver, asked once
        self._storage_quota_label = ""  # the engine's sandgym.storage-quota label (setup.sh)
        self.builds = 0  # how many images this backend built (the rest were cache hits)

    def _client(self) -> Any:
        """(Thread) the shared DockerClient, connected on first use."""
        with self._client_lock:
            if self._docker is None:
                try:
                    import docker
                except ImportError as exc:
                    raise BackendUnavailableError(
                        "the docker backend needs the Docker SDK: pip install 'sandgym[docker]'"
                    ) from exc
                try:
                    client = docker.from_env(timeout=int(self.client_timeout_s), max_pool_size=64)
                    client.ping()
                except Exception as exc:
                    raise BackendUnavailableError(
                        f"no Docker engine answers (expected `docker info` to work; got: {exc})"
                    ) from exc
                self._docker = client
            return self._docker

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless a Docker engine answers."""
        await asyncio.to_thread(self._client)

    async def aclose(self) -> None:
        client, self._docker = self._docker, None
        if client is not None:
            await asyncio.to_thread(client.close)

    async def _remove_container(self, ref: str) -> None:
        import docker.errors

        try:
            await asyncio.to_thread(self._client().api.remove_container, ref, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # "removal already in progress" means someone else is doing our job.
            if "already in progress" not in str(exc):
                raise

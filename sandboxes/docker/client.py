"""The docker backend's connection to the engine (`DockerEngine`: one SDK client, connected on
first use, and the container removal every part of the backend uses), and the base the backend's
parts share (`DockerBackendBase`: its settings and its engine)."""

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


class DockerEngine:
    """One Docker engine connection, shared by a backend's parts and its sandboxes: what they ask
    of the engine goes through here, never through the backend's own members."""

    def __init__(self, timeout_s: float = 600.0) -> None:
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        """(Thread) the shared DockerClient, connected on first use."""
        with self._lock:
            if self._client is None:
                try:
                    import docker
                except ImportError as exc:
                    raise BackendUnavailableError(
                        "the docker backend needs the Docker SDK: pip install 'sandgym[docker]'"
                    ) from exc
                try:
                    client = docker.from_env(timeout=int(self.timeout_s), max_pool_size=64)
                    client.ping()
                except Exception as exc:
                    raise BackendUnavailableError(
                        f"no Docker engine answers (expected `docker info` to work; got: {exc})"
                    ) from exc
                self._client = client
            return self._client

    @property
    def api(self) -> Any:
        """(Thread) the low-level API client (`docker.APIClient`) of `client()`."""
        return self.client().api

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless a Docker engine answers."""
        await asyncio.to_thread(self.client)

    async def remove_container(self, ref: str) -> None:
        """Remove a container and its anonymous volumes, running or not; one already gone (or
        being removed by someone else) is no error."""
        import docker.errors

        try:
            await asyncio.to_thread(self.api.remove_container, ref, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # "removal already in progress" means someone else is doing our job.
            if "already in progress" not in str(exc):
                raise

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)


class DockerBackendBase(SandboxBackend):
    """What the backend's parts (`images`, `reaping`, `backend`) share: settings and the engine."""

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
        #: the engine connection every part of the backend and its sandboxes use
        self.engine = DockerEngine(client_timeout_s)
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._storage_opt_ok: bool | None = None
        self._storage_driver: str | None = None  # `docker info` Driver, asked once
        self._storage_quota_label = ""  # the engine's sandgym.storage-quota label (setup.sh)
        self.builds = 0  # how many images this backend built (the rest were cache hits)

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless a Docker engine answers."""
        await self.engine.ensure_available()

    async def aclose(self) -> None:
        await self.engine.aclose()

"""`DockerEngine`: the docker backend's one connection to the engine (one SDK client, connected
on first use) and the container removal every part of the backend and its sandboxes uses."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sandgym.sandboxes.errors import BackendUnavailableError


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

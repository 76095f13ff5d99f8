"""The base of a Docker sandbox: its container and the questions every part asks of it
(is it running, is it lost); the parts are `exec_kill`, `verifier` and `sandbox`."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxes.base import SandboxCapabilities
from sandboxes.common.lazy_shell import ShellSandbox
from sandboxes.egress import EgressProxy
from sandboxes.errors import SandboxLostError
from sandboxes.paths import normalize_sandbox_path
from sandboxes.spec import SandboxSpec
from sandboxes.usage import SandboxUsage

if TYPE_CHECKING:
    from sandboxes.docker.backend import DockerBackend
    from sandboxes.docker.group import DockerGroup


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in ticks), or None when there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):  # a zombie init is a dead container
        return None
    return fields[19]


class DockerSandboxBase(ShellSandbox):
    """What every part of a Docker sandbox uses: its container, the Docker API, and whether
    the container still runs (`_lost`). `DockerSandbox` puts the parts together."""

    backend_name = "docker"
    # `DockerBackend.create` builds the spec's Dockerfile (`DockerSandbox` adds its parts')
    capabilities = SandboxCapabilities(builds_images=True)

    def __init__(
        self, spec: SandboxSpec, backend: DockerBackend, container_id: str, sandbox_id: str
    ) -> None:
        super().__init__(spec, sandbox_id)
        self._backend = backend
        self.container_id = container_id
        self._bridge_dir: Path | None = None  # set by DockerBackend.create
        self._on_bridge = False  # attached to the engine's bridge network now
        self._proxy: EgressProxy | None = None  # the allowlist's egress proxy
        self._group: DockerGroup | None = None  # the services beside it (docker.group)
        self.max_output_bytes = backend.max_output_bytes  # per stream, exec and shell
        # Markers of recent execs, for recovering a sandbox whose pids their leftovers hold.
        self._markers: collections.deque[str] = collections.deque(maxlen=256)

    @property
    def _api(self) -> Any:
        return self._backend.engine.api

    @property
    def bridge_dir(self) -> Path | None:
        """This container's host directory, bind-mounted read-only at `/run/sandgym`."""
        return self._bridge_dir

    async def _write_deadline(self, deadline: float) -> None:
        """Into the bridge directory (the container reads it at /run/sandgym/deadline), and
        its `life` subdirectory when services beside it read it (docker.service_life)."""
        from sandboxes.lifetime import write_deadline_file

        if self._bridge_dir is not None:
            await asyncio.to_thread(write_deadline_file, self._bridge_dir, deadline)
        if self._group is not None and self._group.life_dir is not None:  # its services'
            await asyncio.to_thread(write_deadline_file, self._group.life_dir, deadline)

    async def usage(self) -> SandboxUsage:
        """CPU seconds and peak memory from the engine's stats of the container's cgroup (one
        sample, no wait), and its writable layer's size."""

        def read() -> SandboxUsage:
            stats = self._api.stats(self.container_id, stream=False, one_shot=True)
            cpu_ns = (stats.get("cpu_stats") or {}).get("cpu_usage", {}).get("total_usage")
            mem = stats.get("memory_stats") or {}
            peak = mem.get("max_usage")  # cgroup v1; v2 engines report no peak
            rows = self._api.containers(all=True, filters={"id": self.container_id}, size=True)
            size = rows[0].get("SizeRw", 0) if rows else None  # 0 is left out
            return SandboxUsage(
                cpu_s=None if cpu_ns is None else cpu_ns / 1e9,
                peak_memory_bytes=peak,
                bytes_written=size,
            )

        return await asyncio.to_thread(read)

    def _watch_host_pid(self, pid: int | None) -> None:
        """Remember the container's init as a host pid, when this process can see it (the
        server runs beside dockerd, not in a container of its own), so `is_alive` can read
        /proc instead of asking the engine: microseconds instead of milliseconds on the pool's
        hot path. The start time guards against pid reuse."""
        self._host_pid: int | None = None
        self._host_start: str | None = None
        if not pid:
            return
        try:  # the pid must be *this* container's (not a same-numbered pid in our namespace)
            with open(f"/proc/{pid}/cgroup") as f:
                if self.container_id not in f.read():
                    return
        except OSError:
            return
        start = _proc_start_time(pid)
        if start is not None:
            self._host_pid, self._host_start = pid, start

    async def is_alive(self) -> bool:
        if self._closed:
            return False
        pid = getattr(self, "_host_pid", None)
        if pid is not None:
            return _proc_start_time(pid) == self._host_start
        return await self._state() == "running"

    async def _state(self) -> str | None:
        """The container's status ('running', 'exited', ...) or None if it no longer exists."""
        import docker.errors

        try:
            info = await asyncio.to_thread(self._api.inspect_container, self.container_id)
        except docker.errors.NotFound:
            return None
        status: str = info.get("State", {}).get("Status", "unknown")
        return status

    async def _lost(self, what: str) -> SandboxLostError | None:
        """A SandboxLostError when the container is gone or stopped, else None."""
        state = await self._state()
        if state == "running":
            return None
        found = "no longer exists" if state is None else f"is {state}"
        return SandboxLostError(
            f"sandbox {self.id} ({what}): expected a running container, it {found}"
        )

    async def _check_running(self, what: str) -> None:
        """Archive calls still work on a stopped container; a stopped sandbox is lost, though
        (one inspect per file call, a few ms)."""
        self._check_open()
        lost = await self._lost(what)
        if lost is not None:
            raise lost

    def _path(self, path: str) -> str:
        return normalize_sandbox_path(path, self.spec.workdir)

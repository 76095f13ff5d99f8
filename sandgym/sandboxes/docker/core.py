"""`Container`: one sandbox's container as the engine sees it (its ids, the engine's API, whether
it still runs or is lost, its usage, the host pid of its init). Every part of a `DockerSandbox`
(`exec_kill`, `changes`, `verifier`, `files`) is given this handle; none reaches into the
backend."""

from __future__ import annotations

import asyncio
from typing import Any

from sandgym.sandboxes.docker.client import DockerEngine
from sandgym.sandboxes.errors import SandboxLostError
from sandgym.sandboxes.usage import SandboxUsage, container_peak_memory


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


class Container:
    """One sandbox's container on one engine (see the module docstring)."""

    def __init__(self, engine: DockerEngine, container_id: str, sandbox_id: str) -> None:
        self.engine = engine
        self.id = container_id
        self.sandbox_id = sandbox_id
        self.host_pid: int | None = None  # its init as a host pid, when this process sees it
        self._host_start: str | None = None

    @property
    def api(self) -> Any:
        """The engine's low-level API client."""
        return self.engine.api

    async def remove(self) -> None:
        """Remove the container (and its anonymous volumes), running or not."""
        await self.engine.remove_container(self.id)

    def watch_host_pid(self, pid: int | None) -> None:
        """Remember the container's init as a host pid, when this process can see it (the
        server runs beside dockerd, not in a container of its own), so `running` can read
        /proc instead of asking the engine: microseconds instead of milliseconds on the pool's
        hot path. The start time guards against pid reuse."""
        self.host_pid, self._host_start = None, None
        if not pid:
            return
        try:  # the pid must be *this* container's (not a same-numbered pid in our namespace)
            with open(f"/proc/{pid}/cgroup") as f:
                if self.id not in f.read():
                    return
        except OSError:
            return
        start = _proc_start_time(pid)
        if start is not None:
            self.host_pid, self._host_start = pid, start

    async def running(self) -> bool:
        """Whether the container runs: from /proc when its init's host pid is known, else the
        engine's state."""
        if self.host_pid is not None:
            return _proc_start_time(self.host_pid) == self._host_start
        return await self.state() == "running"

    async def state(self) -> str | None:
        """The container's status ('running', 'exited', ...) or None if it no longer exists."""
        import docker.errors

        try:
            info = await asyncio.to_thread(self.api.inspect_container, self.id)
        except docker.errors.NotFound:
            return None
        status: str = info.get("State", {}).get("Status", "unknown")
        return status

    async def lost(self, what: str) -> SandboxLostError | None:
        """A SandboxLostError when the container is gone or stopped, else None."""
        state = await self.state()
        if state == "running":
            return None
        found = "no longer exists" if state is None else f"is {state}"
        return SandboxLostError(
            f"sandbox {self.sandbox_id} ({what}): expected a running container, it {found}"
        )

    async def raise_if_lost(self, what: str, cause: BaseException | None = None) -> None:
        """Raise `lost(what)` (chained to `cause`, the failure that made the caller ask) when
        the container is gone or stopped. Archive calls still work on a stopped container; a
        stopped sandbox is lost, though (one inspect per file call, a few ms)."""
        lost = await self.lost(what)
        if lost is not None and cause is not None:
            raise lost from cause
        if lost is not None:
            raise lost

    async def usage(self) -> SandboxUsage:
        """CPU seconds and peak memory from the engine's stats of the container's cgroup (one
        sample, no wait), and its writable layer's size."""

        def read() -> SandboxUsage:
            stats = self.api.stats(self.id, stream=False, one_shot=True)
            cpu_ns = (stats.get("cpu_stats") or {}).get("cpu_usage", {}).get("total_usage")
            mem = stats.get("memory_stats") or {}
            peak = mem.get("max_usage")  # cgroup v1; v2 engines report no peak
            why = None
            if peak is None:  # v2: the group's memory.peak, where this process sees it
                peak, why = container_peak_memory(self.id, self.host_pid)
            rows = self.api.containers(all=True, filters={"id": self.id}, size=True)
            size = rows[0].get("SizeRw", 0) if rows else None  # 0 is left out
            return SandboxUsage(
                cpu_s=None if cpu_ns is None else cpu_ns / 1e9,
                peak_memory_bytes=peak,
                peak_memory_unavailable=why,
                bytes_written=size,
            )

        return await asyncio.to_thread(read)

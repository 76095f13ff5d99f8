"""What one sandbox consumed, read from the sandbox's own accounting: CPU seconds and peak memory
from its cgroup (docker: the engine's stats of the container's cgroup; local: its `CgroupSet`)
and the bytes its own writes keep on disk (docker: the container's writable layer; local: the
files of its tree). A figure a backend cannot read is None, never a guess; a peak memory that
cannot be read says why (`peak_memory_unavailable`).

Docker reports a container's peak memory in its stats on cgroup v1 only (`max_usage`); on
cgroup v2 the peak is read from the container's own group (`memory.peak`, kernels from 5.19)
where this process sees it (the server beside dockerd): `container_peak_memory`.

What ran beside a sandbox for its episode is counted with it (`companions`): a docker sandbox's
compose services (read when the usage is) and each private verifier container (read when its
run ends, from the group the engine put it under: `VerifierCgroup`); and the sandboxes made for
its verifier (a pristine or separate verifier's: `sandgym.sandboxes.companions.close_counted`
reads them before closing them, with their own companions)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

#: the host's cgroup file system as this process sees it
CGROUP_ROOT = Path(os.environ.get("SANDGYM_CGROUP_ROOT", "/sys/fs/cgroup"))

#: why a peak memory is None:
#: `cgroup_not_visible`: the container's cgroup is not under this process's /sys/fs/cgroup (a
#: server in a container of its own, a remote engine); `no_memory_peak`: cgroup v2 without
#: `memory.peak` (kernel before 5.19); `not_read`: the engine or the group gave nothing (the
#: sandbox was gone, the read failed); `unsupported`: the backend keeps no such figure (E2B)
PeakMemoryUnavailable = Literal["cgroup_not_visible", "no_memory_peak", "not_read", "unsupported"]

CompanionKind = Literal["service", "verifier", "pristine", "separate_verifier"]


class CompanionUsage(BaseModel):
    """A container that ran beside a sandbox for its episode: what it consumed."""

    kind: CompanionKind = Field(
        description="a compose service, a private verifier run, or a sandbox of its own made "
        "for the episode's verifier (pristine, separate_verifier)"
    )
    name: str = Field(description="the service's name, or the verifier container's")
    seconds: float | None = Field(None, description="seconds it ran (None: still running)")
    cpu_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_unavailable: PeakMemoryUnavailable | None = None


class SandboxUsage(BaseModel):
    """A sandbox's consumption so far (None: this backend cannot say)."""

    cpu_s: float | None = Field(None, description="CPU seconds its processes used, all cores")
    peak_memory_bytes: int | None = Field(
        None, description="the most memory its cgroup held at once (page cache included)"
    )
    bytes_written: int | None = Field(
        None, description="bytes its own writes keep on disk (the writable layer, or its tree)"
    )
    peak_memory_unavailable: PeakMemoryUnavailable | None = Field(
        None, description="why peak_memory_bytes is None (None when it is known)"
    )
    companions: list[CompanionUsage] = Field(
        default_factory=list, description="the containers beside it: services, verifier runs"
    )


def cgroup_v1_usage(cpuacct: Path | None, memory: Path | None) -> SandboxUsage:
    """(Thread) CPU and peak memory of a cgroup v1 group (hierarchical: exec sub-groups in)."""
    cpu_s = peak = None
    if cpuacct is not None:
        with contextlib.suppress(OSError, ValueError):
            cpu_s = int((cpuacct / "cpuacct.usage").read_text()) / 1e9
    if memory is not None:
        with contextlib.suppress(OSError, ValueError):
            peak = int((memory / "memory.max_usage_in_bytes").read_text())
    return SandboxUsage(cpu_s=cpu_s, peak_memory_bytes=peak)


def cgroup_v2_usage(group: Path) -> SandboxUsage:
    """(Thread) CPU and peak memory of a cgroup v2 group (memory.peak: kernels from 5.19)."""
    cpu_s = peak = None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        text = (group / "cpu.stat").read_text()
        usec = next(line.split()[1] for line in text.splitlines() if line.startswith("usage_usec"))
        cpu_s = int(usec) / 1e6
    with contextlib.suppress(OSError, ValueError):
        peak = int((group / "memory.peak").read_text())
    return SandboxUsage(cpu_s=cpu_s, peak_memory_bytes=peak)


def tree_bytes(root: Path) -> int:
    """(Thread) bytes the files under `root` occupy (allocated blocks; hard links once)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def cgroup_usage(rel: str, root: Path = CGROUP_ROOT) -> tuple[SandboxUsage, bool]:
    """(Thread) CPU and peak memory of the group at `rel` (a path from the hierarchy's root, as
    /proc/PID/cgroup gives it), v1 or v2 as `root` is; and whether the group is visible."""
    rel = rel.strip("/")
    if (root / "cgroup.controllers").exists():  # v2
        group = root / rel
        if not group.is_dir():
            return SandboxUsage(peak_memory_unavailable="cgroup_not_visible"), False
        used = cgroup_v2_usage(group)
        if used.peak_memory_bytes is None:
            missing = not (group / "memory.peak").exists()
            used.peak_memory_unavailable = "no_memory_peak" if missing else "not_read"
        return used, True
    memory = root / "memory" / rel
    if not memory.is_dir():
        return SandboxUsage(peak_memory_unavailable="cgroup_not_visible"), False
    cpuacct = next(
        (d for d in (root / "cpuacct" / rel, root / "cpu,cpuacct" / rel) if d.is_dir()), None
    )
    used = cgroup_v1_usage(cpuacct, memory)
    if used.peak_memory_bytes is None:
        used.peak_memory_unavailable = "not_read"
    return used, True


def container_cgroup(
    container_id: str, host_pid: int | None, root: Path = CGROUP_ROOT, proc: Path = Path("/proc")
) -> str | None:
    """(Thread) the cgroup v2 path of a docker container as this process sees it: from its
    init's /proc/PID/cgroup when its host pid is known, else where the engine's drivers put it
    (cgroupfs: /docker/ID; systemd: /system.slice/docker-ID.scope); None when none is seen."""
    if host_pid is not None:
        with contextlib.suppress(OSError):
            for line in (proc / str(host_pid) / "cgroup").read_text().splitlines():
                if line.startswith("0::") and container_id in line:
                    return line[3:]
    for rel in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
        if (root / rel).is_dir():
            return rel
    return None


def container_peak_memory(
    container_id: str, host_pid: int | None, root: Path = CGROUP_ROOT, proc: Path = Path("/proc")
) -> tuple[int | None, PeakMemoryUnavailable | None]:
    """(Thread) a docker container's peak memory on cgroup v2, which the engine's stats leave
    out: its group's `memory.peak`; (None, why) where it cannot be read."""
    if not (root / "cgroup.controllers").exists():
        return None, "not_read"  # v1: the engine's `max_usage` is the figure; it gave none
    rel = container_cgroup(container_id, host_pid, root, proc)
    if rel is None:
        return None, "cgroup_not_visible"
    used, _ = cgroup_usage(rel, root)
    return used.peak_memory_bytes, used.peak_memory_unavailable


class VerifierCgroup:
    """The parent group a private verifier container runs under (docker's `cgroup_parent`), so
    that its figures outlive it: the engine removes the container's own group when its command
    ends, and the parent keeps what its child used (CPU seconds accumulate up the hierarchy; a
    parent's peak is the peak of what its children held). Only with the engine's `cgroupfs`
    driver (a `systemd` driver takes slices, not paths: no parent is set, and the run's memory
    is `cgroup_not_visible`)."""

    def __init__(self, name: str, root: Path = CGROUP_ROOT) -> None:
        self.rel = f"sandgym-verifier-{name}"
        self.root = root

    @property
    def parent(self) -> str:
        """What `cgroup_parent` is given: a path from the hierarchy's root."""
        return "/" + self.rel

    def read_and_remove(self) -> SandboxUsage:
        """(Thread) the parent's figures (its child is gone), then remove its directories."""
        used, _ = cgroup_usage(self.rel, self.root)
        if (self.root / "cgroup.controllers").exists():
            dirs = [self.root / self.rel]
        else:
            dirs = [d / self.rel for d in self.root.iterdir() if (d / self.rel).is_dir()]
        for d in dirs:
            for sub in sorted(d.glob("*/"), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                d.rmdir()
        return used

"""What one sandbox consumed, read from the sandbox's own accounting: CPU seconds and peak memory
from its cgroup (docker: the engine's stats of the container's cgroup; local: its `CgroupSet`)
and the bytes its own writes keep on disk (docker: the container's writable layer; local: the
files of its tree). A figure a backend cannot read is None, never a guess."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pydantic import BaseModel, Field


class SandboxUsage(BaseModel):
    """A sandbox's consumption so far (None: this backend cannot say)."""

    cpu_s: float | None = Field(None, description="CPU seconds its processes used, all cores")
    peak_memory_bytes: int | None = Field(
        None, description="the most memory its cgroup held at once (page cache included)"
    )
    bytes_written: int | None = Field(
        None, description="bytes its own writes keep on disk (the writable layer, or its tree)"
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

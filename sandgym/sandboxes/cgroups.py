"""cgroup v1/v2 limits for the local backend: memory, pids and CPU per sandbox.

A `CgroupSet` is one sandbox's group in each controller. Processes join it from a `preexec_fn`
(before exec, so every descendant is counted), and `kill_all()` SIGKILLs everything inside,
including daemons that re-parented away from their starter. When cgroups are not writable
(`available()` is False) the local backend falls back to rlimits and says so in the log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from sandgym.sandboxes.usage import SandboxUsage, cgroup_v1_usage, cgroup_v2_usage

#: CFS bandwidth period of a sandbox's CPU limit. 10 ms rather than the kernel's 100 ms: a
#: sandbox that burns its quota on every core at once is throttled after 10/ncpu ms, not
#: 100/ncpu, so the neighbours' short commands wait less behind it.
CPU_PERIOD_US = 10_000
ROOT = Path(os.environ.get("SANDGYM_CGROUP_ROOT", "/sys/fs/cgroup"))
PARENT = "sandgym"


def _is_v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def available() -> bool:
    """True when this process can create cgroups for pids and memory."""
    try:
        if _is_v2():
            base = ROOT / PARENT
            base.mkdir(exist_ok=True)
            return os.access(base, os.W_OK)
        for ctl in ("pids", "memory"):
            base = ROOT / ctl / PARENT
            base.mkdir(exist_ok=True)
            if not os.access(base, os.W_OK):
                return False
        return True
    except OSError:
        return False


class CgroupSet:
    """The cgroups of one sandbox (or of one exec inside it, via `child()`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.v2 = _is_v2()
        if self.v2:
            self.dirs = {"unified": ROOT / PARENT / name}
        else:
            self.dirs = {c: ROOT / c / PARENT / name for c in ("pids", "memory", "cpu", "cpuacct")}
            for ctl in ("cpu", "cpuacct"):  # cpuacct: the CPU seconds `usage` reads
                if not (ROOT / ctl).exists() or (ctl == "cpuacct" and _same_hierarchy()):
                    self.dirs.pop(ctl)

    def create(self, memory_mb: int | None, pids_limit: int | None, cpus: float | None) -> None:
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        if self.v2:
            d = self.dirs["unified"]
            with contextlib.suppress(OSError):
                (d.parent / "cgroup.subtree_control").write_text("+pids +memory +cpu")
            if memory_mb:
                _write(d / "memory.max", str(memory_mb * 1024 * 1024))
                _write(d / "memory.swap.max", "0")
            if pids_limit:
                _write(d / "pids.max", str(pids_limit))
            if cpus:
                _write(d / "cpu.max", f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
            return
        if memory_mb:
            _write(self.dirs["memory"] / "memory.limit_in_bytes", str(memory_mb * 1024 * 1024))
            _write(self.dirs["memory"] / "memory.swappiness", "0")
        if pids_limit:
            _write(self.dirs["pids"] / "pids.max", str(pids_limit))
        if cpus and "cpu" in self.dirs:
            _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(int(cpus * CPU_PERIOD_US)))

    def child(self, name: str) -> CgroupSet:
        """A sub-group (limits inherited from the parent) used to kill one exec's tree."""
        sub = CgroupSet.__new__(CgroupSet)
        sub.name = f"{self.name}/{name}"
        sub.v2 = self.v2
        sub.dirs = {k: d / name for k, d in self.dirs.items()}
        for d in sub.dirs.values():
            d.mkdir(exist_ok=True)
        return sub

    def join_paths(self) -> list[str]:
        """The `cgroup.procs` files a process writes its pid to, to join this set."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs.values():
            for procs in [d / "cgroup.procs", *(s / "cgroup.procs" for s in _subdirs(d))]:
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(x) for x in procs.read_text().split())
        return found

    def usage(self) -> SandboxUsage:
        """CPU seconds and peak memory of the group so far (its exec sub-groups included)."""
        if self.v2:
            used = cgroup_v2_usage(self.dirs["unified"])
            if used.peak_memory_bytes is None:  # kernels before 5.19 have no memory.peak
                missing = not (self.dirs["unified"] / "memory.peak").exists()
                used.peak_memory_unavailable = "no_memory_peak" if missing else "not_read"
            return used
        cpuacct = self.dirs.get("cpuacct") or self.dirs.get("cpu")  # cpu,cpuacct mounted as one
        used = cgroup_v1_usage(cpuacct, self.dirs.get("memory"))
        if used.peak_memory_bytes is None:
            used.peak_memory_unavailable = "not_read"
        return used

    def oom_killed(self) -> bool:
        """True if the kernel OOM-killed something in this group (v1: failcnt > 0)."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            if self.v2:
                text = (self.dirs["unified"] / "memory.events").read_text()
                return any(
                    line.startswith("oom_kill ") and int(line.split()[1]) > 0
                    for line in text.splitlines()
                )
            return int((self.dirs["memory"] / "memory.failcnt").read_text()) > 0
        return False

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the group (and sub-groups) until none is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and remove the group directories (children first)."""
        self.kill_all()
        for d in self.dirs.values():
            for sub in _subdirs(d):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                d.rmdir()


def _same_hierarchy() -> bool:
    """cgroup v1 with cpu and cpuacct mounted together (`cpu` a link to `cpu,cpuacct`)."""
    with contextlib.suppress(OSError):
        return (ROOT / "cpu").resolve() == (ROOT / "cpuacct").resolve()
    return False


def _subdirs(d: Path) -> list[Path]:
    try:
        return [p for p in d.iterdir() if p.is_dir()]
    except OSError:
        return []


def _write(path: Path, value: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(value)


def join(paths: list[str]) -> None:
    """Move the calling process into the given cgroups (used as a `preexec_fn`)."""
    pid = str(os.getpid())
    for p in paths:
        with contextlib.suppress(OSError):
            with open(p, "w") as f:
                f.write(pid)

"""How busy the host was while a compatibility check ran, for its line (`host_load`): a timed
test's verdict depends on it (docs/harbor_compat.md, portfolio-optimization), so the line
carries the host's state beside the verdict rather than leaving a reader to guess it.

`HostLoad()` reads `/proc/stat` and `/proc/loadavg` when made; `finish()` reads them again and
gives, over that span: the share of all CPUs' time that was busy (everything but idle and
iowait, the check's own sandboxes and builds included) and the share stolen by the hypervisor,
the 1-minute load average at both ends, and the CPU count. Linux only; elsewhere, or where the
files cannot be read, `finish()` gives None.

`DiskSpace(path)` does the same for the free space of the filesystem that holds `path` (the
engine's data root, for `engine_disk`): a build or a verifier that runs out of space there
measures nothing about the task (reason `disk_full`), and the line then shows how full it was.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

#: the fields of /proc/stat's `cpu` line, in order (proc(5)); guest time is already in user
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def read_cpu_times(stat: Path) -> dict[str, int] | None:
    """The all-CPU counters of /proc/stat's first line (clock ticks), or None."""
    try:
        first = stat.read_text(encoding="ascii").splitlines()[0].split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        values = [int(v) for v in first[1 : 1 + len(_FIELDS)]]
    except ValueError:
        return None
    values += [0] * (len(_FIELDS) - len(values))
    return dict(zip(_FIELDS, values, strict=True))


def read_loadavg_1m(loadavg: Path) -> float | None:
    try:
        return float(loadavg.read_text(encoding="ascii").split()[0])
    except (OSError, IndexError, ValueError, UnicodeDecodeError):
        return None


class HostLoad:
    """The host's CPU counters from when it was made until `finish()`."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.stat, self.loadavg = proc / "stat", proc / "loadavg"
        self.start = read_cpu_times(self.stat)
        self.load_start = read_loadavg_1m(self.loadavg)

    def finish(self) -> dict[str, Any] | None:
        end = read_cpu_times(self.stat)
        if self.start is None or end is None:
            return None
        delta = {k: end[k] - self.start[k] for k in _FIELDS}
        total = sum(delta.values())
        if total <= 0:
            return None
        idle = delta["idle"] + delta["iowait"]
        return {
            "cpus": os.cpu_count(),
            "busy_share": round((total - idle) / total, 3),
            "steal_share": round(delta["steal"] / total, 3),
            "loadavg_1m": [self.load_start, read_loadavg_1m(self.loadavg)],
        }


def _free_gb(path: Path) -> tuple[float, float] | None:
    """(total, free) GiB of the filesystem holding `path`, or None where it cannot be read."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return round(usage.total / 2**30, 1), round(usage.free / 2**30, 1)


class DiskSpace:
    """The free space of the filesystem holding `path`, from when it was made until `finish()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = _free_gb(path)

    def finish(self) -> dict[str, Any] | None:
        end = _free_gb(self.path)
        if self.start is None or end is None:
            return None
        return {"path": str(self.path), "total_gb": end[0], "free_gb": [self.start[1], end[1]]}

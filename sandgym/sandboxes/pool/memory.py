"""The host's memory floor: a creation is refused, by name, before the host would swap.

`available_mib()` reads the kernel's own estimate of memory that can be taken without swapping
(`MemAvailable` in /proc/meminfo); `check_memory_floor` raises `HostMemoryError` when it is
below the pool's `min_available_memory_mb`. One read of a small procfs file per creation: no
cost that grows with the number of sandboxes held.
"""

from __future__ import annotations

from pathlib import Path

from sandgym.sandboxes.pool.errors import HostMemoryError

MEMINFO = Path("/proc/meminfo")


def available_mib(meminfo: Path = MEMINFO) -> float | None:
    """MemAvailable in MiB; None where the kernel does not report it (not Linux)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return None


def check_memory_floor(floor_mb: float | None, held: int, meminfo: Path = MEMINFO) -> None:
    """Raise `HostMemoryError` when the host has less than `floor_mb` MiB available (nothing
    when `floor_mb` is None or the figure is unknown). `held` goes into the message."""
    if floor_mb is None:
        return
    avail = available_mib(meminfo)
    if avail is not None and avail < floor_mb:
        raise HostMemoryError(
            f"host memory: expected at least {floor_mb:.0f} MiB available before creating a "
            f"sandbox (min_available_memory_mb), found {avail:.0f} MiB with {held} sandboxes "
            "held; a later create may find room once some are closed",
            available_mib=avail,
            floor_mib=floor_mb,
        )

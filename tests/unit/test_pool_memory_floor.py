"""The pool's memory floor (issue 59): MemAvailable read from a meminfo file, and a refusal by
name below the floor; a null-backend pool refuses a miss there and creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.pool import HostMemoryError, PoolSettings, SandboxPool
from sandgym.sandboxes.pool.memory import available_mib, check_memory_floor


def meminfo(tmp_path: Path, kib: int) -> Path:
    p = tmp_path / "meminfo"
    p.write_text(f"MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   {kib} kB\n")
    return p


def test_available_and_floor(tmp_path: Path) -> None:
    info = meminfo(tmp_path, 512 * 1024)
    assert available_mib(info) == 512
    assert available_mib(tmp_path / "absent") is None
    check_memory_floor(256, 3, info)  # above the floor: nothing
    check_memory_floor(None, 3, info)  # no floor: nothing
    with pytest.raises(HostMemoryError) as refused:
        check_memory_floor(1024, 7, info)
    msg = str(refused.value)
    assert "expected at least 1024 MiB" in msg and "found 512 MiB" in msg and "7 sandboxes" in msg
    assert (refused.value.available_mib, refused.value.floor_mib) == (512, 1024)


async def test_pool_refuses_a_miss_below_the_floor_and_makes_nothing() -> None:
    pool = SandboxPool(get_backend("null"), PoolSettings(min_available_memory_mb=10.0**9))
    await pool.start()
    try:
        with pytest.raises(HostMemoryError):
            await pool.acquire(SandboxSpec())
        assert pool.stats.created == 0 and pool.total() == 0
    finally:
        await pool.close()

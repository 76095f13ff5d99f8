"""`SandboxPool.ready_ids()`: the public view of the ready sandboxes a benchmark leaves out of
an engine's container count (lab once read `pool._keys` for it)."""

from __future__ import annotations

from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.pool import PoolSettings, SandboxPool


async def test_ready_ids_are_the_made_sandboxes_not_leased() -> None:
    backend = get_backend("null")
    pool = SandboxPool(backend, PoolSettings(min_ready=2))
    await pool.start()
    try:
        assert pool.ready_ids() == set()
        await pool.prewarm([SandboxSpec()])
        await pool.wait_idle()
        assert len(backend.live) == 2, f"expected 2 made sandboxes, found {sorted(backend.live)}"
        assert pool.ready_ids() == set(backend.live)
        leased = await pool.acquire(SandboxSpec())
        assert leased.id not in pool.ready_ids()
        await pool.wait_idle()  # the pool makes a replacement for the next acquire
        assert len(backend.live) == 3, f"expected 3 live sandboxes, found {sorted(backend.live)}"
        assert pool.ready_ids() == set(backend.live) - {leased.id}
        await pool.release(leased)
    finally:
        await pool.close()

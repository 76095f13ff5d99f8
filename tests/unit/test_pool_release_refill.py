"""What a release refills (issue 59): a sandbox-API close (`replace=False`) leaves the warm pool
at the target the operator configured, not at the number of sandboxes once held; an episode's
end (the default) keeps one replacement per released sandbox while the key is in demand."""

from __future__ import annotations

from sandgym.sandboxes import SandboxSpec, get_backend
from sandgym.sandboxes.pool import PoolSettings, SandboxPool

HELD = 12


async def _ready_after_releasing(replace: bool) -> tuple[int, int]:
    backend = get_backend("null")
    pool = SandboxPool(backend, PoolSettings(min_ready=2, max_total=64))
    await pool.start()
    try:
        held = [await pool.acquire(SandboxSpec()) for _ in range(HELD)]
        for sb in held:
            await pool.release(sb, replace=replace)
        await pool.wait_idle()
        (key,) = pool.snapshot().keys.values()
        return key.ready, len(backend.live)
    finally:
        await pool.close()


async def test_a_sandbox_api_close_leaves_the_configured_warm_target() -> None:
    ready, live = await _ready_after_releasing(replace=False)
    assert (ready, live) == (2, 2), f"expected min_ready=2 ready and live, found {ready}, {live}"


async def test_an_episode_end_keeps_a_replacement_per_release() -> None:
    ready, live = await _ready_after_releasing(replace=True)
    assert (ready, live) == (HELD, HELD), f"expected {HELD} replacements, found {ready}, {live}"

"""The live pool's sweep of untracked sandboxes (sandgym issue 8).

A creation whose answer is lost (the engine died, the call was cancelled) can still leave a
sandbox labelled with the live server's owner id; the start-up reap and `sandgym reap` spare
it while its owner lives. The pool's sweep (`SandboxPool.sweep_untracked`, run every
`sweep_interval_s`) removes such sandboxes; `sandgym.sandboxes.reaper.sweep_untracked` decides.

Here: the decision function on its own; the pool against a null backend whose listing also
shows "lost" sandboxes (and can hang a creation after its sandbox appeared, or fail); and the
real local backend with a planted lost tree.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from sandgym.sandboxes import PoolClosedError, PoolSettings, SandboxError, SandboxPool, SandboxSpec
from sandgym.sandboxes.labels import LABEL_OWNER
from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.sandboxes.reaper import Sighting, sweep_untracked
from tests.waiting import wait_until

SPEC = SandboxSpec(env={"KEY": "a"})


# -- the decision --------------------------------------------------------------------------------
def decide(
    listed: list[str],
    tracked: set[str],
    seen: dict[str, Sighting],
    *,
    now: float,
    grace_s: float = 10.0,
    during: set[int] | None = None,
    in_flight: set[int] | None = None,
) -> tuple[list[str], dict[str, Sighting]]:
    return sweep_untracked(
        listed,
        tracked,
        seen,
        in_flight_during=during or set(),
        in_flight_now=in_flight or set(),
        now=now,
        grace_s=grace_s,
    )


def test_decision_keeps_tracked_and_needs_a_second_sighting_after_the_grace() -> None:
    remove, seen = decide(["sg-live", "sg-lost"], {"sg-live"}, {}, now=100.0)
    assert remove == [] and set(seen) == {"sg-lost"} and seen["sg-lost"].first_seen == 100.0
    # young: seen 5 s ago, grace 10 s -> kept, first sighting unchanged
    remove, seen = decide(["sg-live", "sg-lost"], {"sg-live"}, seen, now=105.0)
    assert remove == [] and seen["sg-lost"].first_seen == 100.0
    remove, seen = decide(["sg-live", "sg-lost"], {"sg-live"}, seen, now=110.0)
    assert remove == ["sg-lost"] and seen == {}


def test_decision_never_removes_what_a_creation_in_flight_may_return() -> None:
    # seen while creations 7 and 8 ran; 8 still runs -> kept however old
    _, seen = decide(["sg-x"], set(), {}, now=0.0, during={7, 8}, in_flight={7, 8})
    assert seen["sg-x"].creates_in_flight == frozenset({7, 8})
    remove, seen = decide(["sg-x"], set(), seen, now=1e6, in_flight={8, 9})
    assert remove == [] and "sg-x" in seen
    # 8 ended without returning it (else it would be tracked); a later creation (9) cannot
    # have made a sandbox that existed before it began -> removed
    remove, seen = decide(["sg-x"], set(), seen, now=1e6 + 1, in_flight={9})
    assert remove == ["sg-x"]


def test_decision_forgets_what_became_tracked_or_disappeared() -> None:
    _, seen = decide(["sg-a", "sg-b"], set(), {}, now=0.0, grace_s=0.0)
    # a returned (tracked now), b is gone: neither is removed or remembered
    remove, seen = decide(["sg-a"], {"sg-a"}, seen, now=50.0, grace_s=0.0)
    assert remove == [] and seen == {}


# -- the pool, on a null backend with a listing ---------------------------------------------------
class ListingBackend(NullBackend):
    """NullBackend whose listing shows its live sandboxes plus `lost` ones (sandboxes a
    creation made without the pool learning of them). `hang_after_appear` makes the next
    creation show its sandbox in the listing, then wait for `release_create` before it
    returns (or raises, with `fail_hung`)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.lost: set[str] = set()
        self.list_errors = 0  # the next N listings raise
        self.remove_errors = 0  # the next N removals raise
        self.removed: list[str] = []
        self.live_removed: list[str] = []  # must stay empty: checked after every test
        self.listings = 0
        self.hang_after_appear = False
        self.fail_hung = False
        self.appeared: asyncio.Event = asyncio.Event()
        self.release_create: asyncio.Event = asyncio.Event()
        self.sandboxes: dict[str, NullSandbox] = {}

    async def create(self, spec: SandboxSpec) -> NullSandbox:
        sb = await super().create(spec)
        self.sandboxes[sb.id] = sb
        if self.hang_after_appear:
            self.hang_after_appear = False
            self.appeared.set()
            await self.release_create.wait()
            if self.fail_hung:  # the answer is lost: the sandbox stays, nobody holds it
                self.live.discard(sb.id)
                self.lost.add(sb.id)
                raise SandboxError("injected: the engine went away mid-create")
        return sb

    async def owned_sandbox_ids(self) -> list[str]:
        self.listings += 1
        await asyncio.sleep(0)
        if self.list_errors:
            self.list_errors -= 1
            raise SandboxError("injected: listing failed")
        return sorted(self.live | self.lost)

    async def remove_sandbox(self, sandbox_id: str) -> None:
        if self.remove_errors:
            self.remove_errors -= 1
            raise SandboxError(f"injected: removing {sandbox_id} failed")
        if sandbox_id in self.live:
            self.live_removed.append(sandbox_id)  # the pool's own: a bug (it is not removed)
            return
        self.lost.discard(sandbox_id)
        self.removed.append(sandbox_id)


PoolFactory = Callable[..., SandboxPool]


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    pools: list[SandboxPool] = []

    def factory(backend: NullBackend, **settings: object) -> SandboxPool:
        settings.setdefault("sweep_interval_s", None)  # rounds by hand unless asked
        pool = SandboxPool(backend, PoolSettings(**settings))  # type: ignore[arg-type]
        pools.append(pool)
        return pool

    yield factory
    for pool in pools:
        await pool.close()
        assert not pool.backend.live, "pool.close() left sandboxes alive"  # type: ignore[attr-defined]
        violated = getattr(pool.backend, "live_removed", [])
        assert violated == [], f"the sweep removed the pool's own sandboxes {violated}"


async def test_sweep_removes_old_untracked_and_keeps_ready_and_leased(
    make_pool: PoolFactory,
) -> None:
    backend = ListingBackend()
    pool = make_pool(backend, min_ready=2, sweep_grace_s=0.0)
    await pool.start()
    await pool.prewarm([SPEC], count=2)
    await pool.wait_idle(timeout_s=10)
    leased = await pool.acquire(SPEC)
    await pool.wait_idle(timeout_s=10)
    backend.lost = {"sg-lost0000001"}
    live_before = set(backend.live)
    assert len(live_before) == 3  # one leased, two ready (one refilled behind the hit)

    assert await pool.sweep_untracked() == []  # first sighting
    assert await pool.sweep_untracked() == ["sg-lost0000001"]
    assert backend.lost == set() and backend.live == live_before
    assert (await leased.exec("echo ok")).stdout == "ok\n"
    assert pool.stats.swept == 1 and pool.snapshot().swept == 1
    assert backend.live_removed == [] and pool.stats.sweep_errors == 0
    assert await pool.sweep_untracked() == []  # nothing left to do
    await pool.release(leased)


async def test_young_untracked_sandbox_is_kept_until_the_grace_passed(
    make_pool: PoolFactory,
) -> None:
    backend = ListingBackend()
    pool = make_pool(backend, sweep_grace_s=3600.0)
    await pool.start()
    backend.lost = {"sg-lost0000002"}
    for _ in range(3):
        assert await pool.sweep_untracked() == []
    assert backend.lost == {"sg-lost0000002"} and pool.stats.swept == 0


async def test_creation_in_flight_is_never_raced_and_a_lost_one_is_swept_after(
    make_pool: PoolFactory,
) -> None:
    backend = ListingBackend()
    pool = make_pool(backend, sweep_grace_s=0.0, create_retries=0)
    await pool.start()

    # A creation whose sandbox is listed before the pool learnt of it: never removed.
    backend.hang_after_appear = True
    acquiring = asyncio.create_task(pool.acquire(SPEC))
    await asyncio.wait_for(backend.appeared.wait(), 10)
    assert await pool.sweep_untracked() == []
    assert await pool.sweep_untracked() == []  # still in flight: kept, however long
    backend.release_create.set()
    sb = await asyncio.wait_for(acquiring, 10)
    assert await pool.sweep_untracked() == []
    assert backend.removed == [] and sb.id in backend.live
    await pool.release(sb)
    await pool.wait_idle(timeout_s=10)

    # The same, but the creation fails: its sandbox is a leftover once that creation ended.
    backend.appeared.clear()
    backend.release_create.clear()
    backend.hang_after_appear = True
    backend.fail_hung = True
    acquiring = asyncio.create_task(pool.acquire(SandboxSpec(env={"KEY": "b"})))
    await asyncio.wait_for(backend.appeared.wait(), 10)
    assert await pool.sweep_untracked() == []  # seen while its creation runs
    backend.release_create.set()
    with pytest.raises(SandboxError):
        await asyncio.wait_for(acquiring, 10)
    (lost,) = backend.lost
    assert await pool.sweep_untracked() == [lost]
    assert backend.lost == set()


async def test_what_an_abandoned_destroy_left_is_swept(make_pool: PoolFactory) -> None:
    backend = ListingBackend()
    pool = make_pool(backend, sweep_grace_s=0.0)
    await pool.start()
    sb = await pool.acquire(SPEC)

    async def broken_destroy() -> None:  # the engine kept the sandbox; close() failed
        backend.live.discard(sb.id)
        backend.lost.add(sb.id)
        raise SandboxError("injected: destroy failed")

    sb._destroy = broken_destroy  # type: ignore[method-assign]
    await pool.release(sb)
    await pool.wait_idle(timeout_s=10)
    assert pool.stats.destroy_failures == 1
    assert await pool.sweep_untracked() == []
    assert await pool.sweep_untracked() == [sb.id]


async def test_background_sweep_survives_errors_and_retries(make_pool: PoolFactory) -> None:
    backend = ListingBackend()
    pool = make_pool(backend, sweep_interval_s=0.01, sweep_grace_s=0.0)
    backend.list_errors = 2
    backend.remove_errors = 1
    backend.lost = {"sg-lost0000003"}
    await pool.start()
    await wait_until(
        lambda: backend.removed == ["sg-lost0000003"], 10.0, 0.005, "the leftover swept"
    )
    # 2 failed listings, then 1 failed removal; the loop carried on after each
    assert pool.stats.sweep_errors == 3
    assert pool.stats.swept == 1
    listings = backend.listings
    await wait_until(
        lambda: backend.listings > listings + 2, 10.0, 0.005, "the loop to keep running"
    )


async def test_close_stops_the_sweep(make_pool: PoolFactory) -> None:
    backend = ListingBackend()
    pool = make_pool(backend, sweep_interval_s=0.01, sweep_grace_s=0.0)
    await pool.start()
    await wait_until(lambda: backend.listings >= 2, 10.0, 0.005, "two sweep rounds")
    await pool.close()
    assert pool._sweep_task is not None and pool._sweep_task.done()
    listings = backend.listings
    await asyncio.sleep(0.05)
    assert backend.listings == listings
    with pytest.raises(PoolClosedError):
        await pool.sweep_untracked()


async def test_sweep_ends_itself_on_a_backend_that_cannot_list(make_pool: PoolFactory) -> None:
    pool = make_pool(NullBackend(), sweep_interval_s=0.01)
    await pool.start()
    assert await pool.sweep_untracked() == []
    task = pool._sweep_task
    assert task is not None
    await asyncio.wait_for(task, 10)  # the first round finds no listing and the loop ends
    assert pool.stats.sweep_errors == 0


async def test_default_settings_sweep_every_minute() -> None:
    s = PoolSettings()
    assert s.sweep_interval_s == 60.0 and s.sweep_grace_s == 60.0
    with pytest.raises(ValueError):
        PoolSettings(sweep_interval_s=0)
    with pytest.raises(ValueError):
        PoolSettings(sweep_grace_s=-1)


async def test_pools_sharing_an_owner_never_sweep_each_others_sandboxes(
    make_pool: PoolFactory,
) -> None:
    backend = ListingBackend()
    first = make_pool(backend, min_ready=1, sweep_grace_s=0.0)
    second = make_pool(backend, sweep_grace_s=0.0)
    await first.start()
    await second.start()
    await first.prewarm([SPEC], count=1)
    await first.wait_idle(timeout_s=10)
    (ready,) = backend.live
    backend.lost = {"sg-lost0000004"}
    assert await second.sweep_untracked() == []
    assert await second.sweep_untracked() == ["sg-lost0000004"]
    assert backend.live == {ready}


# -- the real local backend ------------------------------------------------------------------------
async def test_local_backend_sweep_removes_a_lost_tree_of_ours_only(tmp_path: Path) -> None:
    from sandgym.sandboxes.local import LocalBackend

    backend = LocalBackend(root=tmp_path)
    pool = SandboxPool(backend, PoolSettings(sweep_interval_s=None, sweep_grace_s=0.0))
    await pool.start()
    try:
        sb = await pool.acquire(SandboxSpec())
        # a lost creation of ours: labelled (labels come first), never handed to the pool
        lost = tmp_path / "sg-lost00000005"
        (lost / "fs").mkdir(parents=True)
        (lost / "labels.json").write_text(json.dumps(backend.labels_for(SandboxSpec())))
        # another live server's sandbox, and a tree still being created (no labels yet)
        other = tmp_path / "sg-other0000006"
        other.mkdir()
        (other / "labels.json").write_text(
            json.dumps({**backend.labels_for(SandboxSpec()), LABEL_OWNER: "someone-else"})
        )
        creating = tmp_path / "sg-creating0007"
        (creating / "fs").mkdir(parents=True)

        assert sorted(await backend.owned_sandbox_ids()) == sorted([sb.id, lost.name])
        assert await pool.sweep_untracked() == []
        assert await pool.sweep_untracked() == [lost.name]
        assert not lost.exists() and other.is_dir() and creating.is_dir()
        assert (await sb.exec("echo alive")).stdout == "alive\n"
        with pytest.raises(SandboxError, match="someone-else"):
            await backend.remove_sandbox(other.name)
        with pytest.raises(SandboxError, match="sg-<hex>"):
            await backend.remove_sandbox("../etc")
        await pool.release(sb)
    finally:
        await pool.close()
    assert await backend.owned_sandbox_ids() == []

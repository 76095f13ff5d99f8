"""Unit tests of the warm sandbox pool (`sandgym.sandboxes.pool`) against the in-memory `null` backend.

Every pool rule has a test here: the global cap under a burst, the create concurrency cap, the
rate limit, idle recycling, health replacement, failing keys and their recovery, fairness when
capped, never-reuse, prewarm, close (also under cancellation) and acquire timeouts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sandgym.sandboxes import (
    PoolClosedError,
    PoolKeyFailingError,
    PoolSettings,
    PoolTimeoutError,
    SandboxCreateError,
    SandboxPool,
    SandboxSpec,
)
from sandgym.sandboxes.null import NullBackend, NullSandbox
from sandgym.sandboxes.pool import core as pool_core
from tests.waiting import wait_until

SPEC_A = SandboxSpec(env={"KEY": "a"})
SPEC_B = SandboxSpec(env={"KEY": "b"})


class TrackingBackend(NullBackend):
    """NullBackend that records peaks the pool must respect."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.attempts = 0
        self.creating_now = 0
        self.peak_creating = 0
        self.peak_live = 0
        self.create_starts: list[float] = []
        self.sandboxes: dict[str, NullSandbox] = {}
        self.reap_calls = 0
        self.fail_for: set[str] = set()  # env KEY values whose creations fail
        # while clear, a creation stays inside create() (counted in creating_now) until it is set
        self.hold = asyncio.Event()
        self.hold.set()

    async def create(self, spec: SandboxSpec) -> NullSandbox:
        self.attempts += 1
        self.creating_now += 1
        self.peak_creating = max(self.peak_creating, self.creating_now)
        self.create_starts.append(time.monotonic())
        try:
            await self.hold.wait()
            if spec.env.get("KEY") in self.fail_for:
                raise SandboxCreateError(f"injected failure for key {spec.env['KEY']}")
            sb = await super().create(spec)
        finally:
            self.creating_now -= 1
        self.sandboxes[sb.id] = sb
        self.peak_live = max(self.peak_live, len(self.live))
        return sb

    async def reap(self, only_expired: bool = True) -> list[str]:
        self.reap_calls += 1
        return ["sg-leftover1", "sg-leftover2"]


PoolFactory = Callable[..., SandboxPool]


def waiting(pool: SandboxPool, spec: SandboxSpec) -> int:
    """The acquires of `spec` waiting in `pool` now."""
    key = pool.snapshot().keys.get(spec.fingerprint("null"))
    return 0 if key is None else key.waiting


def creating(pool: SandboxPool, spec: SandboxSpec) -> int:
    """The creations of `spec` the pool has started (slots reserved) and not yet finished."""
    key = pool.snapshot().keys.get(spec.fingerprint("null"))
    return 0 if key is None else key.creating


def inside_create(pool: SandboxPool, backend: TrackingBackend) -> bool:
    """Every creation the pool started is inside `backend.create()` now."""
    return backend.creating_now == pool.snapshot().totals.creating


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolFactory]:
    """Build pools whose close() is guaranteed at the end of the test."""
    pools: list[SandboxPool] = []

    def factory(backend: NullBackend, **settings: object) -> SandboxPool:
        pool = SandboxPool(backend, PoolSettings(**settings))  # type: ignore[arg-type]
        pools.append(pool)
        return pool

    yield factory
    for pool in pools:
        await pool.close()
        assert not pool.backend.live, "pool.close() left sandboxes alive"  # type: ignore[attr-defined]


async def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        PoolSettings(max_total=0)
    with pytest.raises(ValueError):
        PoolSettings(create_backoff_s=5, create_backoff_max_s=1)
    with pytest.raises(ValueError):
        PoolSettings(no_such_field=1)  # type: ignore[call-arg]
    used = {"max_total", "create_backoff_s", "create_backoff_max_s"}
    assert used <= set(PoolSettings.model_fields), "PoolSettings lacks the fields tested here"
    for name, f in PoolSettings.model_fields.items():
        assert f.description, f"PoolSettings.{name} has no description"


async def test_start_reaps_backend_leftovers_first(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend)
    await pool.start()
    assert backend.reap_calls == 1
    assert pool.stats.reaped == 2


async def test_max_total_never_exceeded_under_200_concurrent_acquires(
    make_pool: PoolFactory,
) -> None:
    backend = TrackingBackend(create_delay_s=0.002)
    pool = make_pool(backend, max_total=10, max_concurrent_creates=4, min_ready=3)
    await pool.start()
    await pool.prewarm([SPEC_A, SPEC_B], count=3)
    peak_total = 0

    async def episode(i: int) -> str:
        nonlocal peak_total
        sb = await pool.acquire(SPEC_A if i % 3 else SPEC_B, timeout_s=30)
        peak_total = max(peak_total, pool.total())
        await asyncio.sleep(0)
        await pool.release(sb)
        return sb.id

    ids = await asyncio.gather(*(episode(i) for i in range(200)))
    await pool.wait_idle(timeout_s=10)
    assert len(set(ids)) == 200, "a sandbox was handed out twice"
    assert backend.peak_live <= 10
    assert pool.stats.peak_total <= 10
    assert peak_total <= 10
    assert pool.stats.hits + pool.stats.misses == 200
    await pool.close()
    assert not backend.live
    assert backend.created == backend.destroyed


async def test_concurrent_create_cap(make_pool: PoolFactory) -> None:
    backend = TrackingBackend(create_delay_s=0.01)
    pool = make_pool(backend, max_total=30, max_concurrent_creates=3)
    sbs = await asyncio.gather(*(pool.acquire(SPEC_A) for _ in range(12)))
    assert len({sb.id for sb in sbs}) == 12
    assert backend.peak_creating == 3
    assert all(not sb.from_pool for sb in sbs)


async def test_create_rate_limit_spaces_creations(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    rate = 40.0
    pool = make_pool(backend, max_total=20, max_concurrent_creates=8, create_rate_per_s=rate)
    await asyncio.gather(*(pool.acquire(SPEC_A) for _ in range(6)))
    starts = backend.create_starts
    assert len(starts) == 6
    # A token bucket with burst 1 never lets two creations start closer than 1/rate apart; a
    # lower bound only (a slow machine makes the gaps longer, never shorter).
    assert starts[-1] - starts[0] >= 5 / rate * 0.98


async def test_ready_sandbox_past_max_idle_is_recycled_not_handed_out(
    make_pool: PoolFactory,
) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1, max_idle_s=0.05)
    await pool.prewarm([SPEC_A])  # no start(): only the acquire-time check can recycle
    await pool.wait_idle(timeout_s=5)
    stale = set(backend.live)
    assert len(stale) == 1
    await asyncio.sleep(0.1)
    sb = await pool.acquire(SPEC_A)
    assert sb.id not in stale
    assert pool.stats.idle_recycled == 1
    await pool.wait_idle(timeout_s=5)
    assert not stale & backend.live


async def test_background_loop_recycles_and_replaces_idle(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=2, max_idle_s=0.05, maintenance_interval_s=0.01)
    await pool.start()
    await pool.prewarm([SPEC_A], count=2)
    await pool.wait_idle(timeout_s=5)
    first = set(backend.live)
    await wait_until(
        lambda: pool.stats.idle_recycled >= 2 and len(backend.live - first) == 2,
        10.0, 0.01, "both idle sandboxes recycled and replaced",
    )  # fmt: skip
    assert pool.stats.idle_recycled >= 2
    assert len(backend.live - first) == 2, "idle sandboxes were not replaced"
    assert pool.snapshot().keys[SPEC_A.fingerprint("null")].ready <= 2


async def test_dead_ready_sandbox_is_replaced_silently(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1)
    await pool.prewarm([SPEC_A])
    await pool.wait_idle(timeout_s=5)
    (dead_id,) = backend.live
    backend.sandboxes[dead_id].kill()
    sb = await pool.acquire(SPEC_A)
    assert sb.id != dead_id
    assert await sb.is_alive()
    assert (await sb.exec("echo ok")).stdout == "ok\n"
    assert pool.stats.health_replaced == 1
    await pool.wait_idle(timeout_s=5)
    assert dead_id not in backend.live


async def test_hanging_health_check_counts_as_dead(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1, health_check_timeout_s=0.05)
    await pool.prewarm([SPEC_A])
    await pool.wait_idle(timeout_s=5)
    (stuck_id,) = backend.live

    async def hang() -> bool:
        await asyncio.sleep(30)
        return True

    backend.sandboxes[stuck_id].is_alive = hang  # type: ignore[method-assign]
    sb = await pool.acquire(SPEC_A, timeout_s=5)
    assert sb.id != stuck_id
    assert pool.stats.health_replaced == 1


async def test_health_check_off_hands_out_without_checking(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1, health_check=False)
    await pool.prewarm([SPEC_A])
    await pool.wait_idle(timeout_s=5)
    (dead_id,) = backend.live
    backend.sandboxes[dead_id].kill()
    sb = await pool.acquire(SPEC_A)
    assert sb.id == dead_id and sb.from_pool
    assert pool.stats.health_replaced == 0


async def test_failing_key_fails_fast_with_last_error_then_recovers(
    make_pool: PoolFactory,
) -> None:
    backend = TrackingBackend()
    backend.fail_for.add("a")
    pool = make_pool(
        backend,
        create_retries=1,
        create_backoff_s=0.0,
        create_backoff_max_s=0.0,
        failing_after=3,
        failing_cooldown_s=0.2,
    )
    # 2 attempts fail: a plain creation error, key not yet failing.
    with pytest.raises(SandboxCreateError) as first:
        await pool.acquire(SPEC_A)
    assert not isinstance(first.value, PoolKeyFailingError)
    assert "injected" in str(first.value)
    assert backend.attempts == 2
    # The 3rd consecutive failure marks the key failing; the waiter learns it at once.
    with pytest.raises(PoolKeyFailingError):
        await pool.acquire(SPEC_A)
    assert backend.attempts == 3
    # Now acquires fail fast: no new attempt, and the last error is carried.
    with pytest.raises(PoolKeyFailingError) as fast:
        await pool.acquire(SPEC_A)
    assert backend.attempts == 3
    assert isinstance(fast.value.last_error, SandboxCreateError)
    assert "injected" in str(fast.value)
    snap = pool.snapshot().keys[SPEC_A.fingerprint("null")]
    assert snap.failing is True and "injected" in snap.last_error
    # Another key is unaffected.
    other = await pool.acquire(SPEC_B)
    await pool.release(other)
    assert backend.attempts == 4
    # After the cooldown, a working backend brings the key back.
    backend.fail_for.clear()
    await asyncio.sleep(0.25)
    sb = await pool.acquire(SPEC_A)
    assert await sb.is_alive()
    snap = pool.snapshot().keys[SPEC_A.fingerprint("null")]
    assert snap.failing is False and snap.consecutive_failures == 0
    assert pool.stats.failures == 3 and pool.stats.fail_fast == 1


async def test_transient_failure_is_retried_with_backoff(
    make_pool: PoolFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pool waits out a backoff on its close event (so close() cuts it short): record the
    # waits it asks for rather than time them.
    backoffs: list[float | None] = []
    real_wait_for = asyncio.wait_for

    async def recording_wait_for(aw: Any, timeout: float | None) -> Any:  # noqa: ASYNC109
        if getattr(aw, "__qualname__", "") == "Event.wait":
            backoffs.append(timeout)
        return await real_wait_for(aw, timeout)

    monkeypatch.setattr(pool_core.asyncio, "wait_for", recording_wait_for)
    backend = TrackingBackend(fail_creates=2)
    pool = make_pool(
        backend, create_retries=2, create_backoff_s=0.01, create_backoff_max_s=0.03, failing_after=5
    )
    sb = await pool.acquire(SPEC_A)
    assert await sb.is_alive()
    assert backend.attempts == 3
    # Backoff is exponential and bounded: 0.01 then 0.02 before the two retries.
    assert backoffs == [0.01, 0.02]


async def test_starved_key_evicts_idle_ready_sandbox_of_other_key(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=3, min_ready=3)
    await pool.prewarm([SPEC_A], count=3)
    await pool.wait_idle(timeout_s=5)
    assert pool.snapshot().keys[SPEC_A.fingerprint("null")].ready == 3
    sb = await pool.acquire(SPEC_B, timeout_s=5)
    assert sb.spec.env == {"KEY": "b"}
    assert pool.stats.evicted == 1
    assert backend.peak_live <= 3


async def test_waiting_acquire_gets_freed_slot_before_refill(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=2, min_ready=2)
    await pool.start()
    a1 = await pool.acquire(SPEC_A)
    a2 = await pool.acquire(SPEC_A)  # A is in demand with min_ready=2, but the cap is full
    waiting_b = asyncio.create_task(pool.acquire(SPEC_B, timeout_s=5))
    await wait_until(
        lambda: waiting(pool, SPEC_B) == 1 or waiting_b.done(), 10.0, 0.005, "the B acquire to wait"
    )
    # the cap is full: B waits with no creation started for it
    assert not waiting_b.done() and creating(pool, SPEC_B) == 0
    await pool.release(a1)
    b = await waiting_b
    assert b.spec.env == {"KEY": "b"}
    snap = pool.snapshot()
    assert snap.keys[SPEC_A.fingerprint("null")].ready == 0
    assert snap.totals.total <= 2
    await pool.release(a2)
    await pool.release(b)


async def test_starved_key_served_before_busier_key_waiters(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=2)
    a1 = await pool.acquire(SPEC_A)
    a2 = await pool.acquire(SPEC_A)
    # Three A waiters queue first, then one B waiter.
    a_waiters = [asyncio.create_task(pool.acquire(SPEC_A, timeout_s=5)) for _ in range(3)]
    await wait_until(
        lambda: waiting(pool, SPEC_A) == 3, 10.0, 0.005, "the three A acquires to wait"
    )
    b_waiter = asyncio.create_task(pool.acquire(SPEC_B, timeout_s=5))
    await wait_until(lambda: waiting(pool, SPEC_B) == 1, 10.0, 0.005, "the B acquire to wait")
    await pool.release(a1)  # one slot frees: B holds nothing, A holds one -> B first
    b = await asyncio.wait_for(b_waiter, 5)
    assert b.spec.env == {"KEY": "b"}
    assert not any(t.done() for t in a_waiters)
    await pool.release(a2)
    await pool.release(b)
    for t in a_waiters:
        await pool.release(await t)


async def test_refill_is_round_robin_between_keys_when_capped(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=4, min_ready=3)
    await pool.prewarm([SPEC_A, SPEC_B], count=3)
    await pool.wait_idle(timeout_s=5)
    keys = pool.snapshot().keys
    assert keys[SPEC_A.fingerprint("null")].ready == 2
    assert keys[SPEC_B.fingerprint("null")].ready == 2


async def test_release_destroys_and_never_reuses(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1)
    await pool.start()
    await pool.prewarm([SPEC_A])
    seen: set[str] = set()
    for _ in range(20):
        sb = await pool.acquire(SPEC_A)
        assert sb.id not in seen, "a released sandbox was handed out again"
        seen.add(sb.id)
        await sb.write_file("/app/dirty", "x")
        await pool.release(sb)
        await pool.wait_idle(timeout_s=5)
        assert sb.closed and sb.id not in backend.live
    assert pool.stats.destroyed >= 20
    # Releases owe replacements, but hits pay them back: the ready count does not creep up.
    assert pool.snapshot().keys[SPEC_A.fingerprint("null")].ready == 1
    await pool.release(sb)  # a second release is harmless
    assert pool.stats.destroyed >= 20


async def test_release_schedules_replacement_for_key_in_demand(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=0)
    sb = await pool.acquire(SPEC_A)
    assert sb.from_pool is False
    await pool.release(sb)
    await pool.wait_idle(timeout_s=5)
    assert pool.snapshot().keys[SPEC_A.fingerprint("null")].ready == 1
    again = await pool.acquire(SPEC_A)
    assert again.from_pool is True and again.id != sb.id
    assert pool.stats.hits == 1 and pool.stats.misses == 1


async def test_no_replacement_once_demand_window_passed(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=2, demand_window_s=0.05)
    sb = await pool.acquire(SPEC_A)
    await asyncio.sleep(0.1)
    await pool.release(sb)
    await pool.wait_idle(timeout_s=5)
    # The two ready ones were filled while A was in demand; the release owes no replacement.
    key = pool.snapshot().keys[SPEC_A.fingerprint("null")]
    assert key.ready == 2 and key.in_demand is False and key.target == 0
    assert len(backend.live) == 2 and backend.created == 3


async def test_prewarm_fills_mapping_pairs_and_iterables(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=20)
    spec_c = SandboxSpec(env={"KEY": "c"})
    await pool.prewarm([(SPEC_A, 3), (SPEC_B, 2)])
    await pool.prewarm([spec_c], count=4)
    await pool.wait_idle(timeout_s=5)
    keys = pool.snapshot().keys
    assert keys[SPEC_A.fingerprint("null")].ready == 3
    assert keys[SPEC_B.fingerprint("null")].ready == 2
    assert keys[spec_c.fingerprint("null")].ready == 4
    assert len(backend.live) == 9
    sb = await pool.acquire(SPEC_B)
    assert sb.from_pool is True
    with pytest.raises(ValueError):
        await pool.prewarm([(SPEC_A, -1)])


async def test_close_destroys_ready_leased_and_in_flight(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=20, max_concurrent_creates=20)
    await pool.prewarm([SPEC_A], count=2)
    await pool.wait_idle(timeout_s=5)
    leased = await pool.acquire(SPEC_A)  # (its replacement is created too)
    backend.hold.clear()
    await pool.prewarm([SPEC_B], count=5)  # creations now in flight
    spec_w = SandboxSpec(env={"KEY": "w"})
    waiter = asyncio.create_task(pool.acquire(spec_w, timeout_s=5))
    await wait_until(
        lambda: (
            waiting(pool, spec_w) == 1
            and creating(pool, SPEC_B) == 5
            and inside_create(pool, backend)
        ),
        10.0,
        0.005,
        "the acquire to wait, and every creation to be inside backend.create()",
    )
    closing = asyncio.create_task(pool.close())
    await wait_until(lambda: pool.snapshot().closed, 10.0, 0.005, "close() to begin")
    backend.hold.set()  # the creations in flight finish during close()
    await closing
    assert not backend.live
    assert backend.created == backend.destroyed == 9  # the 7 in flight too
    assert leased.closed
    with pytest.raises(PoolClosedError):
        await waiter
    with pytest.raises(PoolClosedError):
        await pool.acquire(SPEC_A)
    await pool.close()  # idempotent


async def test_close_survives_cancellation(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=20, max_concurrent_creates=20)
    await pool.start()
    await pool.prewarm([SPEC_A], count=3)
    await pool.wait_idle(timeout_s=5)
    await pool.acquire(SPEC_A)  # (its replacement is created too)
    backend.hold.clear()
    await pool.prewarm([SPEC_B], count=4)
    await wait_until(
        lambda: inside_create(pool, backend) and creating(pool, SPEC_B) == 4,
        10.0,
        0.005,
        "the B creations to be inside backend.create()",
    )
    closing = asyncio.create_task(pool.close())
    await wait_until(lambda: pool.snapshot().closed, 10.0, 0.005, "close() to begin")
    assert not closing.done()  # it waits for the creations
    closing.cancel()
    backend.hold.set()  # they finish after the cancellation
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not backend.live
    assert backend.created == backend.destroyed == 8


async def test_queued_creations_never_reach_backend_after_close(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    backend.hold.clear()
    pool = make_pool(backend, max_total=50, max_concurrent_creates=1, close_timeout_s=5)
    await pool.prewarm([SPEC_A], count=30)
    await wait_until(
        lambda: backend.creating_now == 1, 10.0, 0.005, "the first creation in backend.create()"
    )
    closing = asyncio.create_task(pool.close())
    await wait_until(lambda: pool.snapshot().closed, 10.0, 0.005, "close() to begin")
    backend.hold.set()  # the creation inside backend.create() finishes during close()
    await closing
    # Only the creation already inside backend.create() ran; the queued ones never started.
    assert backend.attempts == 1
    assert not backend.live


async def test_acquire_timeout_raises_pool_timeout(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, max_total=1)
    held = await pool.acquire(SPEC_A)
    with pytest.raises(PoolTimeoutError) as exc:
        await pool.acquire(SPEC_B, timeout_s=0.05)
    assert isinstance(exc.value, TimeoutError)
    assert "max_total 1" in str(exc.value)
    assert pool.stats.timeouts == 1
    assert pool.snapshot().keys[SPEC_B.fingerprint("null")].waiting == 0
    await pool.release(held)


async def test_timed_out_acquire_does_not_leak_its_creation(make_pool: PoolFactory) -> None:
    backend = TrackingBackend(create_delay_s=0.1)
    pool = make_pool(backend, max_total=2, demand_window_s=0)
    with pytest.raises(PoolTimeoutError):
        await pool.acquire(SPEC_A, timeout_s=0.01)
    await pool.wait_idle(timeout_s=5)
    # The late sandbox is kept ready (fresh, never handed out), then reused as a hit.
    assert pool.snapshot().totals.ready == 1
    sb = await pool.acquire(SPEC_A, timeout_s=1)
    assert sb.from_pool is True


async def test_cancelled_acquire_leaves_no_waiter(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    backend.hold.clear()
    pool = make_pool(backend, max_total=2)
    task = asyncio.create_task(pool.acquire(SPEC_A))
    await wait_until(
        lambda: waiting(pool, SPEC_A) == 1 and backend.creating_now == 1,
        10.0,
        0.005,
        "the acquire to wait for its creation",
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    backend.hold.set()  # its creation finishes after the acquire gave up
    await pool.wait_idle(timeout_s=5)
    snap = pool.snapshot()
    assert snap.keys[SPEC_A.fingerprint("null")].waiting == 0
    assert snap.totals.leased == 0
    assert snap.totals.total == len(backend.live)


async def test_acquire_cancelled_during_health_check_keeps_the_sandbox(
    make_pool: PoolFactory,
) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1)
    await pool.prewarm([SPEC_A])
    await pool.wait_idle(timeout_s=5)
    (ready_id,) = backend.live
    checking = asyncio.Event()

    async def slow_is_alive() -> bool:
        checking.set()
        await asyncio.sleep(30)
        return True

    backend.sandboxes[ready_id].is_alive = slow_is_alive  # type: ignore[method-assign]
    task = asyncio.create_task(pool.acquire(SPEC_A))
    await asyncio.wait_for(checking.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    snap = pool.snapshot()
    assert snap.totals.leased == 0
    assert snap.keys[SPEC_A.fingerprint("null")].ready == 1
    assert backend.live == {ready_id}


async def test_snapshot_is_json_and_has_latency_figures(make_pool: PoolFactory) -> None:
    backend = TrackingBackend()
    pool = make_pool(backend, min_ready=1)
    await pool.prewarm([SPEC_A])
    await pool.wait_idle(timeout_s=5)
    for _ in range(5):
        await pool.release(await pool.acquire(SPEC_A))
        await pool.wait_idle(timeout_s=5)
    snap = json.loads(pool.snapshot().model_dump_json())  # the JSON `GET /v1/pool` serves
    assert snap["hits"] == 5 and snap["misses"] == 0
    lat = snap["acquire_latency_s"]
    assert lat["count"] == 5
    assert lat["p50_s"] is not None and lat["p50_s"] <= lat["p99_s"]
    assert lat["buckets"][-1] == {"le": "+Inf", "count": 5}
    counts = [b["count"] for b in lat["buckets"]]
    assert counts == sorted(counts), "buckets must be cumulative"
    assert set(snap["totals"]) >= {"ready", "creating", "leased", "destroying", "total"}
    key = snap["keys"][SPEC_A.fingerprint("null")]
    assert set(key) >= {"ready", "creating", "leased", "failing", "last_error"}
    assert pool.stats.counters()["hits"] == 5

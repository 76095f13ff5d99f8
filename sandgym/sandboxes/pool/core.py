"""The pool itself (`SandboxPool`): hands out ready sandboxes per environment fingerprint.

Creating a sandbox costs hundreds of milliseconds on Docker; the pool hides that by keeping
ready sandboxes per key (`spec.fingerprint(backend.name)`) and creating replacements in the
background. Rules it keeps:

- A sandbox is used for one episode only: `release()` destroys it (off the hot path) and never
  puts it back. Freshness is the point; a reset that cleans a used sandbox is never trusted.
- `max_total` bounds every sandbox the pool is responsible for (ready + creating + leased +
  being destroyed): a slot is reserved before `backend.create()` starts and freed only after
  the sandbox's `close()` returned, so the backend never holds more than `max_total` of ours.
- Creation is gated by a semaphore (`max_concurrent_creates`) and a token bucket
  (`create_rate_per_s`), retried with bounded exponential backoff, and a key whose creations
  keep failing is marked failing for a cooldown: acquires fail fast with the last error.
- When capped, capacity is shared fairly: a waiting acquire gets the next freed slot before any
  background refill, waiting keys are served by fewest-slots-held first, an idle ready sandbox
  of another key is evicted for a starved one, and refill goes round-robin by deficit.
- Below the host's memory floor (`min_available_memory_mb`, MemAvailable) a miss is refused
  with `HostMemoryError` and no refill starts: the host is never driven into swap.
- `close()` destroys everything, including sandboxes still being created, even when the task
  calling it is cancelled.
- Every `sweep_interval_s` the live pool lists the sandboxes labelled with its owner id on the
  backend and removes those it does not hold: what a creation left when its answer was lost
  (the engine died or the call was cancelled mid-create) and what an abandoned destroy left.
  A sandbox the pool tracks (any created and not yet destroyed) or one an in-flight creation
  may still return is never touched (`sandgym.sandboxes.labels.sweep_untracked` decides).

Example:
    >>> import asyncio
    >>> from sandboxes import SandboxSpec, get_backend
    >>> from sandgym.sandboxes.pool import PoolSettings, SandboxPool
    >>> async def demo():
    ...     pool = SandboxPool(get_backend("null"), PoolSettings(min_ready=1))
    ...     await pool.start()
    ...     spec = SandboxSpec()
    ...     await pool.prewarm([spec])
    ...     await pool.wait_idle()
    ...     sb = await pool.acquire(spec)
    ...     hit = sb.from_pool
    ...     await pool.release(sb)
    ...     await pool.close()
    ...     return hit
    >>> asyncio.run(demo())
    True

Why over 500 lines: the rules above (cap, fair sharing, refill, backoff, shielded close) act on
one shared state on one event loop: `SandboxPool` is one state machine. What could move out
did: settings, stats and the snapshot, the sweeps, the per-key state (the package's other
modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sandgym.sandboxes.base import Sandbox, SandboxBackend
from sandgym.sandboxes.createlimit import register, unregister
from sandgym.sandboxes.errors import SandboxCreateError
from sandgym.sandboxes.lifetime import LifetimeKeeper, set_first_lifetime
from sandgym.sandboxes.pool.errors import (
    HostMemoryError,
    PoolClosedError,
    PoolKeyFailingError,
    PoolTimeoutError,
    describe,
)
from sandgym.sandboxes.pool.keys import KeyState, Ready, TokenBucket
from sandgym.sandboxes.pool.memory import check_memory_floor
from sandgym.sandboxes.pool.settings import PoolSettings
from sandgym.sandboxes.pool.stats import (
    LatencyHistogram,
    PoolKeySnapshot,
    PoolSnapshot,
    PoolStats,
    PoolTotals,
)
from sandgym.sandboxes.pool.sweep import CREATE_TOKENS, UntrackedSweep, recycle_idle
from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger("sandgym.sandboxes.pool")


# ---------------------------------------------------------------------------------------------
# the pool
# ---------------------------------------------------------------------------------------------
class SandboxPool:
    """Warm pool of fresh sandboxes for one backend. See the module docstring for the rules."""

    def __init__(self, backend: SandboxBackend, settings: PoolSettings | None = None) -> None:
        self.backend = backend
        self.settings = settings or PoolSettings()
        self.stats = PoolStats(
            acquire_latency=LatencyHistogram(self.settings.latency_window),
            hit_latency=LatencyHistogram(self.settings.latency_window),
            miss_latency=LatencyHistogram(self.settings.latency_window),
        )
        self._keys: dict[str, KeyState] = {}
        self._leased: dict[str, KeyState] = {}  # sandbox id -> its key
        self._leased_sb: dict[str, Sandbox] = {}
        self._destroying = 0
        self._create_sem = asyncio.Semaphore(self.settings.max_concurrent_creates)
        self._bucket = (
            TokenBucket(self.settings.create_rate_per_s, self.settings.create_burst)
            if self.settings.create_rate_per_s is not None
            else None
        )
        self._create_tasks: set[asyncio.Task[None]] = set()
        self._destroy_tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._in_backend_create: set[asyncio.Task[Any]] = set()
        self._close_event = asyncio.Event()
        self._seq = 0
        self._idle_event = asyncio.Event()
        self._idle_event.set()
        self._sweeper = UntrackedSweep(backend, self.stats, self.settings.sweep_grace_s)
        self._ledger = self._sweeper.ledger
        self._sweep_task: asyncio.Task[None] | None = None
        self._keeper = LifetimeKeeper(self.settings.lifetime)
        limits = self.settings.host_limits
        # The process's limiter of this backend while the pool lives: the sandboxes made
        # outside the pool (verifiers, pristine copies) wait on the same one (createlimit).
        self._host_limiter = (
            register(backend.name, limits) if limits is not None and limits.active else None
        )

    # -- public API ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Reap the backend's expired leftovers, then start the background refill loop."""
        if self._closing:
            raise PoolClosedError("pool is closed; create a new SandboxPool")
        if self._loop_task is not None:
            return
        try:
            reaped = await self.backend.reap()
            self.stats.reaped += len(reaped)
            if reaped:
                log.info("pool: reaped %d leftover sandboxes of %s", len(reaped), self.backend.name)
        except Exception as exc:
            # A reap failure must not keep the server down; the next start or `sandgym reap` retries.
            log.warning("pool: reaping leftovers of backend %s failed: %s", self.backend.name, exc)
        self._loop_task = asyncio.create_task(self._maintenance_loop(), name="sandgym-pool-refill")
        if self.settings.sweep_interval_s is not None:
            self._sweep_task = asyncio.create_task(
                self._sweeper.run(
                    self.settings.sweep_interval_s, lambda: self._closing, self._close_event
                ),
                name="sandgym-pool-sweep",
            )

    async def acquire(self, spec: SandboxSpec, timeout_s: float | None = None) -> Sandbox:
        """A fresh sandbox matching `spec`: a ready one when there is one, else a new one.

        Raises PoolTimeoutError after `timeout_s` (default `acquire_timeout_s`),
        PoolKeyFailingError while the key is failing, PoolClosedError after close().
        """
        started = time.perf_counter()
        timeout_s = self.settings.acquire_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self._check_open()
        k = await self._key_for(spec)
        now = time.monotonic()
        k.last_demand = now
        self._raise_if_failing(k, now)

        # Hit path: a ready sandbox, checked alive first; dead ones are replaced silently.
        while k.ready:
            item = k.ready.popleft()
            sb = item.sandbox
            if now - item.since > self.settings.max_idle_s:
                self.stats.idle_recycled += 1
                self._destroy_bg(sb)
                continue
            self._lease(k, sb)
            try:
                healthy = not self.settings.health_check or await self._healthy(sb)
            except asyncio.CancelledError:
                # The caller gave up mid-check: the sandbox is still fresh, keep it.
                self._unlease(sb)
                self._put_ready(k, sb)
                raise
            if not healthy:
                self._unlease(sb)
                self.stats.health_replaced += 1
                log.info("pool: ready sandbox %s was dead; replacing it", sb.id)
                self._destroy_bg(sb)
                self._dispatch()
                continue
            if self._closing:  # close() began during the health check
                self._unlease(sb)
                self._destroy_bg(sb)
                raise PoolClosedError("pool closed while acquiring")
            sb.from_pool = True
            k.replace_credit = max(0, k.replace_credit - 1)  # a replacement was used
            self.stats.hits += 1
            self._observe(started, hit=True)
            self._dispatch()  # refill behind the hit, off the caller's path
            return sb

        # Miss path: wait for a creation (ours, or one already in flight for this key). The
        # key may have turned failing during a health check above: no waiter for it then.
        self._raise_if_failing(k, time.monotonic())
        # A new sandbox needs memory: refused by name below the host's floor, before it swaps.
        check_memory_floor(self.settings.min_available_memory_mb, self.total())
        fut: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        k.waiters.append(fut)
        self._dispatch()
        try:
            remaining = max(0.0, deadline - time.monotonic())
            await asyncio.wait({fut}, timeout=remaining)
        except asyncio.CancelledError:
            self._abandon_waiter(k, fut)
            raise
        if not fut.done():
            self._abandon_waiter(k, fut)
            self.stats.timeouts += 1
            raise PoolTimeoutError(
                f"no sandbox for key {k.key} within {timeout_s:.3g}s "
                f"(pool holds {self.total()} of max_total {self.settings.max_total}; "
                f"{k.creating} creating for this key)"
            )
        if fut in k.waiters:  # normally popped by whoever handed it over
            k.waiters.remove(fut)  # (a failed deque.remove would format the future's repr)
        sb = fut.result()  # raises the creation error handed to this waiter
        if self._closing or sb.closed:
            # close() ran between the hand-off and now; it destroys leased sandboxes too.
            self._unlease(sb)
            if not sb.closed:
                self._destroy_bg(sb)
            raise PoolClosedError("pool closed while acquiring")
        sb.from_pool = False
        self.stats.misses += 1
        self._observe(started, hit=False)
        return sb

    async def release(self, sandbox: Sandbox, *, replace: bool = True) -> None:
        """Give a sandbox back: it is destroyed in the background and never reused.

        `replace` (an episode's end: another is likely to start) raises the key's ready target
        by one while the key is in demand. The sandbox API passes False: closing a thousand
        sandboxes made by hand must not leave a thousand fresh ones behind; its warm target
        stays what the operator configured (`min_ready`, prewarm)."""
        k = self._leased.get(sandbox.id)
        if k is None:
            if not sandbox.closed:
                # Not ours (or already released): still never reuse it, but count nothing.
                log.warning("pool: release of sandbox %s the pool does not lease", sandbox.id)
                task = asyncio.create_task(self._close_quietly(sandbox))
                self._destroy_tasks.add(task)
                task.add_done_callback(self._destroy_tasks.discard)
            return
        self._unlease(sandbox)
        now = time.monotonic()
        if replace and not self._closing and k.in_demand(now, self.settings.demand_window_s):
            k.replace_credit = min(k.replace_credit + 1, self.settings.max_total)
        self._destroy_bg(sandbox)
        self._dispatch()

    async def prewarm(
        self,
        specs: Mapping[SandboxSpec, int] | Iterable[SandboxSpec | tuple[SandboxSpec, int]],
        count: int = 1,
    ) -> None:
        """Mark keys in demand and fill them to `count` ready sandboxes (or the mapped count).

        `SandboxSpec` is not hashable (it holds dicts), so `(spec, count)` pairs are accepted
        alongside a mapping or plain specs. Returns once creations are scheduled; use
        `wait_idle()` to wait for them.
        """
        self._check_open()
        pairs: list[tuple[SandboxSpec, int]] = []
        if isinstance(specs, Mapping):
            pairs = [(s, int(n)) for s, n in specs.items()]
        else:
            for item in specs:
                if isinstance(item, tuple):
                    pairs.append((item[0], int(item[1])))
                else:
                    pairs.append((item, count))
        now = time.monotonic()
        for spec, n in pairs:
            if n < 0:
                raise ValueError(f"prewarm count must be >= 0, got {n}")
            k = await self._key_for(spec)
            k.last_demand = now
            k.prewarm_target = n
        self._dispatch()

    async def forget(self, spec: SandboxSpec, timeout_s: float = 60.0) -> None:
        """Stop keeping sandboxes of `spec` (what they start from is about to be removed: a
        group's snapshot): its ready ones are destroyed, no more are made, and one still being
        created is destroyed when done unless an acquire waits for it. Returns once none is
        being created (at most `timeout_s`)."""
        k = self._keys.get(spec.fingerprint(self.backend.name))
        if k is None:
            return
        k.forgotten = True
        k.prewarm_target = k.replace_credit = 0
        while k.ready:
            self._destroy_bg(k.ready.popleft().sandbox)
        deadline = time.monotonic() + timeout_s
        # a bounded poll of one counter; an Event per key would cost every creation
        while k.creating and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        self._dispatch()

    def snapshot(self) -> PoolSnapshot:
        """A typed picture of the pool (`GET /v1/pool` serves its JSON; `/metrics` its fields)."""
        now = time.monotonic()
        keys = {
            k.key: PoolKeySnapshot(
                ready=len(k.ready),
                creating=k.creating,
                leased=k.leased,
                waiting=sum(1 for w in k.waiters if not w.done()),
                target=self._target(k, now),
                in_demand=k.in_demand(now, self.settings.demand_window_s),
                failing=k.failing(now),
                consecutive_failures=k.consecutive_failures,
                last_error=describe(k.last_error),
                image=k.spec.image,
            )
            for k in self._keys.values()
        }
        s = self.stats
        return PoolSnapshot(
            backend=self.backend.name,
            owner_id=self.backend.owner_id,
            closed=self._closing,
            totals=PoolTotals(
                ready=sum(len(k.ready) for k in self._keys.values()),
                creating=sum(k.creating for k in self._keys.values()),
                leased=sum(k.leased for k in self._keys.values()),
                destroying=self._destroying,
                total=self.total(),
                max_total=self.settings.max_total,
                peak_total=s.peak_total,
            ),
            keys=keys,
            lifetime=self._keeper.stats(),
            create_limits=None if self._host_limiter is None else self._host_limiter.stats(),
            **s.counters(),
            acquire_latency_s=s.acquire_latency_snapshot(),
        )

    def ready_ids(self) -> set[str]:
        """Ids of the ready sandboxes the pool holds for the next acquire (made, not leased to
        anyone): what a check that counts an engine's containers leaves out as the pool's own."""
        return {item.sandbox.id for k in list(self._keys.values()) for item in list(k.ready)}

    def total(self) -> int:
        """Sandboxes the pool holds now: ready + creating + leased + being destroyed."""
        return sum(k.held() for k in self._keys.values()) + self._destroying

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        """Wait until no creation or destruction is in flight and every target is met (or
        cannot be met now: capped, failing). Meant for tests, benchmarks and prewarm callers."""

        async def _wait() -> None:
            while True:
                await self._idle_event.wait()
                await asyncio.sleep(0)  # let done-callbacks that clear the event run
                if self._idle_event.is_set():
                    return

        await asyncio.wait_for(_wait(), timeout_s)

    async def close(self) -> None:
        """Destroy every sandbox the pool holds (ready, leased, being created). Idempotent.

        Runs to completion even if the calling task is cancelled; the cancellation is re-raised
        once everything is destroyed.
        """
        self._closing = True
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._close_impl())
        cancelled = False
        while not self._close_task.done():
            try:
                await asyncio.shield(self._close_task)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        self._close_task.result()

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- keys, leases, failing -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closing:
            raise PoolClosedError("pool is closed; it hands out no more sandboxes")

    async def _key_for(self, spec: SandboxSpec) -> KeyState:
        if spec.needs_hashing(self.backend.name):
            # Hashing a build context reads every file in it: keep that off the event loop.
            key = await asyncio.to_thread(spec.fingerprint, self.backend.name)
        else:
            key = spec.fingerprint(self.backend.name)
        k = self._keys.get(key)
        if k is None:
            k = self._keys[key] = KeyState(key=key, spec=spec)
        return k

    def _raise_if_failing(self, k: KeyState, now: float) -> None:
        if not k.failing(now):
            return
        self.stats.fail_fast += 1
        raise self._failing_error(k, now)

    def _failing_error(self, k: KeyState, now: float) -> PoolKeyFailingError:
        err = PoolKeyFailingError(
            f"sandbox key {k.key} (image {k.spec.image!r}) is failing after "
            f"{k.consecutive_failures} consecutive failed creations; retrying in "
            f"{max(0.0, k.failing_until - now):.1f}s; last error: {describe(k.last_error)}",
            key=k.key,
            last_error=k.last_error,
        )
        err.__cause__ = k.last_error
        return err

    def _lease(self, k: KeyState, sb: Sandbox) -> None:
        k.leased += 1
        self._leased[sb.id] = k
        self._leased_sb[sb.id] = sb

    def _unlease(self, sb: Sandbox) -> KeyState | None:
        k = self._leased.pop(sb.id, None)
        self._leased_sb.pop(sb.id, None)
        if k is not None:
            k.leased -= 1
        return k

    def _abandon_waiter(self, k: KeyState, fut: asyncio.Future[Sandbox]) -> None:
        """The acquire gave up (timeout/cancel): drop its waiter; a sandbox already handed to
        it is unused and fresh, so it goes back to the ready queue."""
        if fut in k.waiters:
            k.waiters.remove(fut)
        if fut.done():
            if not fut.cancelled() and fut.exception() is None:
                sb = fut.result()
                self._unlease(sb)
                self._put_ready(k, sb)
        else:
            fut.cancel()
        self._dispatch()

    async def _healthy(self, sb: Sandbox) -> bool:
        try:
            # asyncio.timeout, not wait_for: no extra task, so a check that never suspends
            # (local, null) does not hand the loop to whatever else is runnable.
            async with asyncio.timeout(self.settings.health_check_timeout_s):
                return await sb.is_alive() and sb.shell_alive() is not False
        except Exception as exc:  # a check that errors or hangs means "not usable"
            log.info("pool: health check of %s failed: %s", sb.id, exc)
            return False

    def _observe(self, started: float, hit: bool) -> None:
        elapsed = time.perf_counter() - started
        self.stats.acquire_latency.observe(elapsed)
        (self.stats.hit_latency if hit else self.stats.miss_latency).observe(elapsed)

    def _target(self, k: KeyState, now: float) -> int:
        """Ready sandboxes the refill aims to keep for this key."""
        if k.forgotten or not k.in_demand(now, self.settings.demand_window_s):
            return 0
        # The credit is "episodes that just ended and will likely start again": it raises the
        # target only beyond what min_ready/prewarm already keep (max, not sum).
        return max(self.settings.min_ready, k.prewarm_target, k.replace_credit)

    def _put_ready(self, k: KeyState, sb: Sandbox) -> None:
        """A fresh sandbox for key k: straight to its oldest waiter, else the ready queue."""
        if self._closing:
            self._destroy_bg(sb)
            return
        while k.waiters:
            fut = k.waiters.popleft()
            if fut.done():
                continue
            self._lease(k, sb)
            fut.set_result(sb)
            return
        if k.forgotten:
            self._destroy_bg(sb)
            return
        k.ready.append(Ready(sb, time.monotonic()))

    # -- dispatch: who gets the next slot --------------------------------------------------------
    def _dispatch(self) -> None:
        """Start the creations that capacity allows: waiting acquires first, fairly across keys
        (fewest slots held first), evicting idle ready sandboxes of other keys for a starved
        waiter; then background refill round-robin by deficit. Synchronous: only reserves slots
        and spawns tasks."""
        if self._closing:
            self._update_idle()
            return
        cap = self.settings.max_total
        now = time.monotonic()

        # 1) waiting acquires.
        while True:
            starving = [k for k in self._keys.values() if k.unserved() > 0 and not k.failing(now)]
            if not starving:
                break
            k = min(starving, key=lambda x: (x.held(), x.last_served))
            if self.total() < cap:
                self._start_create(k)
                continue
            # Capped: slots being destroyed come back soon; evict only beyond those.
            blocked = sum(x.unserved() for x in starving)
            if self._destroying < blocked:
                victims = [x for x in self._keys.values() if x.ready and x.unserved() == 0]
                if victims:
                    victim = max(victims, key=lambda x: (len(x.ready), -x.last_served))
                    item = victim.ready.popleft()
                    self.stats.evicted += 1
                    self._destroy_bg(item.sandbox)
                    continue
            break

        # 2) refill towards targets, one sandbox per key per round (round-robin by deficit);
        # none while the host is below its memory floor (acquires are refused then, too).
        if (
            not any(k.unserved() > 0 and not k.failing(now) for k in self._keys.values())
            and self._memory_allows_refill()
        ):
            while self.total() < cap:
                best: KeyState | None = None
                best_rank: tuple[int, int] = (0, 0)
                for k in self._keys.values():
                    if k.failing(now):
                        continue
                    spare = max(0, k.creating - len(k.waiters))
                    deficit = self._target(k, now) - len(k.ready) - spare
                    if deficit <= 0:
                        continue
                    rank = (deficit, -k.last_served)
                    if best is None or rank > best_rank:
                        best, best_rank = k, rank
                if best is None:
                    break
                self._start_create(best)
        self._update_idle()

    def _memory_allows_refill(self) -> bool:
        try:
            check_memory_floor(self.settings.min_available_memory_mb, self.total())
        except HostMemoryError:
            return False
        return True

    def _start_create(self, k: KeyState) -> None:
        self._seq += 1
        k.last_served = self._seq
        k.creating += 1
        self._note_peak()
        task = asyncio.create_task(self._create(k), name=f"sandgym-pool-create-{k.key}")
        self._create_tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        # The idle state can only be decided once the finished task left the sets.
        self._create_tasks.discard(task)
        self._destroy_tasks.discard(task)
        self._update_idle()

    def _note_peak(self) -> None:
        self.stats.peak_total = max(self.stats.peak_total, self.total())

    def _update_idle(self) -> None:
        busy = bool(self._create_tasks) or self._destroying > 0
        if not busy and not self._closing:
            now = time.monotonic()
            # Targets that can be met now but are not are "work pending" too.
            for k in self._keys.values():
                if k.failing(now):
                    continue
                if len(k.ready) < self._target(k, now) and self.total() < self.settings.max_total:
                    busy = True
                    break
        if busy:
            self._idle_event.clear()
        else:
            self._idle_event.set()

    # -- creation and destruction ----------------------------------------------------------------
    async def _create(self, k: KeyState) -> None:
        """One slot's creation, with retries; the slot is held until success or final failure."""
        s = self.settings
        attempt = 0
        sb: Sandbox | None = None
        error: BaseException | None = None
        try:
            while not self._closing:
                try:
                    async with self._create_sem:
                        if self._bucket is not None:
                            await self._bucket.take()
                        if self._closing:
                            break
                        # close() waits for tasks inside backend.create() (so it can destroy
                        # what they make) and cancels the ones still queued or backing off.
                        me = asyncio.current_task()
                        if me is not None:
                            self._in_backend_create.add(me)
                        # The sweep never removes what a creation in flight may return.
                        token = next(CREATE_TOKENS)
                        self._ledger.in_flight.add(token)
                        try:
                            async with self._host_start():
                                life = self.settings.lifetime
                                if life.enabled and self._loop_task is not None:
                                    # Only a started pool moves deadlines on (its loop does).
                                    set_first_lifetime(life.grace_s)
                                sb = await self.backend.create(k.spec)
                            self._ledger.track(sb.id)
                            try:
                                # Ready means ready: the shell is started (and counted in the
                                # creation) before the sandbox is handed out.
                                await sb.warm_up()
                            except BaseException:
                                failed, sb = sb, None
                                try:
                                    await asyncio.shield(self._close_quietly(failed))
                                finally:
                                    self._ledger.tracked.discard(failed.id)
                                raise
                        finally:
                            self._in_backend_create.discard(me)  # type: ignore[arg-type]
                            self._ledger.in_flight.discard(token)
                    error = None
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any backend failure counts; it is reported, not lost
                    error = exc
                    self.stats.failures += 1
                    k.consecutive_failures += 1
                    k.last_error = exc
                    log.warning(
                        "pool: creating a sandbox for key %s failed (attempt %d): %s",
                        k.key,
                        attempt + 1,
                        describe(exc),
                    )
                    if k.consecutive_failures >= s.failing_after:
                        k.failing_until = time.monotonic() + s.failing_cooldown_s
                        break
                    if attempt >= s.create_retries:
                        break
                    backoff_s = min(s.create_backoff_s * 2**attempt, s.create_backoff_max_s)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._close_event.wait(), backoff_s)
                    attempt += 1
        finally:
            # Runs on success, failure and cancellation (close): the slot must be released
            # exactly once, and a sandbox created for a closing pool is destroyed here.
            k.creating -= 1
            if sb is not None:
                self.stats.created += 1
                k.consecutive_failures = 0
                k.failing_until = -math.inf
                if self._closing:
                    self._destroy_bg(sb)
                else:
                    self._put_ready(k, sb)
                    self._note_peak()
            elif error is not None:
                self._fail_waiters(k, error)
            self._dispatch()

    def _fail_waiters(self, k: KeyState, error: BaseException) -> None:
        now = time.monotonic()
        if k.failing(now):
            # The key is failing: every waiter of it fails fast with the last error.
            while k.waiters:
                fut = k.waiters.popleft()
                if not fut.done():
                    fut.set_exception(self._failing_error(k, now))
            return
        # Otherwise this creation served (at most) one waiter: the oldest unserved one.
        if k.unserved() > 0:
            for fut in list(k.waiters):
                if not fut.done():
                    k.waiters.remove(fut)
                    err = SandboxCreateError(
                        f"could not create a sandbox for key {k.key} (image {k.spec.image!r}) "
                        f"after {self.settings.create_retries + 1} attempts: {describe(error)}"
                    )
                    err.__cause__ = error
                    fut.set_exception(err)
                    break

    def _destroy_bg(self, sb: Sandbox) -> None:
        """Destroy `sb` in the background; its slot stays counted until close() returned."""
        self._destroying += 1
        self._idle_event.clear()
        task = asyncio.create_task(self._destroy(sb), name=f"sandgym-pool-destroy-{sb.id}")
        self._destroy_tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _destroy(self, sb: Sandbox) -> None:
        try:
            await asyncio.wait_for(
                asyncio.shield(sb.close()), timeout=self.settings.destroy_timeout_s
            )
            self.stats.destroyed += 1
        except asyncio.CancelledError:
            self.stats.destroy_failures += 1
            raise
        except Exception as exc:  # a failed destroy is logged; the reaper removes leftovers
            self.stats.destroy_failures += 1
            log.warning("pool: destroying sandbox %s failed: %s", sb.id, describe(exc))
        finally:
            # Destroyed, or abandoned (failed, too slow): either way no longer ours to keep;
            # what an abandoned destroy leaves is the sweep's to remove.
            self._ledger.tracked.discard(sb.id)
            self._destroying -= 1
            self._dispatch()

    async def _close_quietly(self, sb: Sandbox) -> None:
        try:
            await sb.close()
        except Exception as exc:
            log.warning("pool: closing foreign sandbox %s failed: %s", sb.id, describe(exc))

    # -- background loop -------------------------------------------------------------------------
    async def _maintenance_loop(self) -> None:
        while not self._closing:
            try:
                recycle_idle(self._keys, self.settings, self.stats, self._destroy_bg)
                self._dispatch()
                self._keeper.refresh(self._held())
            except Exception:  # the loop must survive a bug in one round; it is logged
                log.exception("pool: maintenance round failed")
            await asyncio.sleep(self.settings.maintenance_interval_s)

    async def sweep_untracked(self) -> list[str]:
        """One round of the sweep of untracked sandboxes (the background loop runs one every
        `sweep_interval_s`): list the backend's sandboxes under our owner id and remove those
        `sandgym.sandboxes.labels.sweep_untracked` selects. A leftover is removed on the first round at
        least `sweep_grace_s` after the round that first saw it. Returns the removed ids
        (empty when another pool of the same owner is sweeping, or the backend cannot list).
        A failed listing raises; a failed removal is logged, counted and retried next round."""
        self._check_open()
        return await self._sweeper.round() or []

    def _host_start(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The host-wide limits around one `backend.create` (nothing without them)."""
        if self._host_limiter is None:
            return contextlib.nullcontext()
        return self._host_limiter.starting()

    def _held(self) -> list[Sandbox]:
        """Every sandbox the pool holds and hands out: ready and leased."""
        held = [item.sandbox for k in self._keys.values() for item in k.ready]
        return held + list(self._leased_sb.values())

    # -- close -----------------------------------------------------------------------------------
    async def _close_impl(self) -> None:
        for task in (self._loop_task, self._sweep_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._keeper.aclose()
        closed_err = PoolClosedError("pool closed while waiting for a sandbox")
        for k in self._keys.values():
            while k.waiters:
                fut = k.waiters.popleft()
                if not fut.done():
                    fut.set_exception(closed_err)
            while k.ready:
                self._destroy_bg(k.ready.popleft().sandbox)
        for sb in list(self._leased_sb.values()):
            self._unlease(sb)
            self._destroy_bg(sb)
        # Creations not yet inside backend.create() are cancelled; those inside it finish
        # (their sandbox is destroyed by _create) or are cancelled after close_timeout_s, and
        # whatever a cancelled backend call half-made is left to the label-based reaper.
        self._close_event.set()
        for task in set(self._create_tasks) - self._in_backend_create:
            task.cancel()
        if self._create_tasks:
            _, pending = await asyncio.wait(
                set(self._create_tasks), timeout=self.settings.close_timeout_s
            )
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        while self._destroy_tasks:
            await asyncio.wait(set(self._destroy_tasks))
        self._idle_event.set()
        if self._host_limiter is not None:
            unregister(self._host_limiter)
        # Retrieve results so no "exception was never retrieved" noise is left behind.
        for k in self._keys.values():
            k.ready.clear()

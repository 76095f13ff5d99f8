"""The pool's sweeps: the round that removes sandboxes labelled with the pool's owner id that no
pool of that owner holds (`UntrackedSweep`, over the `OwnerLedger` the pools of one owner share),
and the idle recycling of ready sandboxes kept past `max_idle_s` (`recycle_idle`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable

from sandgym.sandboxes.base import Sandbox, SandboxBackend
from sandgym.sandboxes.labels import Sighting, sweep_untracked
from sandgym.sandboxes.pool.errors import PoolClosedError, describe
from sandgym.sandboxes.pool.keys import KeyState, Ready
from sandgym.sandboxes.pool.settings import PoolSettings
from sandgym.sandboxes.pool.stats import PoolStats

log = logging.getLogger("sandgym.sandboxes.pool")


class OwnerLedger:
    """What the pools on one backend owner id know of its sandboxes, for the sweep: shared by
    every pool of that (backend kind, owner id), so pools sharing it never sweep each other's."""

    def __init__(self) -> None:
        self.tracked: set[str] = set()  # created and not yet destroyed, by any of these pools
        self.in_flight: set[int] = set()  # tokens of backend.create() calls running now
        self.seen: dict[str, Sighting] = {}  # untracked ids a sweep saw, for the next round
        self.sweeping = False  # one round at a time

    def track(self, sandbox_id: str) -> None:
        self.tracked.add(sandbox_id)
        self.seen.pop(sandbox_id, None)


#: (backend name, owner id) -> its ledger, while some pool holds it
_LEDGERS: weakref.WeakValueDictionary[tuple[str, str], OwnerLedger] = weakref.WeakValueDictionary()
CREATE_TOKENS = itertools.count(1)


def ledger_for(backend: SandboxBackend) -> OwnerLedger:
    key = (backend.name, backend.owner_id)
    ledger = _LEDGERS.get(key)
    if ledger is None:
        ledger = _LEDGERS[key] = OwnerLedger()
    return ledger


class UntrackedSweep:
    """Rounds of the sweep of untracked sandboxes for one pool (see `SandboxPool.sweep_untracked`)."""

    def __init__(self, backend: SandboxBackend, stats: PoolStats, grace_s: float) -> None:
        self.backend = backend
        self.stats = stats
        self.grace_s = grace_s
        self.ledger = ledger_for(backend)

    async def round(self) -> list[str] | None:
        """One round: the removed ids; None when the backend cannot list its sandboxes."""
        led = self.ledger
        if led.sweeping:
            return []
        led.sweeping = True
        try:
            during = set(led.in_flight)
            listed = await self.backend.owned_sandbox_ids()
            if listed is None:
                return None
            during |= led.in_flight
            before = led.seen
            remove, led.seen = sweep_untracked(
                listed,
                led.tracked,
                before,
                in_flight_during=during,
                in_flight_now=led.in_flight,
                now=time.monotonic(),
                grace_s=self.grace_s,
            )
            removed: list[str] = []
            for sid in remove:
                try:
                    await self.backend.remove_sandbox(sid)
                except Exception as exc:
                    self.stats.sweep_errors += 1
                    led.seen[sid] = before[sid]  # still a leftover: retried next round
                    log.warning("pool: sweep could not remove sandbox %s: %s", sid, describe(exc))
                else:
                    removed.append(sid)
            if removed:
                self.stats.swept += len(removed)
                log.info(
                    "pool: swept %d sandboxes of owner %s on %s that the pool did not hold "
                    "(creations whose answer was lost, abandoned destroys): %s",
                    len(removed),
                    self.backend.owner_id,
                    self.backend.name,
                    removed[:10],
                )
            return removed
        finally:
            led.sweeping = False

    async def run(
        self, interval_s: float, closing: Callable[[], bool], close_event: asyncio.Event
    ) -> None:
        """A round every `interval_s` until the pool closes (`closing()`, `close_event`), or for
        good once the backend says it cannot list its sandboxes."""
        while not closing():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(close_event.wait(), interval_s)
            if closing():
                return
            try:
                removed = await self.round()
            except asyncio.CancelledError:
                raise
            except PoolClosedError:
                return
            except Exception as exc:  # an engine away, an API error: next round retries
                self.stats.sweep_errors += 1
                log.warning(
                    "pool: sweep of untracked sandboxes on %s failed (retrying in %.0f s): %s",
                    self.backend.name,
                    interval_s,
                    describe(exc),
                )
                continue
            if removed is None:
                log.debug("pool: backend %s cannot list its sandboxes: no sweep", self.backend.name)
                return


def recycle_idle(
    keys: dict[str, KeyState],
    settings: PoolSettings,
    stats: PoolStats,
    destroy: Callable[[Sandbox], None],
) -> None:
    """Destroy (by `destroy`) the ready sandboxes idle longer than `max_idle_s`, then forget the
    keys nobody wants and that hold nothing, so snapshots stay small."""
    now = time.monotonic()
    for k in keys.values():
        keep: deque[Ready] = deque()
        for item in k.ready:
            if now - item.since > settings.max_idle_s:
                stats.idle_recycled += 1
                # An idle replacement was not wanted; do not owe another one.
                k.replace_credit = max(0, k.replace_credit - 1)
                destroy(item.sandbox)
            else:
                keep.append(item)
        k.ready = keep
    for key in [
        key
        for key, k in keys.items()
        if k.held() == 0
        and not k.waiters
        and not k.in_demand(now, settings.demand_window_s)
        and not k.failing(now)
    ]:
        del keys[key]

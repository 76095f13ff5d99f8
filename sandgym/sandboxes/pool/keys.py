"""The pool's per-key state: what it knows of one environment fingerprint (`KeyState`), a ready
sandbox with its age (`Ready`), and the token bucket that paces creations (`TokenBucket`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass, field

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.spec import SandboxSpec


class TokenBucket:
    """Async token bucket; callers wait for a token (only creators, behind the semaphore)."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.last = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return
            await asyncio.sleep((1.0 - self.tokens) / self.rate)


@dataclass
class Ready:
    sandbox: Sandbox
    since: float  # monotonic time it became ready


@dataclass
class KeyState:
    """Everything the pool knows about one fingerprint."""

    key: str
    spec: SandboxSpec
    ready: deque[Ready] = field(default_factory=deque)
    creating: int = 0
    leased: int = 0
    waiters: deque[asyncio.Future[Sandbox]] = field(default_factory=deque)
    last_demand: float = -math.inf
    prewarm_target: int = 0
    replace_credit: int = 0  # releases not yet followed by a hit: replacements owed
    consecutive_failures: int = 0
    failing_until: float = -math.inf
    last_error: BaseException | None = None
    last_served: int = 0  # dispatch sequence number, for round-robin tie breaks
    forgotten: bool = False  # `forget`: make no more, destroy what comes ready unasked

    def in_demand(self, now: float, window_s: float) -> bool:
        return now - self.last_demand <= window_s

    def failing(self, now: float) -> bool:
        return now < self.failing_until

    def unserved(self) -> int:
        """Waiters that no in-flight creation will serve. Every future in `waiters` is
        pending: a waiter is popped before it is handed a result, and removed when its
        acquire gives up; so this is O(1), not a scan per dispatch."""
        return max(0, len(self.waiters) - self.creating)

    def held(self) -> int:
        return len(self.ready) + self.creating + self.leased

"""How a test waits for an event instead of sleeping: poll the state that shows it, bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


async def wait_until(
    pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.1, what: str = "condition"
) -> float:
    """Poll a (sync or async) predicate until true; returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{what} not reached within {timeout_s:g}s")
        await asyncio.sleep(interval_s)


async def wait_until_in_thread(
    pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.1, what: str = "condition"
) -> float:
    """`wait_until` for a predicate that blocks (the docker CLI or SDK): each poll runs in a
    thread, so the event loop under test keeps serving meanwhile."""
    return await wait_until(lambda: asyncio.to_thread(pred), timeout_s, interval_s, what)

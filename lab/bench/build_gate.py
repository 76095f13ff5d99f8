"""A gate between image builds and image removals in one compatibility run (`--prune-images`).

The engine's legacy builder commits each Dockerfile step as an image and reuses it as cache in any
build whose steps match. Removing a finished task's image (`docker image rm -f`) also removes its
untagged step images, and a concurrent build that had just taken one of them as its cache then
fails on a layer the image store no longer has (`failed to get digest ... imagedb/content ... no
such file`). The gate lets builds run side by side, lets a removal run only while no build does,
and holds new builds back while a removal waits, so neither starves the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class BuildGate:
    """Shared for builds, exclusive for removals; a waiting removal goes before new builds."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._building = 0
        self._removing = False
        self._removals_waiting = 0

    @property
    def building(self) -> int:
        """How many builds are inside the gate now."""
        return self._building

    @property
    def removals_waiting(self) -> int:
        """How many removals wait for the builds inside to end."""
        return self._removals_waiting

    @asynccontextmanager
    async def build(self) -> AsyncIterator[None]:
        """Hold the gate for one image build: waits while a removal runs or waits."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._removing and not self._removals_waiting)
            self._building += 1
        try:
            yield
        finally:
            async with self._cond:
                self._building -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def removal(self) -> AsyncIterator[None]:
        """Hold the gate for one image removal: waits until no build and no other removal runs."""
        async with self._cond:
            self._removals_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._building and not self._removing)
            finally:
                self._removals_waiting -= 1
            self._removing = True
        try:
            yield
        finally:
            async with self._cond:
                self._removing = False
                self._cond.notify_all()

"""How many creations the server's pool runs at once: the backend's own default (a local
creation mostly waits on bwrap and the sandbox's init, so 4 at once held the rate far under the
CPU's bound: `sandgym bench host_scale`), or the operator's `pool_max_concurrent_creates`."""

from __future__ import annotations

import asyncio

from sandgym.sandboxes.local.backend import LocalBackend
from sandgym.sandboxes.null import NullBackend
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.server.settings import ServerSettings
from sandgym.server.startup import make_pool
from tests.waiting import wait_until


class _Slow(NullBackend):
    """Creations that wait until released, counted while they run."""

    default_concurrent_creates = 6

    def __init__(self) -> None:
        super().__init__()
        self.running = 0
        self.most = 0
        self.release = asyncio.Event()

    async def create(self, spec: SandboxSpec):  # type: ignore[no-untyped-def]
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
            return await super().create(spec)
        finally:
            self.running -= 1


async def _most_at_once(settings: ServerSettings, backend: _Slow, n: int) -> int:
    pool = make_pool(settings, backend)
    await pool.start()
    try:
        spec = SandboxSpec(image="x")
        tasks = [asyncio.ensure_future(pool.acquire(spec)) for _ in range(n)]
        cap = pool.settings.max_concurrent_creates
        await wait_until(lambda: backend.running >= min(n, cap), 10.0, 0.001, "creations started")
        most = backend.most
        backend.release.set()
        for sb in await asyncio.gather(*tasks):
            await pool.release(sb)
        return most
    finally:
        await pool.close()


async def test_the_backends_default_is_how_many_run_at_once() -> None:
    assert await _most_at_once(ServerSettings(backend="null"), _Slow(), 12) == 6


async def test_the_operators_setting_overrides_it() -> None:
    settings = ServerSettings(backend="null", pool_max_concurrent_creates=3)
    assert await _most_at_once(settings, _Slow(), 12) == 3


def test_local_runs_more_than_the_generic_default() -> None:
    assert LocalBackend.default_concurrent_creates > NullBackend.default_concurrent_creates

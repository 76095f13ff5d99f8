"""The pipes of the processes a local sandbox runs: output read into a capped buffer in the
background, input fed and closed, the bwrap info fd read to its end."""

from __future__ import annotations

import asyncio
import contextlib
import os

from sandgym.sandboxes.common.output import CappedBuffer


class _Capture:
    """Reads one stream in the background into a capped buffer (the rest is counted)."""

    def __init__(self, stream: asyncio.StreamReader | None, limit: int) -> None:
        self.out = CappedBuffer(limit)
        self.task = asyncio.ensure_future(self._pump(stream))

    async def _pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            self.out.add(chunk)

    async def finish(self, grace_s: float) -> tuple[str, bool]:
        """Wait up to `grace_s` for EOF (a background child may hold the pipe), then stop."""
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.task), grace_s)
        self.task.cancel()
        return self.out.text()


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes) -> None:
    """Write `data` to a child's stdin and close it (a child that stops reading is fine)."""
    if pipe is None:
        return
    with contextlib.suppress(ConnectionError, OSError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(Exception):
        pipe.close()


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()

"""The local backend starts processes off the event loop (issue 59): `spawn` forks in its
starter thread, and the pipes and exit code come back on the loop as asyncio streams."""

from __future__ import annotations

import subprocess
import threading

from sandgym.sandboxes.local import spawn as spawn_mod
from tests.waiting import wait_until


async def test_spawn_forks_off_the_loop_and_streams_back(monkeypatch) -> None:
    threads: list[int] = []
    real = subprocess.Popen

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(spawn_mod.subprocess, "Popen", recording)
    proc = await spawn_mod.spawn(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=True)
    assert proc.stdin is not None
    proc.stdin.write(b"hello\n")
    await proc.stdin.drain()
    proc.stdin.close()
    assert await proc.wait() == 3
    assert proc.returncode == 3
    assert await proc.stdout.read() == b"hello\n"
    assert await proc.stderr.read() == b"err\n"
    proc.close_pipes()
    assert len(threads) == 1, f"expected one Popen, found {len(threads)}"
    assert threads[0] != threading.get_ident(), "the fork ran on the event loop's thread"


async def test_wait_returns_for_a_killed_child() -> None:
    proc = await spawn_mod.spawn(["sleep", "30"])
    proc.popen.kill()
    assert await proc.wait() == -9
    proc.close_pipes()


def _pipes_closed_once(loop_name: str) -> None:
    """Run one child on `loop_name`'s loop; after its pipes are closed, each descriptor is closed
    (none leaked), and on uvloop no file object handed to a transport still owns its number
    (libuv closed it; a second close would hit whatever another thread opened under it)."""
    import asyncio
    import os

    import uvloop

    async def main() -> None:
        proc = await spawn_mod.spawn(["sh", "-c", "cat >/dev/null; echo out"], stdin=True)
        handed = [t.get_extra_info("pipe") for t in proc._transports]
        fds = [f.fileno() for f in handed]
        assert len(fds) == 3, f"expected stdout, stderr and stdin pipes, found {len(fds)}"
        assert proc.stdin is not None
        proc.stdin.close()  # cat sees its end only when the descriptor really closed
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert await proc.stdout.read() == b"out\n"
        proc.close_pipes()

        def open_fds() -> list[int]:
            left = []
            for fd in fds:
                try:
                    os.fstat(fd)
                    left.append(fd)
                except OSError:
                    pass
            return left

        # the transports finish closing on the loop; a leak times out here
        await wait_until(lambda: open_fds() == [], 10.0, 0.01, "the pipe descriptors closed")
        if loop_name == "uvloop":
            owners = [f for f in handed if getattr(f, "closefd", True)]
            assert owners == [], f"file objects that would close a freed descriptor again: {owners}"

    if loop_name == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())


def test_each_pipe_is_closed_once_on_uvloop() -> None:
    _pipes_closed_once("uvloop")


def test_each_pipe_is_closed_once_on_asyncio() -> None:
    _pipes_closed_once("asyncio")

"""The local backend starts processes off the event loop (issue 59): `spawn` forks in its
starter thread, and the pipes and exit code come back on the loop as asyncio streams."""

from __future__ import annotations

import subprocess
import threading

from sandgym.sandboxes.local import spawn as spawn_mod


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

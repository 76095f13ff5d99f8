"""Process starts of the local backend, off the event loop.

`asyncio.create_subprocess_exec` forks on the event loop (uvloop's spawn), and the server that
forks grows with every sandbox it holds (memory to copy, descriptors to close): profiled under a
burst (issue 59), about 45 % of the loop's samples sat in the bwrap start alone, and the creation
rate fell as sandboxes were held. Here `subprocess.Popen` (vfork, close_fds through close_range)
runs in a small thread pool of its own, and only the pipes come back to the loop: stdout and
stderr as `asyncio.StreamReader`s, stdin as an `asyncio.StreamWriter`, the exit through a pidfd
the loop watches (no thread waits per process, no child watcher).

The pool's threads are never shut down: a child that asked for a parent-death signal
(`bwrap --die-with-parent`) gets it when the *thread* that started it exits, so that thread
must live as long as the server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

#: the threads that start processes (two: a start takes about a millisecond of CPU; more
#: threads would only queue on the same cores). Never shut down (see the module docstring).
_STARTER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sandgym-local-spawn")


@dataclass
class Spawned:
    """A child started by `spawn`: its pid, its pipes on the loop, its exit code."""

    popen: subprocess.Popen[bytes]
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    stdin: asyncio.StreamWriter | None
    _transports: list[asyncio.BaseTransport] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the child ended (reaped here: a non-blocking waitpid), else None."""
        return self.popen.poll()

    async def wait(self) -> int:
        """Wait for the child's exit (a pidfd the loop watches) and reap it."""
        code = self.popen.poll()
        if code is not None:
            return code
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self.popen.pid)
        except ProcessLookupError:  # already reaped by poll's race: ask again
            return self.popen.wait()
        done: asyncio.Future[None] = loop.create_future()

        def _readable() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(pidfd, _readable)
        try:
            while True:
                code = self.popen.poll()
                if code is not None:
                    return code
                await done
                done = loop.create_future()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    def close_pipes(self) -> None:
        """Close the pipes on this side (what was not read yet is dropped)."""
        for t in self._transports:
            with contextlib.suppress(Exception):
                t.close()


async def spawn(
    argv: Sequence[str],
    *,
    stdin: bool = False,
    pass_fds: Sequence[int] = (),
    cwd: str | None = None,
    limit: int = 2**16,
) -> Spawned:
    """Start `argv` in a new session with piped stdout and stderr (and stdin when asked; else
    /dev/null); the fork happens in the starter thread, not on the loop."""
    loop = asyncio.get_running_loop()

    def _start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            start_new_session=True,
        )

    popen = await loop.run_in_executor(_STARTER, _start)
    transports: list[asyncio.BaseTransport] = []
    try:
        out = await _reader(loop, popen.stdout, limit, transports)
        err = await _reader(loop, popen.stderr, limit, transports)
        writer = None
        if popen.stdin is not None:
            wt, wp = await loop.connect_write_pipe(
                lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), popen.stdin
            )
            transports.append(wt)
            writer = asyncio.StreamWriter(wt, wp, None, loop)
    except BaseException:
        for t in transports:
            t.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, 9)
        raise
    return Spawned(popen, out, err, writer, transports)


async def _reader(
    loop: asyncio.AbstractEventLoop,
    pipe: IO[bytes] | None,
    limit: int,
    transports: list[asyncio.BaseTransport],
) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    assert pipe is not None
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    transports.append(transport)
    return reader

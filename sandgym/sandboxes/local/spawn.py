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

Each pipe descriptor is closed exactly once. The pipes are made here (not by Popen, whose file
objects own their descriptors), and the file object handed to the loop owns its descriptor only
where the loop closes descriptors through it: uvloop's transport closes the descriptor itself
(libuv) and then closes the file object too, so a file object that owned it would close the same
number a second time, by then possibly another thread's new descriptor (a Popen in the starter
thread saw its own error pipe closed under it: EBADF).
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
    # (parent's end, child's end) of each pipe; os.pipe's descriptors are not inherited
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin else (-1, -1)

    def _start() -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                list(argv),
                stdin=in_r if stdin else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=tuple(pass_fds),
                cwd=cwd,
                start_new_session=True,
            )
        finally:  # the child holds its ends now (or there is no child)
            for fd in (out_w, err_w, in_r):
                if fd >= 0:
                    os.close(fd)

    try:
        popen = await loop.run_in_executor(_STARTER, _start)
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    owns = _loop_closes_through_file(loop)
    parent = {"out": _file(out_r, "rb", owns), "err": _file(err_r, "rb", owns)}
    if stdin:
        parent["in"] = _file(in_w, "wb", owns)
    transports: list[asyncio.BaseTransport] = []
    try:
        out = await _reader(loop, parent.pop("out"), limit, transports)
        err = await _reader(loop, parent.pop("err"), limit, transports)
        writer = None
        if stdin:
            wt, wp = await loop.connect_write_pipe(
                lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), parent.pop("in")
            )
            transports.append(wt)
            writer = asyncio.StreamWriter(wt, wp, None, loop)
    except BaseException:
        for t in transports:
            t.close()
        for f in parent.values():  # not handed to a transport yet
            os.close(f.fileno())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, 9)
        raise
    return Spawned(popen, out, err, writer, transports)


def _loop_closes_through_file(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop`'s pipe transports close the descriptor only by closing the file object
    (asyncio's own) rather than closing it themselves first (uvloop's, through libuv)."""
    return not type(loop).__module__.startswith("uvloop")


def _file(fd: int, mode: str, owns: bool) -> IO[bytes]:
    """An unbuffered file object over `fd` for a pipe transport; it owns (closes) `fd` only
    where the loop closes descriptors through it (see the module docstring)."""
    return open(fd, mode, buffering=0, closefd=owns)  # noqa: SIM115 (the transport closes it)


async def _reader(
    loop: asyncio.AbstractEventLoop,
    pipe: IO[bytes],
    limit: int,
    transports: list[asyncio.BaseTransport],
) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    transports.append(transport)
    return reader

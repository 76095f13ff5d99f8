"""Which of a set of files were opened while a block ran: Linux inotify watches from the host.

`OpenTrace` puts an inotify watch (`IN_OPEN`, through ctypes: no dependency) on each file it is
given by its host path (a local sandbox's tree is a host directory; a docker container's files
are reached through `/proc/<its init's pid>/root`), and a thread reads the events while the block
runs: a watch that fires is recorded and removed (one event per file is enough). The kernel
raises `IN_OPEN` on the file's inode whatever process opens it, through whatever mount: a program
executed (`execve` opens it), a script read by its interpreter, a module imported, a shared
library loaded, a configuration file read (measured on this kernel: tests/unit/test_open_trace.py).

Limits: a watch is on an inode, so a file replaced (renamed over) after the watch was put is not
followed; the events do not say which process opened the file (a process the agent left running
that opens its own file counts as the verifier's); a file mapped without an open (an mmap of an
already open descriptor, inherited across exec) raises none; watches are capped by
`fs.inotify.max_user_watches` (shared by every process of the user) and by `MAX_WATCHES` here:
what could not be watched is listed in `TraceResult.unwatched`; a queue overflow
(`fs.inotify.max_queued_events`) sets `overflow` (then every watched file must be assumed opened).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from dataclasses import dataclass, field

IN_ACCESS = 0x00000001
IN_OPEN = 0x00000020
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
#: at most this many files are watched by one trace
MAX_WATCHES = 20000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class TraceUnavailableError(OSError):
    """inotify cannot be used here (not Linux, no libc, or the kernel refused an instance)."""


@dataclass
class TraceResult:
    """What a trace saw: the watched paths opened, how many were watched, which could not be."""

    opened: list[str] = field(default_factory=list)
    watched: int = 0
    unwatched: list[str] = field(default_factory=list)
    overflow: bool = False


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    if name is None:
        raise TraceUnavailableError(errno.ENOSYS, "no C library to call inotify through")
    libc = ctypes.CDLL(name, use_errno=True)
    if not hasattr(libc, "inotify_init1"):
        raise TraceUnavailableError(errno.ENOSYS, "the C library has no inotify_init1")
    return libc


class OpenTrace:
    """inotify watches on `paths` (label -> host path) for the time between `start` and `stop`;
    `stop` returns the labels of those opened meanwhile (see the module docstring)."""

    def __init__(self, paths: dict[str, str], max_watches: int = MAX_WATCHES) -> None:
        self.paths = paths
        self.max_watches = max_watches
        self._libc = _libc()
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise TraceUnavailableError(err, f"inotify_init1 failed: {os.strerror(err)}")
        self._fd: int | None = fd
        self._wds: dict[int, str] = {}
        self._result = TraceResult()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Watch every path (a link is watched as itself: resolve it first), then read events in
        a thread until `stop`."""
        self.watch(self.paths)
        self._thread = threading.Thread(target=self._loop, name="open-trace", daemon=True)
        self._thread.start()

    def watch(self, paths: dict[str, str]) -> None:
        """Watch more paths (label -> host path), also while the trace runs."""
        with self._lock:
            if self._fd is None:
                return
            for label, host in paths.items():
                if self._result.watched >= self.max_watches or not host:
                    self._result.unwatched.append(label)
                    continue
                mask = IN_OPEN | IN_DONT_FOLLOW
                wd = self._libc.inotify_add_watch(self._fd, os.fsencode(host), mask)
                if wd < 0:
                    self._result.unwatched.append(label)
                    continue
                self._wds[wd] = label
                self._result.watched += 1

    def _read(self) -> None:
        assert self._fd is not None
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                off += _EVENT.size + length
                with self._lock:
                    if mask & IN_Q_OVERFLOW:
                        self._result.overflow = True
                        continue
                    if mask & IN_IGNORED:
                        continue
                    label = self._wds.pop(wd, None)
                    if label is None:
                        continue
                    self._result.opened.append(label)
                    self._libc.inotify_rm_watch(self._fd, wd)

    def _loop(self) -> None:
        assert self._fd is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                self._read()

    def stop(self) -> TraceResult:
        """End the trace (the events queued so far are read) and close the inotify instance."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._fd is not None:
            self._read()
            os.close(self._fd)
            self._fd = None
        self._result.opened.sort()
        return self._result


def resolve_in_root(root: str, path: str, max_links: int = 16) -> str | None:
    """The host path of `path` as a process whose root is `root` would reach it: links, relative
    or absolute, are followed inside `root` (an absolute target is not the host's); None when a
    component is missing or the links loop."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    links = 0
    while parts:
        name = parts.pop(0)
        if name == ".":
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(root, *done, name)
        try:
            target = os.readlink(host)
        except FileNotFoundError:
            return None
        except OSError:  # not a link
            done.append(name)
            continue
        links += 1
        if links > max_links:
            return None
        if target.startswith("/"):
            done = []
        parts = [p for p in target.split("/") if p] + parts
    return os.path.join(root, *done)

"""Reading Docker's streams: the multiplexed stdout/stderr of an exec or attach (into capped
buffers, so output is bounded while it streams), and archive chunks as a file object."""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import struct
import tarfile
from collections.abc import Iterator
from typing import Any

from sandgym.sandboxes.common.output import CappedBuffer

log = logging.getLogger(__name__)


def _raw_socket(sock: Any) -> socket.socket | None:
    """The OS socket under whatever docker-py returned for a hijacked exec stream."""
    for attr in ("_sock", "sock"):
        inner = getattr(sock, attr, None)
        if isinstance(inner, socket.socket):
            return inner
    return sock if isinstance(sock, socket.socket) else None


def _read_exactly(sock: Any, n: int) -> bytes:
    from docker.utils import socket as dsocket

    buf = bytearray()
    while len(buf) < n:
        chunk = dsocket.read(sock, n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _demux(sock: Any, out: CappedBuffer, err: CappedBuffer) -> None:
    """(Thread) read Docker's multiplexed stdout/stderr stream (exec or attach, no tty) into the
    two capped buffers until it ends or the socket is shut down; then close the socket."""
    try:
        while True:
            header = _read_exactly(sock, 8)
            if len(header) < 8:
                return
            stream_type, size = struct.unpack(">BxxxL", header)
            remaining = size
            while remaining > 0:
                chunk = _read_exactly(sock, min(remaining, 65536))
                if not chunk:
                    return
                remaining -= len(chunk)
                (err if stream_type == 2 else out).add(chunk)
    except OSError:
        return  # socket shut down by a timeout path
    finally:
        with contextlib.suppress(Exception):
            sock.close()
        raw = _raw_socket(sock)
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()


class _ChunkReader(io.RawIOBase):
    """A file object over docker-py's archive chunk generator (for streaming tarfile reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._pending))
        b[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
        super().close()


def _data_or_skip(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's `data` filter, skipping (not failing on) the members it refuses."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        log.debug("download: left out %s (%s)", member.name, member.type)
        return None

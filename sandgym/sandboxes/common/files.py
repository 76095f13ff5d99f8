"""Host-side file helpers the backends share: small tar archives, an upload's checks, and
removing a tree that a sandboxed command may have left read-only."""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import shutil
import stat
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

from sandgym.sandboxes.errors import SandboxPathError


def files_tar(files: Mapping[str, bytes], mode: int = 0o644, mtime: float | None = None) -> bytes:
    """An uncompressed tar holding `files` (archive name -> bytes), each with `mode`; the
    modification time is `mtime` (default: now)."""
    stamp = int(time.time() if mtime is None else mtime)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, stamp
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def one_file_tar(path: str, data: bytes, mode: int = 0o644) -> bytes:
    """A tar holding one file named after `path`'s last component (to unpack in its parent)."""
    return files_tar({posixpath.basename(path): data}, mode)


def checked_upload(src: Path | str, dst: str) -> Path:
    """An upload's host source, checked before anything is sent: it exists on this host, and
    `dst` (the normalised destination inside the sandbox) is not the root directory."""
    src = Path(src)
    if not src.exists():
        raise FileNotFoundError(f"upload source {src} does not exist on the host")
    if dst == "/":
        raise SandboxPathError("expected a destination below /, got the root directory")
    return src


def remove_tree(path: Path, *, ignore_errors: bool = False) -> None:
    """rm -rf that also gets through the read-only directories (chmod 000, 0555) a sandboxed
    command may leave: directories are made writable first, and an entry that still refuses
    removal gets its own and its parent's permission bits restored and is tried once more.

    A failure then raises OSError, unless `ignore_errors` (a missing `path` is then no error
    either)."""
    if ignore_errors and not os.path.lexists(path):
        return
    if not os.path.islink(path):
        for dirpath, dirnames, _ in os.walk(path):
            for d in dirnames:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(dirpath, d), 0o755)

    def onerror(func, p, _exc):  # type: ignore[no-untyped-def]
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
        try:
            func(p)
        except OSError:
            if not ignore_errors:
                raise

    shutil.rmtree(path, onerror=onerror)

"""`hash_directory`: the content hash of a directory (a build context, a mounted source), cached
by the files' stat signature so a context acquired for every episode is read once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_HASH_CACHE: dict[tuple[str, tuple[tuple[str, int, int, int], ...]], str] = {}


def hash_directory(root: Path) -> str:
    """sha256 over the relative paths, modes and contents of every file below `root`.

    Cached by a stat signature (paths, sizes, mtimes, modes), so a pool acquiring the same
    build context for every episode reads the files once, not every time.
    """
    root = Path(root)
    sig = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            st = os.lstat(os.path.join(dirpath, name))
            sig.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns, st.st_mode))
    key = (str(root.resolve()), tuple(sig))
    cached = _HASH_CACHE.get(key)
    if cached is None:
        cached = _HASH_CACHE[key] = _hash_directory(root)
        if len(_HASH_CACHE) > 4096:
            _HASH_CACHE.pop(next(iter(_HASH_CACHE)))
    return cached


def _hash_directory(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0")
            if p.is_symlink():
                h.update(b"L" + os.readlink(p).encode())
                continue
            h.update(oct(p.stat().st_mode & 0o777).encode())
            h.update(p.read_bytes())
    return h.hexdigest()

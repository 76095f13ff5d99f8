"""Sandbox ids and the path rule every backend applies before its own checks."""

from __future__ import annotations

import posixpath
import uuid

from sandgym.sandboxes.errors import SandboxPathError


def new_sandbox_id() -> str:
    return "sg-" + uuid.uuid4().hex[:12]


def normalize_sandbox_path(path: str, workdir: str = "/") -> str:
    """Resolve `path` (absolute, or relative to `workdir`) to a normalized absolute path.

    Raises `SandboxPathError` for empty paths, NUL bytes, and `..` that would climb above `/`.
    Symlinks are checked by each backend against its real filesystem.

    >>> normalize_sandbox_path("x/../y", "/app")
    '/app/y'
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise SandboxPathError(f"expected a non-empty path without NUL bytes, got {path!r}")
    full = path if path.startswith("/") else posixpath.join(workdir, path)
    depth = 0
    for part in full.split("/"):
        if part in ("", "."):
            continue
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            raise SandboxPathError(f"path {path!r} climbs above the sandbox root")
    return posixpath.normpath(full).replace("//", "/")

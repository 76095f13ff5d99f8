"""Content-addressed directories under `$SANDGYM_CACHE` (default `~/.cache/sandgym`): a build
context with its Dockerfile rewritten, a step's tests merged over the task's. Each is made once
per content digest, in a temporary directory renamed into place, so concurrent callers never see
a half-made one."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """`$SANDGYM_CACHE`, else `~/.cache/sandgym`."""
    return Path(os.environ.get("SANDGYM_CACHE", Path.home() / ".cache" / "sandgym"))


def cached_tree(kind: str, name: str, digest: str, fill: Callable[[Path], None]) -> Path:
    """`<cache>/<kind>/<name>-<digest>`, made by `fill(tmp)` (which creates `tmp`) unless it
    exists. A task id's `/` becomes `_` in `name`."""
    dest = cache_root() / kind / f"{name.replace('/', '_')}-{digest}"
    if not dest.exists():
        tmp = dest.with_name(dest.name + f".tmp{uuid.uuid4().hex[:6]}")
        fill(tmp)
        try:
            tmp.rename(dest)
        except OSError:  # a concurrent caller won the race; theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return dest

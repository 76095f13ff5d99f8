"""The gateway bridge's host side: one directory per container, `<bridge_root>/<sandbox id>`,
bind-mounted read-only at `/run/sandgym` (`names.BRIDGE_MOUNT`), where the env server puts unix
sockets; made before its container, removed with it, and swept when its container is gone."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from sandgym.sandboxes.docker.names import DEFAULT_BRIDGE_ROOT

log = logging.getLogger(__name__)


#: the longest socket name the server puts in a bridge directory ("/gateway.sock" is 13 bytes)
_BRIDGE_SOCKET_NAME_MAX = 16
_MAX_UNIX_PATH = 107  # sun_path is 108 bytes with its terminating NUL


def resolve_bridge_root(option: str | Path | None) -> Path:
    """The bridge root a backend uses: `option`, else `$SANDGYM_DOCKER_BRIDGE_ROOT`, else
    `DEFAULT_BRIDGE_ROOT`; ValueError unless absolute and short enough for unix sockets."""
    root = Path(option or os.environ.get("SANDGYM_DOCKER_BRIDGE_ROOT") or DEFAULT_BRIDGE_ROOT)
    if not root.is_absolute():
        raise ValueError(f"bridge_root must be an absolute path, got {str(root)!r}")
    longest = len(str(root / "sg-000000000000")) + 1 + _BRIDGE_SOCKET_NAME_MAX
    if longest > _MAX_UNIX_PATH:
        raise ValueError(
            f"bridge_root {str(root)!r} is too long for unix sockets: sockets in it would "
            f"need {longest} bytes, at most {_MAX_UNIX_PATH} fit; choose a shorter directory"
        )
    return root


def _make_bridge_dir(path: Path) -> None:
    """(Thread) a fresh, empty bridge directory that any user in the container can traverse."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o755, exist_ok=True)  # exists on the retry without storage limits
    os.chmod(path, 0o755)  # mkdir's mode is masked by the umask


def _remove_bridge_dir(path: Path) -> None:
    """(Thread) remove a bridge directory (it holds only sockets the server made)."""
    if path.is_symlink():
        path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        log.warning("docker: could not remove bridge directory %s", path)


#: a bridge directory without its container is left alone this long (it may be being created)
BRIDGE_SWEEP_GRACE_S = 120.0


def _sweep_bridge_root(root: Path, live: set[str]) -> None:
    """(Thread) remove bridge directories under `root` whose container no longer exists, and
    which are older than `BRIDGE_SWEEP_GRACE_S` (a create in flight makes its directory first)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    now = time.time()
    for d in entries:
        if not d.name.startswith("sg-") or d.name in live:
            continue
        try:
            age = now - d.lstat().st_mtime
        except OSError:
            continue
        if age > BRIDGE_SWEEP_GRACE_S:
            _remove_bridge_dir(d)

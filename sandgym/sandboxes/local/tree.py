"""What a local sandbox's root tree holds and how the host reads it: the host's system
directories bound read-only, the private writable ones, the verifier's fixed mount points, the
host secrets hidden, paths resolved as the sandbox sees them (symlinks never lead out), and
copying (snapshots) and removing a tree."""

from __future__ import annotations

import contextlib
import glob
import os
import posixpath
import shutil
from pathlib import Path

from sandgym.sandboxes.common.files import remove_tree

#: Host directories bound read-only into every sandbox (links like /bin -> usr/bin are copied).
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Private writable directories every sandbox has.
PRIVATE_DIRS = (
    "app",
    "logs/verifier",
    "logs/agent",
    "tests",
    "tmp",
    "root",
    "home",
    "workspace",
    "testbed",
    "var/tmp",
    "run",
    "opt",
    "srv",
    "mnt",
)
#: directories of the verifier (tests copied in at scoring time, its reward files): fixed mount
#: points in the sandbox, see `LocalSandbox.exec_private`
VERIFIER_MOUNTS = ("logs", "logs/verifier", "tests")


#: Host files under the shared /etc that a sandbox must not read (hidden behind /dev/null).
SECRET_GLOBS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private/*", "/etc/docker/key.json",
)  # fmt: skip


def _host_secret_files() -> list[str]:

    return sorted(p for pattern in SECRET_GLOBS for p in glob.glob(pattern) if os.path.isfile(p))


def _resolve_in_root(root: Path, path: str, depth: int = 0) -> str | None:
    """Resolve `path` component by component as the sandbox sees it (a symlink's absolute
    target is relative to the sandbox's /), returning the sandbox-absolute result; None when
    the links nest too deep. A link can never lead out of `root`: `..` stops at /."""
    if depth > 40:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    cur: list[str] = []
    for i, part in enumerate(parts):
        if part == "..":
            if cur:
                cur.pop()
            continue
        if cur and cur[0] in SYSTEM_DIRS:  # beyond this point the host's read-only tree
            cur.append(part)
            continue
        candidate = root.joinpath(*cur, part)
        if candidate.is_symlink():
            target = os.readlink(candidate)
            base = "/" if target.startswith("/") else "/" + "/".join(cur)
            rest = "/".join(parts[i + 1 :])
            joined = posixpath.normpath(posixpath.join(base, target)) if target else "/"
            return _resolve_in_root(root, joined + ("/" + rest if rest else ""), depth + 1)
        cur.append(part)
    return "/" + "/".join(cur)


def _copy_tree(src: Path, dst: Path) -> None:
    """`src` copied to `dst` (new) with modes, owners and links; sockets, FIFOs and devices
    (a gateway bridge's socket, what the agent made) are left out."""

    def ignore(dirpath: str, names: list[str]) -> set[str]:
        # bwrap's mount points at the top (the host's system directories, /dev, /proc) are
        # not the sandbox's files; copied, they would stop the copy's bwrap from starting
        out = set(SYSTEM_DIRS + ("dev", "proc")) & set(names) if dirpath == str(src) else set()
        for n in names:
            p = os.path.join(dirpath, n)
            if not (os.path.islink(p) or os.path.isfile(p) or os.path.isdir(p)):
                out.add(n)
        return out

    shutil.copytree(src, dst, symlinks=True, ignore=ignore)
    for dirpath, dirnames, filenames in os.walk(dst):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(src, os.path.relpath(p, dst)))
                os.lchown(p, st.st_uid, st.st_gid)


def _rmtree(path: Path) -> None:
    # Files the sandbox made read-only (chmod 000 dirs) must not stop the cleanup.
    remove_tree(path, ignore_errors=True)

"""Which paths of a local sandbox's tree changed since it was made, read by the host itself.

A local sandbox's root is a host directory, so the host can list it without running anything
inside the sandbox: `tree_manifest` records each entry's `lstat` (links are never followed) when
the tree is made, and `diff_manifest` compares a later listing with it. A file's entry holds its
ctime, which the kernel sets on every change and no process in the sandbox can set back (that
takes the clock, which the sandbox cannot change), so a file rewritten with its old size and
mtime restored is still seen. A directory's entry holds only its type, mode, owner and inode: a
new file in it is its own entry, not a change of the directory. The host's system directories,
bound read-only, and what the server itself puts there (/run/sandgym, /dev, /proc) are not the
sandbox's files and are left out.
"""

from __future__ import annotations

import os
import stat

from sandgym.sandboxes.spec import PathChanges

#: top-level names that are mount points of the host's or the server's, not the sandbox's files
_SKIP_TOP = frozenset(
    {"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "dev", "proc", "sys"}
)
#: the server's bridge directory (unix sockets it puts there)
_SKIP_PATHS = frozenset({"/run/sandgym"})


def entry_fingerprint(st: os.stat_result, link: str | None = None) -> str:
    """What is compared for one entry (see the module docstring)."""
    kind = stat.S_IFMT(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        return f"d:{st.st_mode:o}:{st.st_uid}:{st.st_gid}:{st.st_ino}"
    if stat.S_ISLNK(st.st_mode):
        return f"l:{st.st_uid}:{st.st_ctime_ns}:{st.st_ino}:{link}"
    return (
        f"{kind:o}:{st.st_mode:o}:{st.st_uid}:{st.st_gid}:{st.st_size}:"
        f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    )


def tree_manifest(root: str | os.PathLike[str]) -> dict[str, str]:
    """sandbox path -> fingerprint of every entry under `root` (the sandbox's /), links not
    followed, the skipped mount points left out."""
    out: dict[str, str] = {}
    base = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(base):
        rel = dirpath[len(base) :] or "/"
        if rel == "/":
            dirnames[:] = [d for d in dirnames if d not in _SKIP_TOP]
        dirnames[:] = [d for d in dirnames if _join(rel, d) not in _SKIP_PATHS]
        for name in dirnames + filenames:
            path = _join(rel, name)
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
                link = os.readlink(full) if stat.S_ISLNK(st.st_mode) else None
            except OSError:  # gone while listing
                continue
            out[path] = entry_fingerprint(st, link)
        # os.walk lists a link to a directory among dirnames but does not descend it
    return out


def path_fingerprint(root: str | os.PathLike[str], path: str) -> str | None:
    full = os.path.join(os.fspath(root), path.lstrip("/"))
    try:
        st = os.lstat(full)
        return entry_fingerprint(st, os.readlink(full) if stat.S_ISLNK(st.st_mode) else None)
    except OSError:
        return None


def read_links(root: str | os.PathLike[str], paths: list[str]) -> dict[str, str]:
    """The targets of those of `paths` that are symbolic links in the tree at `root`."""
    out: dict[str, str] = {}
    for path in paths:
        full = os.path.join(os.fspath(root), path.lstrip("/"))
        try:
            if os.path.islink(full):
                out[path] = os.readlink(full)
        except OSError:
            continue
    return out


def diff_manifest(before: dict[str, str], after: dict[str, str]) -> PathChanges:
    created = sorted(p for p in after if p not in before)
    deleted = sorted(p for p in before if p not in after)
    modified = sorted(p for p, fp in after.items() if p in before and before[p] != fp)
    return PathChanges(created=tuple(created), modified=tuple(modified), deleted=tuple(deleted))


def _join(rel: str, name: str) -> str:
    return ("" if rel == "/" else rel) + "/" + name

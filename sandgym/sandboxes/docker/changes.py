"""A docker sandbox's file changes, read out and applied to another (a group's fork).

`changes()` asks the engine which paths of the container's file system were added, modified or
deleted since it was made (`docker diff`), has GNU tar in the container pack the added and
modified entries, as root and without recursion (a directory entry carries its own owner and
mode, not its other contents), and returns them with the deleted paths. `apply_changes()` deletes
those paths in a fresh container of the same spec and unpacks the tar into it through the
engine (`put_archive`, owners, modes and times kept). Paths the engine mounts into every
container (`/etc/hosts`, the init, the bridge directory, volumes) are not the sandbox's files
and are left out.

Against a snapshot (`docker commit`, then a container per member from it) this spares the
commit (about 1 s here) and lets the members' containers be made while member 0 prepares:
`DockerBackend.forks_by_changes`. A change set over `MAX_CHANGES_BYTES`, or an image without
GNU tar, raises SnapshotUnsupportedError, and the group falls back to the snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.docker.exec_kill import ContainerExec
from sandgym.sandboxes.errors import SandboxError, SnapshotUnsupportedError
from sandgym.sandboxes.spec import FileChanges, PathChanges

#: a larger change set is committed instead (it is held in the server's memory per group)
MAX_CHANGES_BYTES = 64 * 1024 * 1024
#: what the engine puts into every container: never part of a sandbox's changes
ENGINE_PATHS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/proc", "/sys", "/dev")
#: a file up to this size is fingerprinted by its bytes (`path_fingerprints`), a larger one by
#: the engine's stat of it (size, mode, mtime)
MAX_FINGERPRINT_BYTES = 4 * 1024 * 1024
#: `docker diff` kinds
_MODIFIED, _ADDED, _DELETED = 0, 1, 2


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def split_diff(diff: list[dict[str, Any]], mounts: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """`docker diff` entries -> (paths to pack, paths deleted), without what the engine mounts
    (`ENGINE_PATHS`, the container's `mounts`, its init) and in path order."""
    skip = ENGINE_PATHS + mounts
    keep: list[str] = []
    deleted: list[str] = []
    for entry in diff or []:
        path = posixpath.normpath(str(entry.get("Path") or ""))
        if not path.startswith("/") or path == "/" or _under(path, skip):
            continue
        if posixpath.basename(path) == "docker-init" and posixpath.dirname(path) in (
            "/sbin",
            "/usr/sbin",
        ):
            continue
        (deleted if entry.get("Kind") == _DELETED else keep).append(path)
    return sorted(keep), sorted(deleted)


def diff_kinds(diff: list[dict[str, Any]], mounts: tuple[str, ...]) -> PathChanges:
    """`docker diff` entries -> `PathChanges`, without what the engine mounts (as `split_diff`).
    The engine marks every directory above a changed entry as changed: such a directory (one
    that is the parent of another listed entry) is not reported; a directory listed alone (its
    own mode or owner changed) is."""
    skip = ENGINE_PATHS + mounts
    kinds: dict[str, int] = {}
    for entry in diff or []:
        path = posixpath.normpath(str(entry.get("Path") or ""))
        if not path.startswith("/") or path == "/" or _under(path, skip):
            continue
        if posixpath.basename(path) == "docker-init" and posixpath.dirname(path) in (
            "/sbin",
            "/usr/sbin",
        ):
            continue
        kinds[path] = int(entry.get("Kind", _MODIFIED))
    parents = {posixpath.dirname(p) for p in kinds}
    created = sorted(p for p, k in kinds.items() if k == _ADDED)
    deleted = sorted(p for p, k in kinds.items() if k == _DELETED)
    modified = sorted(p for p, k in kinds.items() if k == _MODIFIED and p not in parents)
    return PathChanges(created=tuple(created), modified=tuple(modified), deleted=tuple(deleted))


class ContainerChanges:
    """`changes` and `apply_changes` (see the module docstring); `changed_paths`,
    `path_fingerprints` and `read_links` for tamper reports. The sandbox checks that its
    container runs before it asks."""

    def __init__(self, container: Container, execs: ContainerExec, bridge_dir: Path | None) -> None:
        self.container = container
        self.execs = execs  # for the root commands that delete paths
        self.bridge_dir = bridge_dir  # where path lists are handed to tar (`/run/sandgym`)
        self._diff_lock = asyncio.Lock()  # one paused diff at a time (`_diff_and_mounts`)

    @contextlib.contextmanager
    def _path_list(self, kind: str, paths: list[str] | tuple[str, ...]) -> Iterator[str]:
        """`paths`, NUL-separated, in a file of this sandbox's bridge directory for the time of
        the block; yields the file's path inside the container (`/run/sandgym/...`)."""
        if self.bridge_dir is None:
            raise SandboxError(f"sandbox {self.container.sandbox_id} has no bridge directory")
        name = f".{kind}-{uuid.uuid4().hex[:8]}"
        listing = self.bridge_dir / name
        listing.write_bytes(b"".join(p.encode() + b"\0" for p in paths))
        listing.chmod(0o644)
        try:
            yield f"/run/sandgym/{name}"
        finally:
            listing.unlink(missing_ok=True)

    async def _diff_and_mounts(self) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """The engine's `docker diff` of the container and the destinations of its mounts.

        A running container is paused for the diff (the engine's freezer, as `docker commit`
        pauses): a process inside that renames or removes directories while the engine walks
        them fails the walk (`readdirent: no such file or directory`), and the agent could
        then turn its own scoring into an engine error."""
        import docker.errors

        api, cid = self.container.api, self.container.id
        async with self._diff_lock:
            info = await asyncio.to_thread(api.inspect_container, cid)
            state = info.get("State") or {}
            paused = False
            if state.get("Running") and not state.get("Paused"):
                try:
                    await asyncio.to_thread(api.pause, cid)
                    paused = True
                except docker.errors.APIError:  # it stopped meanwhile: nothing runs to race
                    pass
            try:
                diff = await asyncio.to_thread(api.diff, cid)
            finally:
                if paused:
                    await asyncio.shield(asyncio.to_thread(api.unpause, cid))
        return diff, tuple(str(m.get("Destination")) for m in info.get("Mounts") or [])

    async def changes(self) -> FileChanges:
        if self.bridge_dir is None:  # no list to hand tar: the group takes a snapshot instead
            raise SnapshotUnsupportedError(
                f"sandbox {self.container.sandbox_id} has no bridge directory"
            )
        diff, mounts = await self._diff_and_mounts()
        keep, deleted = split_diff(diff, mounts)
        if not keep:
            return FileChanges(tar=b"", deleted=tuple(deleted))
        with self._path_list("changes", [p.lstrip("/") for p in keep]) as listing:
            code, tar = await asyncio.to_thread(self._tar_out, listing)
        if code != 0:
            raise SnapshotUnsupportedError(
                f"sandbox {self.container.sandbox_id}: packing its {len(keep)} changed paths with tar failed "
                f"(exit code {code}; expected GNU tar in the image)"
            )
        return FileChanges(tar=tar, deleted=tuple(deleted))

    async def changed_paths(self) -> PathChanges:
        """The engine's own diff of the container against its image (`diff_kinds`): no program
        inside the container is run, so none the agent replaced can hide a change."""
        diff, mounts = await self._diff_and_mounts()
        return diff_kinds(diff, mounts)

    async def path_fingerprints(self, paths: list[str]) -> dict[str, str | None]:
        """Through the engine's archive endpoint: a regular file up to MAX_FINGERPRINT_BYTES by
        the hash of its archive (bytes, mode, owner, mtime), anything else by the engine's stat
        (mode, size, mtime, link target)."""
        return await asyncio.to_thread(lambda: {p: self._fingerprint(p) for p in paths})

    async def read_links(self, paths: list[str]) -> dict[str, str]:
        """Through the engine's stat of each path (its archive header): the link targets."""

        def read() -> dict[str, str]:
            import docker.errors

            out: dict[str, str] = {}
            for path in paths:
                try:
                    chunks, info = self.container.api.get_archive(self.container.id, path, 65536)
                except docker.errors.NotFound:
                    continue
                with contextlib.suppress(Exception):
                    chunks.close()
                if int((info or {}).get("mode", 0)) & (1 << 27):
                    out[path] = str((info or {}).get("linkTarget") or "")
            return out

        return await asyncio.to_thread(read)

    def _fingerprint(self, path: str) -> str | None:
        """(Thread) One path's fingerprint; None when the engine finds nothing there."""
        import docker.errors

        try:
            chunks, info = self.container.api.get_archive(self.container.id, path, 65536)
        except docker.errors.NotFound:
            return None
        info = info or {}
        mode = int(info.get("mode", 0))
        stat = f"{mode}:{info.get('size')}:{info.get('mtime')}:{info.get('linkTarget')}"
        regular = not mode & ((1 << 31) | (1 << 27)) and int(info.get("size") or 0) <= (
            MAX_FINGERPRINT_BYTES
        )
        try:
            if not regular:
                return "s:" + stat
            digest = hashlib.sha256()
            for chunk in chunks:
                digest.update(chunk)
            return "h:" + digest.hexdigest()
        finally:
            with contextlib.suppress(Exception):
                chunks.close()

    def _tar_out(self, listing: str) -> tuple[int | None, bytes]:
        """(Thread) GNU tar's archive of the paths in `listing` on stdout, as root; the exit
        code and the bytes. Over MAX_CHANGES_BYTES: SnapshotUnsupportedError."""
        argv = ["tar", "-C", "/", "--no-recursion", "--null", "-T", listing, "-cf", "-"]
        ex = self.container.api.exec_create(
            self.container.id, argv, stdout=True, stderr=False, user="root"
        )
        chunks: list[bytes] = []
        size = 0
        for chunk in self.container.api.exec_start(ex["Id"], stream=True):
            size += len(chunk)
            if size > MAX_CHANGES_BYTES:
                raise SnapshotUnsupportedError(
                    f"sandbox {self.container.sandbox_id}: its changes are over {MAX_CHANGES_BYTES} bytes"
                )
            chunks.append(chunk)
        return self.container.api.exec_inspect(ex["Id"]).get("ExitCode"), b"".join(chunks)

    async def apply_changes(self, changes: FileChanges) -> None:
        if changes.deleted:
            with self._path_list("deleted", changes.deleted) as listing:
                code, out = await self.execs.raw_exec(
                    ["sh", "-c", f"xargs -0 rm -rf -- < {listing}"], user="root"
                )
            if code != 0:
                raise SandboxError(
                    f"sandbox {self.container.sandbox_id}: removing {len(changes.deleted)} deleted paths failed "
                    f"(exit code {code}): {out.decode(errors='replace')[-500:]}"
                )
        if changes.tar:
            await asyncio.to_thread(
                self.container.api.put_archive, self.container.id, "/", changes.tar
            )

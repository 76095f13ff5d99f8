"""`ContainerFiles`: a Docker sandbox's files, moved as tar archives through the engine
(`put_archive`/`get_archive`): nothing runs inside the container for them but a `mkdir -p` of a
missing parent; symlinks resolve inside the container's root, never on the host. The sandbox
checks that its container runs before it asks."""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from sandgym.sandboxes.common.files import checked_upload, one_file_tar
from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.docker.exec_kill import ContainerExec
from sandgym.sandboxes.docker.streams import _ChunkReader, _data_or_skip
from sandgym.sandboxes.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxPathError,
)
from sandgym.sandboxes.paths import normalize_sandbox_path

# Go's os.FileMode bits, as Docker reports them in the archive stat header.
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27


class ContainerFiles:
    """Files in and out of one container (see the module docstring); relative paths are under
    `workdir`."""

    def __init__(self, container: Container, execs: ContainerExec, workdir: str) -> None:
        self.container = container
        self.execs = execs  # for the `mkdir -p` of a missing parent
        self.workdir = workdir

    def path(self, path: str) -> str:
        """`path` made absolute under the workdir and normalized."""
        return normalize_sandbox_path(path, self.workdir)

    async def put_archive(self, parent: str, data: Any) -> None:
        """put_archive into `parent`, creating it when missing; lost container -> error."""
        import docker.errors

        def put() -> None:
            if hasattr(data, "seek"):
                data.seek(0)
            self.container.api.put_archive(self.container.id, parent, data)

        try:
            await asyncio.to_thread(put)
            return
        except docker.errors.NotFound as exc:
            await self.container.raise_if_lost("write", exc)
        code, out = await self.execs.raw_exec(["mkdir", "-p", parent])
        if code != 0:
            raise SandboxPathError(
                f"cannot create directory {parent} in sandbox {self.container.sandbox_id}: {out.decode(errors='replace')}"
            )
        try:
            await asyncio.to_thread(put)
        except docker.errors.NotFound as exc:
            # `mkdir -p` worked but Docker cannot resolve the directory in the container's
            # filesystem (e.g. a symlink into /proc): the agent's path, not a server fault.
            raise SandboxPathError(
                f"cannot write into {parent} in sandbox {self.container.sandbox_id}: expected a directory of the "
                f"container's filesystem, Docker found none ({exc.explanation})"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"writing into {parent} in sandbox {self.container.sandbox_id} failed: {exc}"
            ) from exc

    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        p = self.path(path)
        if p == "/":
            raise SandboxPathError("expected a file path, got the root directory")
        data = content.encode() if isinstance(content, str) else bytes(content)
        await self.put_archive(posixpath.dirname(p), one_file_tar(p, data, mode))

    async def stat(self, path: str) -> tuple[str, dict[str, Any]]:
        """Follow symlinks (Docker resolves them inside the container's root, so a link can
        never reach the host) and return (resolved path, stat) or raise not-found/lost."""
        import docker.errors

        current = path
        for _ in range(16):
            try:
                st = await asyncio.to_thread(
                    self.container.api.get_archive, self.container.id, current, 65536
                )
            except docker.errors.NotFound as exc:
                await self.container.raise_if_lost("read", exc)
                raise SandboxFileNotFoundError(
                    f"no such file or directory in sandbox {self.container.sandbox_id}: {path}"
                ) from exc
            chunks, info = st
            with contextlib.suppress(Exception):
                chunks.close()
            if int(info.get("mode", 0)) & _GO_MODE_SYMLINK and info.get("linkTarget"):
                target = info["linkTarget"]
                current = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
                continue
            return current, info
        raise SandboxPathError(f"too many levels of symbolic links at {path}")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        p = self.path(path)
        resolved, info = await self.stat(p)
        if int(info.get("mode", 0)) & _GO_MODE_DIR:
            raise SandboxPathError(
                f"expected a file, {p} is a directory in sandbox {self.container.sandbox_id}"
            )

        def fetch() -> bytes:
            chunks, _ = self.container.api.get_archive(self.container.id, resolved, 65536)
            reader = _ChunkReader(chunks)
            try:
                with tarfile.open(fileobj=io.BufferedReader(reader), mode="r|") as tar:
                    for member in tar:
                        f = tar.extractfile(member)
                        if f is None:
                            return b""
                        return f.read() if max_bytes is None else f.read(max_bytes)
                return b""
            finally:
                reader.close()

        return await asyncio.to_thread(fetch)

    async def upload(self, src: Path, dst: str) -> None:
        p = self.path(dst)
        src = checked_upload(src, p)

        def pack() -> Any:
            tmp = tempfile.TemporaryFile()
            with tarfile.open(fileobj=tmp, mode="w") as tar:

                def owned_by_root(ti: tarfile.TarInfo) -> tarfile.TarInfo:
                    ti.uid = ti.gid = 0
                    ti.uname = ti.gname = "root"
                    return ti

                tar.add(str(src), arcname=posixpath.basename(p), filter=owned_by_root)
            return tmp

        tmp = await asyncio.to_thread(pack)
        try:
            await self.put_archive(posixpath.dirname(p), tmp)
        finally:
            tmp.close()

    async def download(self, src: str, dst: Path) -> None:
        p = self.path(src)
        resolved, _info = await self.stat(p)
        dst = Path(dst)

        def fetch() -> None:
            chunks, _ = self.container.api.get_archive(self.container.id, resolved, 65536)
            dst.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=dst.parent) as tmpdir:
                reader = _ChunkReader(chunks)
                try:
                    with tarfile.open(fileobj=io.BufferedReader(reader), mode="r|") as tar:
                        # "data" refuses absolute paths, links out of the tree, device files:
                        # such a member is left out (a tree the agent made may hold them).
                        tar.extractall(tmpdir, filter=_data_or_skip)
                finally:
                    reader.close()
                top = Path(tmpdir) / posixpath.basename(resolved)
                if top.is_dir():
                    shutil.copytree(top, dst, dirs_exist_ok=True, symlinks=True)
                else:
                    shutil.move(str(top), dst)

        await asyncio.to_thread(fetch)

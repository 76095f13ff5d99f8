"""`DockerSandbox`: one container, put together from its parts (`core`, `exec_kill`,
`verifier`) with its network switches, its persistent shell (`docker exec -it ... bash`,
started lazily) and its files (tar archives through `put_archive`/`get_archive`; symlinks
resolve inside the container's root, never on the host)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath
import shutil
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxes.base import SandboxCapabilities
from sandboxes.common.files import checked_upload, one_file_tar
from sandboxes.docker.bridge import _remove_bridge_dir
from sandboxes.docker.changes import DockerChanges
from sandboxes.docker.names import GROUP_SNAPSHOT_REPO, LABEL_BRIDGE_DIR, LABEL_SNAPSHOT_OF
from sandboxes.docker.streams import _ChunkReader, _data_or_skip
from sandboxes.docker.verifier import DockerPrivateVerifier
from sandboxes.egress import EgressProxy
from sandboxes.errors import (
    NetworkPolicyUnsupportedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
)
from sandboxes.network import NetworkPolicy

if TYPE_CHECKING:
    pass

# Go's os.FileMode bits, as Docker reports them in the archive stat header.
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27


class DockerSandbox(DockerChanges, DockerPrivateVerifier):
    """One container. Create through `DockerBackend.create`."""

    # the image built from the spec (the backend), changes listed by the engine (DockerChanges),
    # the verifier in a sibling container (DockerPrivateVerifier)
    capabilities = SandboxCapabilities(builds_images=True, lists_changes=True, private_exec=True)

    # -- network -----------------------------------------------------------------------------
    async def _start_network(self, pid: int | None) -> None:
        """The starting policy: off the bridge unless public; the allowlist proxy listening in
        the container's network namespace when some phase needs it."""
        if self._on_bridge and self.network.mode != "public":
            await self._set_bridge(False)
        if self.spec.needs_proxy:
            if not pid or getattr(self, "_host_pid", None) != pid:
                raise NetworkPolicyUnsupportedError(
                    f"sandbox {self.id}: an allowlist network needs the server on the Docker "
                    "engine's own host (its proxy listens in the container's network namespace, "
                    "entered through /proc); this server cannot see the container's processes"
                )
            self._proxy = EgressProxy(self.id, self.network)
            await self._proxy.start(f"/proc/{pid}/ns/net")

    async def _set_bridge(self, connected: bool) -> None:
        api = self._api
        if connected:
            await asyncio.to_thread(api.connect_container_to_network, self.container_id, "bridge")
        else:
            await asyncio.to_thread(
                api.disconnect_container_from_network, self.container_id, "bridge", force=True
            )
        self._on_bridge = connected

    async def _apply_network(self, policy: NetworkPolicy) -> None:
        """public: back on the bridge; no-network and allowlist: off it (loopback only), the
        proxy enforcing the allowlist (and, in a public phase, letting everything through)."""
        want_bridge = policy.mode == "public"
        if want_bridge != self._on_bridge:
            await self._set_bridge(want_bridge)
        if self._proxy is not None:
            self._proxy.set_policy(policy)

    # -- lifecycle ---------------------------------------------------------------------------
    async def _destroy(self) -> None:
        await self._close_shell()
        if self._proxy is not None:
            with contextlib.suppress(Exception):
                await self._proxy.close()
        # Shielded: a cancelled episode must still not leak its container.
        await asyncio.shield(self._backend.engine.remove_container(self.container_id))
        if self._group is not None:
            await asyncio.shield(self._group.remove())
        if self._bridge_dir is not None:
            await asyncio.to_thread(_remove_bridge_dir, self._bridge_dir)

    # -- the persistent shell ----------------------------------------------------------------
    async def _after_shell_exit(self) -> None:
        lost = await self._lost("shell")
        if lost is not None:
            raise lost

    async def _start_shell(self) -> Any:
        from sandboxes.shell import PtyShell

        argv = [self._backend.docker_cli, "exec", "-it", "-w", self.spec.workdir]
        for k, v in self.spec.env.items():
            argv += ["-e", f"{k}={v}"]
        if self.spec.user:
            argv += ["-u", self.spec.user]
        # An empty prompt from the first line on, so no `bash-5.2#` lands on the screen.
        argv += ["-e", "PS1=", "-e", "PS2="]
        argv += [self.container_id, "bash", "--noprofile", "--norc", "-i"]
        shell = PtyShell(
            argv,
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.max_output_bytes,
        )
        try:
            await shell.start()
        except SandboxLostError as exc:
            lost = await self._lost("shell start")
            raise (lost or exc) from exc
        return shell

    async def _run_helper(self, script: str) -> str:
        _code, out = await self._raw_exec(["sh", "-c", script])
        return out.decode()

    async def _shell_error(self, exc: SandboxLostError) -> SandboxLostError:
        return await self._lost("shell") or exc

    # -- files -------------------------------------------------------------------------------
    async def snapshot(self) -> str:
        """`docker commit` of this container (paused for it) into a labelled image, which
        sandboxes of a spec naming it start from (`SandboxSpec.snapshot`)."""
        await self._check_running("snapshot")
        tag = f"{self.id}-{uuid.uuid4().hex[:6]}"
        labels = self._backend.labels_for(self.spec)
        labels.update({LABEL_SNAPSHOT_OF: self.id, LABEL_BRIDGE_DIR: ""})
        await asyncio.to_thread(
            self._api.commit,
            self.container_id,
            repository=GROUP_SNAPSHOT_REPO,
            tag=tag,
            conf={"Labels": labels},
        )
        return f"{GROUP_SNAPSHOT_REPO}:{tag}"

    async def _put_archive(self, parent: str, data: Any) -> None:
        """put_archive into `parent`, creating it when missing; lost container -> error."""
        import docker.errors

        def put() -> None:
            if hasattr(data, "seek"):
                data.seek(0)
            self._api.put_archive(self.container_id, parent, data)

        try:
            await asyncio.to_thread(put)
            return
        except docker.errors.NotFound as exc:
            lost = await self._lost("write")
            if lost is not None:
                raise lost from exc
        code, out = await self._raw_exec(["mkdir", "-p", parent])
        if code != 0:
            raise SandboxPathError(
                f"cannot create directory {parent} in sandbox {self.id}: {out.decode(errors='replace')}"
            )
        try:
            await asyncio.to_thread(put)
        except docker.errors.NotFound as exc:
            # `mkdir -p` worked but Docker cannot resolve the directory in the container's
            # filesystem (e.g. a symlink into /proc): the agent's path, not a server fault.
            raise SandboxPathError(
                f"cannot write into {parent} in sandbox {self.id}: expected a directory of the "
                f"container's filesystem, Docker found none ({exc.explanation})"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"writing into {parent} in sandbox {self.id} failed: {exc}") from exc

    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        await self._check_running("write")
        p = self._path(path)
        if p == "/":
            raise SandboxPathError("expected a file path, got the root directory")
        data = content.encode() if isinstance(content, str) else bytes(content)
        await self._put_archive(posixpath.dirname(p), one_file_tar(p, data, mode))

    async def _stat(self, path: str) -> tuple[str, dict[str, Any]]:
        """Follow symlinks (Docker resolves them inside the container's root, so a link can
        never reach the host) and return (resolved path, stat) or raise not-found/lost."""
        import docker.errors

        current = path
        for _ in range(16):
            try:
                st = await asyncio.to_thread(
                    self._api.get_archive, self.container_id, current, 65536
                )
            except docker.errors.NotFound as exc:
                lost = await self._lost("read")
                if lost is not None:
                    raise lost from exc
                raise SandboxFileNotFoundError(
                    f"no such file or directory in sandbox {self.id}: {path}"
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
        await self._check_running("read")
        p = self._path(path)
        resolved, info = await self._stat(p)
        if int(info.get("mode", 0)) & _GO_MODE_DIR:
            raise SandboxPathError(f"expected a file, {p} is a directory in sandbox {self.id}")

        def fetch() -> bytes:
            chunks, _ = self._api.get_archive(self.container_id, resolved, 65536)
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
        await self._check_running("upload")
        p = self._path(dst)
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
            await self._put_archive(posixpath.dirname(p), tmp)
        finally:
            tmp.close()

    async def download(self, src: str, dst: Path) -> None:
        await self._check_running("download")
        p = self._path(src)
        resolved, _info = await self._stat(p)
        dst = Path(dst)

        def fetch() -> None:
            chunks, _ = self._api.get_archive(self.container_id, resolved, 65536)
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

"""`DockerSandbox`: one container, a sandbox composed of parts that each hold the same
`core.Container` handle: its commands (`exec_kill.ContainerExec`), files
(`files.ContainerFiles`), file changes (`changes.ContainerChanges`) and private verifier
(`verifier.PrivateVerifier`). Here: the sandbox's network switches, its persistent shell
(`docker exec -it ... bash`, started lazily), its lifecycle and snapshot, and the checks (open,
running) before a part is asked."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandgym.sandboxes.base import SandboxCapabilities
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES
from sandgym.sandboxes.docker.bridge import _remove_bridge_dir
from sandgym.sandboxes.docker.changes import ContainerChanges
from sandgym.sandboxes.docker.client import DockerEngine
from sandgym.sandboxes.docker.companions import service_usage
from sandgym.sandboxes.docker.confine import Confinement
from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.docker.exec_kill import ContainerExec
from sandgym.sandboxes.docker.files import ContainerFiles
from sandgym.sandboxes.docker.names import GROUP_SNAPSHOT_REPO, LABEL_BRIDGE_DIR, LABEL_SNAPSHOT_OF
from sandgym.sandboxes.docker.verifier import PrivateVerifier
from sandgym.sandboxes.egress import EgressProxy
from sandgym.sandboxes.errors import NetworkPolicyUnsupportedError, SandboxLostError
from sandgym.sandboxes.lazy_shell import ShellSandbox
from sandgym.sandboxes.lifetime import write_deadline_file
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.sandboxes.shell import PtyShell
from sandgym.sandboxes.spec import ExecResult, FileChanges, PathChanges, SandboxSpec
from sandgym.sandboxes.usage import SandboxUsage

if TYPE_CHECKING:
    from sandgym.sandboxes.docker.group import DockerGroup


class DockerSandbox(ShellSandbox):
    """One container. Create through `DockerBackend.create`."""

    # the image built from the spec (the backend), changes listed by the engine (changes),
    # the verifier in a sibling container (verifier)
    capabilities = SandboxCapabilities(builds_images=True, lists_changes=True, private_exec=True)

    def __init__(
        self,
        spec: SandboxSpec,
        engine: DockerEngine,
        container_id: str,
        sandbox_id: str,
        *,
        confine: Confinement,
        labels: Callable[[], dict[str, str]],
        docker_cli: str = "docker",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        bridge_dir: Path | None = None,
        group: DockerGroup | None = None,
        on_bridge: bool = False,
    ) -> None:
        """`labels`: the labels its containers carry, made afresh for each (the lease's expiry
        moves on); `confine`: the host config its verifier's container gets, as its own did."""
        super().__init__(spec, sandbox_id)
        self.container = Container(engine, container_id, self.id)
        self.max_output_bytes = max_output_bytes  # per stream, exec and shell
        self._docker_cli = docker_cli
        self._labels = labels
        self._bridge_dir = bridge_dir
        self._group = group  # the services beside it (docker.group)
        self._on_bridge = on_bridge  # attached to the engine's bridge network now
        self._proxy: EgressProxy | None = None  # the allowlist's egress proxy
        self._execs = ContainerExec(self.container, spec, self.max_output_bytes)
        self._files = ContainerFiles(self.container, self._execs, spec.workdir)
        self._changes = ContainerChanges(self.container, self._execs, bridge_dir)
        self._verifier = PrivateVerifier(
            self.container,
            spec,
            {**confine.host(spec), **confine.main_container(spec, verifier=True)},
            self._labels,
            self.max_output_bytes,
        )

    @property
    def container_id(self) -> str:
        """The engine's id of this sandbox's container."""
        return self.container.id

    @property
    def bridge_dir(self) -> Path | None:
        """This container's host directory, bind-mounted read-only at `/run/sandgym`."""
        return self._bridge_dir

    async def _check_running(self, what: str) -> None:
        self._check_open()
        await self.container.raise_if_lost(what)

    async def _write_deadline(self, deadline: float) -> None:
        """Into the bridge directory (the container reads it at /run/sandgym/deadline), and
        its `life` subdirectory when services beside it read it (docker.service_life)."""

        if self._bridge_dir is not None:
            await asyncio.to_thread(write_deadline_file, self._bridge_dir, deadline)
        if self._group is not None and self._group.life_dir is not None:  # its services'
            await asyncio.to_thread(write_deadline_file, self._group.life_dir, deadline)

    async def usage(self) -> SandboxUsage:
        """Its container's, with its services' (read now) and its verifier runs' beside."""
        used = await self.container.usage()
        used.companions = [*await service_usage(self._group, self.created_at), *self._verifier.runs]
        return used

    async def is_alive(self) -> bool:
        if self._closed:
            return False
        return await self.container.running()

    # -- commands ----------------------------------------------------------------------------
    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._check_open()
        return await self._execs.exec(cmd, timeout_s, cwd, env, user)

    async def kill_agent_processes(self) -> None:
        self._check_open()
        await self._execs.kill_agent_processes()

    async def exec_private(
        self,
        cmd: list[str],
        stdin: bytes,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        see_processes: bool = True,
    ) -> ExecResult:
        """The verifier in a sibling container of its own (`PrivateVerifier.run`)."""
        self._check_open()
        return await self._verifier.run(cmd, stdin, timeout_s, cwd, env, see_processes)

    # -- changes -----------------------------------------------------------------------------
    async def changes(self) -> FileChanges:
        await self._check_running("changes")
        return await self._changes.changes()

    async def apply_changes(self, changes: FileChanges) -> None:
        await self._check_running("apply changes")
        await self._changes.apply_changes(changes)

    async def changed_paths(self) -> PathChanges:
        await self._check_running("changed paths")
        return await self._changes.changed_paths()

    async def path_fingerprints(self, paths: list[str]) -> dict[str, str | None]:
        await self._check_running("fingerprints")
        return await self._changes.path_fingerprints(paths)

    async def read_links(self, paths: list[str]) -> dict[str, str]:
        await self._check_running("read links")
        return await self._changes.read_links(paths)

    # -- files -------------------------------------------------------------------------------
    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        await self._check_running("write")
        await self._files.write_file(path, content, mode)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        await self._check_running("read")
        return await self._files.read_file(path, max_bytes)

    async def upload(self, src: Path, dst: str) -> None:
        await self._check_running("upload")
        await self._files.upload(src, dst)

    async def download(self, src: str, dst: Path) -> None:
        await self._check_running("download")
        await self._files.download(src, dst)

    # -- network -----------------------------------------------------------------------------
    async def start_network(self, pid: int | None) -> None:
        """The starting policy: off the bridge unless public; the allowlist proxy listening in
        the container's network namespace when some phase needs it."""
        if self._on_bridge and self.network.mode != "public":
            await self._set_bridge(False)
        if self.spec.needs_proxy:
            if not pid or self.container.host_pid != pid:
                raise NetworkPolicyUnsupportedError(
                    f"sandbox {self.id}: an allowlist network needs the server on the Docker "
                    "engine's own host (its proxy listens in the container's network namespace, "
                    "entered through /proc); this server cannot see the container's processes"
                )
            self._proxy = EgressProxy(self.id, self.network)
            await self._proxy.start(f"/proc/{pid}/ns/net")

    async def _set_bridge(self, connected: bool) -> None:
        api = self.container.api
        if connected:
            await asyncio.to_thread(api.connect_container_to_network, self.container.id, "bridge")
        else:
            await asyncio.to_thread(
                api.disconnect_container_from_network, self.container.id, "bridge", force=True
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
        await asyncio.shield(self.container.remove())
        if self._group is not None:
            await asyncio.shield(self._group.remove())
        if self._bridge_dir is not None:
            await asyncio.to_thread(_remove_bridge_dir, self._bridge_dir)

    # -- the persistent shell ----------------------------------------------------------------
    async def _after_shell_exit(self) -> None:
        await self.container.raise_if_lost("shell")

    async def _start_shell(self) -> Any:
        argv = [self._docker_cli, "exec", "-it", "-w", self.spec.workdir]
        for k, v in self.spec.env.items():
            argv += ["-e", f"{k}={v}"]
        if self.spec.user:
            argv += ["-u", self.spec.user]
        # An empty prompt from the first line on, so no `bash-5.2#` lands on the screen.
        argv += ["-e", "PS1=", "-e", "PS2="]
        argv += [self.container.id, "bash", "--noprofile", "--norc", "-i"]
        shell = PtyShell(
            argv,
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.max_output_bytes,
        )
        try:
            await shell.start()
        except SandboxLostError as exc:
            lost = await self.container.lost("shell start")
            raise (lost or exc) from exc
        return shell

    async def _run_helper(self, script: str) -> str:
        _code, out = await self._execs.raw_exec(["sh", "-c", script])
        return out.decode()

    async def _shell_error(self, exc: SandboxLostError) -> SandboxLostError:
        return await self.container.lost("shell") or exc

    # -- snapshot -------------------------------------------------------------------------------
    async def snapshot(self) -> str:
        """`docker commit` of this container (paused for it) into a labelled image, which
        sandboxes of a spec naming it start from (`SandboxSpec.snapshot`)."""
        await self._check_running("snapshot")
        tag = f"{self.id}-{uuid.uuid4().hex[:6]}"
        labels = self._labels()
        labels.update({LABEL_SNAPSHOT_OF: self.id, LABEL_BRIDGE_DIR: ""})
        await asyncio.to_thread(
            self.container.api.commit,
            self.container.id,
            repository=GROUP_SNAPSHOT_REPO,
            tag=tag,
            conf={"Labels": labels},
        )
        return f"{GROUP_SNAPSHOT_REPO}:{tag}"

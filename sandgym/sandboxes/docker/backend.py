"""`DockerBackend`: creating a sandbox's container with its confinement (its own pid-1 init,
`MAIN_INIT`, which starts the image's ENTRYPOINT, or the task compose file's main service
`entrypoint:`/`command:`, as Harbor would, `exec_kill.image_argv`; or Docker's for verifier and
service containers; the reduced capabilities, `no-new-privileges`, the spec's limits), its
bridge directory, network and services. The
backend is composed around one engine connection (`client.DockerEngine`): its images
(`images.ImageStore`), the storage quota (`quota.StorageQuota`), the containers' host config
(`confine.Confinement`) and reaping (`reaping.DockerReaper`) are parts it holds, each given that
engine; a sandbox and its service group get the engine and the parts they use, not the backend."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path
from typing import Any

from sandgym.sandboxes.base import SandboxBackend
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES
from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.docker.bridge import (
    _make_bridge_dir,
    _remove_bridge_dir,
    resolve_bridge_root,
)
from sandgym.sandboxes.docker.client import DockerEngine
from sandgym.sandboxes.docker.confine import Confinement
from sandgym.sandboxes.docker.exec_kill import entrypoint_exit, image_argv, main_entrypoint
from sandgym.sandboxes.docker.group import DockerGroup, wait_docker_health
from sandgym.sandboxes.docker.image_config import needs_image_config, spec_over_image
from sandgym.sandboxes.docker.images import ImageStore
from sandgym.sandboxes.docker.names import BRIDGE_MOUNT, DEFAULT_IMAGE, LABEL_BRIDGE_DIR
from sandgym.sandboxes.docker.quota import StorageQuota
from sandgym.sandboxes.docker.reaping import DockerReaper
from sandgym.sandboxes.docker.sandbox import DockerSandbox
from sandgym.sandboxes.docker.service_life import LIFE_SUBDIR, give_static_bash
from sandgym.sandboxes.egress import proxy_env
from sandgym.sandboxes.errors import SandboxCreateError
from sandgym.sandboxes.health import ensure_healthy
from sandgym.sandboxes.lifetime import first_deadline, write_deadline_file
from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)

#: how long creation watches a sandbox's image ENTRYPOINT for an early end (`_check_entrypoint`)
ENTRYPOINT_SETTLE_S = 0.5


class DockerBackend(SandboxBackend):
    """Sandboxes as Docker containers (see `sandgym.sandboxes.docker` for the isolation settings)."""

    name = "docker"
    #: the engine's own `docker run -d` was measured at its bound with 8 at once here
    #: (host_scale); 4 at once held sandgym's creation rate to about 0.65 of it
    default_concurrent_creates = 8

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 6 * 3600,
        default_image: str = DEFAULT_IMAGE,
        runtime: str | None = None,
        docker_cli: str = "docker",
        client_timeout_s: float = 600.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        bridge_root: str | Path | None = None,
        group_fork: str = "changes",
    ) -> None:
        super().__init__(owner_id, lease_s)
        if group_fork not in ("changes", "snapshot"):
            raise ValueError(
                f"docker backend option group_fork: expected 'changes' or 'snapshot', "
                f"got {group_fork!r}"
            )
        #: how a group's members copy member 0 (`sandgym.sandboxes.docker.changes`): its changed files
        #: applied to sandboxes made meanwhile, or containers started from its `docker commit`
        self.forks_by_changes = group_fork == "changes"
        self.max_output_bytes = max_output_bytes
        self.bridge_root = resolve_bridge_root(bridge_root)
        self.default_image = default_image
        self.runtime = runtime
        self.docker_cli = docker_cli
        self.client_timeout_s = client_timeout_s
        #: the one engine connection every part of the backend and its sandboxes use
        self.engine = DockerEngine(client_timeout_s)
        self.images = ImageStore(self.engine, default_image)
        self.quota = StorageQuota(self.engine)
        #: the host config of every container of a sandbox, handed to its sandbox and group
        self.confine = Confinement(runtime, self.quota)
        self.reaper = DockerReaper(self.engine, self.owner_id, self.bridge_root, self.images)

    # -- the protocol's members the parts answer ---------------------------------------------
    @property
    def builds(self) -> int:
        """How many images this backend built (the rest were cache hits)."""
        return self.images.builds

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless a Docker engine answers."""
        await self.engine.ensure_available()

    async def aclose(self) -> None:
        await self.engine.aclose()

    async def prepare(self, spec: SandboxSpec) -> str:
        return await self.images.prepare(spec)

    async def image_for(self, spec: SandboxSpec) -> str:
        """The image a sandbox of `spec` runs: by name, or built (once per content hash)."""
        return await self.images.image_for(spec)

    async def remove_snapshot(self, snapshot: str) -> None:
        await self.images.remove_snapshot(snapshot)

    async def prune_context_images(self) -> tuple[list[str], list[tuple[str, str]]]:
        """`ImageStore.prune_context_images`."""
        return await self.images.prune_context_images()

    async def managed_containers(self) -> list[dict[str, Any]]:
        """`DockerReaper.managed_containers`."""
        return await self.reaper.managed_containers()

    async def owned_sandbox_ids(self) -> list[str]:
        return await self.reaper.owned_sandbox_ids()

    async def remove_sandbox(self, sandbox_id: str) -> None:
        await self.reaper.remove_sandbox(sandbox_id)

    async def reap_matching(
        self, *, everything: bool = False, owner_id: str | None = None, images: bool = False
    ) -> tuple[list[str], list[tuple[str, str]]]:
        return await self.reaper.reap_matching(
            everything=everything, owner_id=owner_id, images=images
        )

    # -- containers --------------------------------------------------------------------------

    def check_network(self, spec: SandboxSpec) -> None:
        """Every policy, and any switch between them: public is the engine's bridge network
        (attached and detached per phase), the others loopback only, an allowlist with its
        proxy in the container's namespace (which needs the engine's host: checked at create)."""

    def check_services(self, spec: SandboxSpec) -> None:
        """Any group: the services run beside the sandbox (`sandgym.sandboxes.docker.group`)."""

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        import docker.errors

        await self.ensure_available()
        image = spec.snapshot or await self.image_for(spec)
        labels = await asyncio.to_thread(self.labels_for, spec)
        # the image's own Env, WorkingDir and ENTRYPOINT are the truth here, the task's own env
        # over them
        run_spec = spec
        config = await asyncio.to_thread(self.images.config, image)
        entry_argv = image_argv(
            config,
            snapshot=spec.snapshot is not None,
            entrypoint=spec.main_entrypoint,
            command=spec.main_command,
        )
        if needs_image_config(spec):
            run_spec = spec_over_image(
                spec, config, between=proxy_env() if spec.needs_proxy else None
            )
        sandbox_id = "sg-" + uuid.uuid4().hex[:12]
        bridge_dir = self.bridge_root / sandbox_id
        labels[LABEL_BRIDGE_DIR] = str(bridge_dir)
        image_mb = 0
        if spec.storage_mb and self.quota.supported is not False:
            image_mb = await asyncio.to_thread(self.quota.image_mb, image)
        self.check_network(spec)
        group = (
            DockerGroup(self.engine, self.images, self.confine, spec, sandbox_id, labels)
            if spec.services
            else None
        )
        host: dict[str, Any] = dict(
            # A sandbox that is public in some phase starts on the bridge and is disconnected
            # from it for its restricted phases (a container made with `none` can never join
            # a network); one that never is public has loopback only, from the start. One
            # with services is on its group's network in every phase (docker.group).
            network_mode=group.network
            if group is not None
            else ("bridge" if spec.ever_public else "none"),
            binds={str(bridge_dir): {"bind": BRIDGE_MOUNT, "mode": "ro"}},
            **self.confine.host(spec, image_mb, docker_init=False),
            **self.confine.main_container(spec),
        )
        api = self.engine.api
        deadline = first_deadline()  # the pool's: a sandbox nobody will refresh gets none
        if group is not None and deadline is not None:  # its services end by it too
            group.life_dir = bridge_dir / LIFE_SUBDIR
        pids: dict[str, int] = {}
        has_health: set[str] = set()  # containers whose image has a HEALTHCHECK

        def create_and_start() -> str:
            # Low-level calls: create + start (+ one inspect, for the fast liveness check).
            _make_bridge_dir(bridge_dir)
            if deadline is not None:  # read by the container's helper from its first second
                write_deadline_file(bridge_dir, deadline)
            extra = group.main_create_kwargs() if group is not None else {}
            resp = api.create_container(
                image,
                entrypoint=main_entrypoint(entry_argv),  # pid 1 starts the main process
                command=[],
                name=sandbox_id,
                hostname=sandbox_id,
                labels=labels,
                environment={**(proxy_env() if spec.needs_proxy else {}), **run_spec.env},
                working_dir=run_spec.workdir,  # Docker creates it when missing
                host_config=api.create_host_config(**host),
                **extra,
            )
            if group is not None and spec.ever_public:
                api.connect_container_to_network(resp["Id"], "bridge")
            if deadline is not None:  # a bash-less image: pid 1 keeps it with the host's bash
                give_static_bash(api, resp["Id"])
            api.start(resp["Id"])
            container_id: str = resp["Id"]
            try:
                state = api.inspect_container(container_id)["State"]
                pids[container_id] = int(state["Pid"])
                if state.get("Health") is not None:
                    has_health.add(container_id)
            except Exception as exc:  # liveness then asks the engine (slower), no allowlist
                tolerate("docker.create_inspect", exc, log, logging.WARNING)
            return container_id

        try:
            if group is not None:
                if group.life_dir is not None and deadline is not None:  # before they start
                    await asyncio.to_thread(write_deadline_file, group.life_dir, deadline)
                await group.start()
            try:
                container_id = await asyncio.to_thread(create_and_start)
            except docker.errors.APIError as exc:
                await self.engine.remove_container(sandbox_id)
                if "storage_opt" in host and "qgroup" in str(exc).lower():
                    # btrfs: the image alone already holds more than the quota allows
                    raise SandboxCreateError(
                        f"docker could not start {image}: its storage quota "
                        f"({host['storage_opt']['size']}B, storage_mb={spec.storage_mb} plus "
                        f"{image_mb} MiB for the image) is below what the image itself holds "
                        f"on this btrfs engine; raise storage_mb ({exc})"
                    ) from exc
                if "storage_opt" not in host or "storage" not in str(exc).lower():
                    raise SandboxCreateError(f"docker could not start {image}: {exc}") from exc
                # Only the btrfs driver and overlay2 on xfs with pquota (and a few others)
                # support a size limit.
                self.quota.supported = False
                log.warning(
                    "docker: storage bound in force: a per-file cap (RLIMIT_FSIZE) at storage_mb "
                    "only; this engine (storage driver %r) refuses a total quota (%s), so many "
                    "files can add up past storage_mb (scripts/setup.sh: "
                    "SANDGYM_DOCKER_STORAGE=btrfs-quota makes an engine that has one)",
                    self.quota.known_driver,
                    exc,
                )
                host.pop("storage_opt")
                try:
                    container_id = await asyncio.to_thread(create_and_start)
                except docker.errors.APIError as exc2:
                    await self.engine.remove_container(sandbox_id)
                    raise SandboxCreateError(f"docker could not start {image}: {exc2}") from exc2
        except BaseException:
            # Cancelled or failed mid-create: the container may exist already; do not leak it.
            await asyncio.shield(self.engine.remove_container(sandbox_id))
            if group is not None:
                await asyncio.shield(group.remove())
            await asyncio.shield(asyncio.to_thread(_remove_bridge_dir, bridge_dir))
            raise
        if "storage_opt" in host and self.quota.supported is None:
            self.quota.supported = True
            log.info(
                "docker: storage bound in force: a total quota per sandbox (`--storage-opt "
                "size`, storage driver %r: %s) and a per-file cap at storage_mb",
                self.quota.known_driver,
                "image + storage_mb, a btrfs qgroup"
                if self.quota.counts_image()
                else "storage_mb of the sandbox's own writes",
            )
        sb = DockerSandbox(
            run_spec,
            self.engine,
            container_id,
            sandbox_id,
            confine=self.confine,
            labels=lambda: self.labels_for(spec),
            docker_cli=self.docker_cli,
            max_output_bytes=self.max_output_bytes,
            bridge_dir=bridge_dir,
            group=group,
            on_bridge=spec.ever_public,
        )
        sb.deadline = deadline
        sb.container.watch_host_pid(pids.get(container_id))
        try:
            await sb.start_network(pids.get(container_id))
            if container_id in has_health:  # the image's HEALTHCHECK: Docker's own status
                await wait_docker_health(api, container_id, f"sandbox {sandbox_id}")
            if entry_argv:
                await self._check_entrypoint(container_id, image, entry_argv)
        except BaseException:
            await asyncio.shield(sb.close())
            raise
        await ensure_healthy(sb)  # spec.healthcheck (Harbor's), run inside; closes on failure
        return sb

    async def _check_entrypoint(self, container_id: str, image: str, argv: list[str]) -> None:
        """Refuse a sandbox whose main process (the image's ENTRYPOINT, or the task compose
        file's main `entrypoint:`/`command:`: `image_argv`) ends within ENTRYPOINT_SETTLE_S of the
        end of its creation (pid 1 notices an end within 0.2 s); under Harbor its container would
        have exited, and `docker compose up --wait` failed or every later exec. One that ends
        later is only logged by pid 1 (the container's log), and the sandbox goes on."""
        loop = asyncio.get_running_loop()
        until = loop.time() + ENTRYPOINT_SETTLE_S
        while (
            status := await asyncio.to_thread(entrypoint_exit, self.engine.api, container_id)
        ) is None:
            if loop.time() >= until:
                return
            await asyncio.sleep(0.1)
        logs = b""
        with contextlib.suppress(Exception):
            logs = await asyncio.to_thread(self.engine.api.logs, container_id, tail=20)
        raise SandboxCreateError(
            f"docker: the main process of {image} ({argv!r}: the image's ENTRYPOINT given "
            f"Harbor's `sh -c 'sleep infinity'` as its arguments, to `exec \"$@\"`, or the task "
            f"compose file's main entrypoint/command) was expected to keep running, found it "
            f"exited with status {status} before the sandbox was ready; its log: "
            f"{logs.decode(errors='replace').strip()[-2000:]!r}"
        )

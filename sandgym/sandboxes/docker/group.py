"""Multi-container sandboxes on the docker backend: the services beside a sandbox's own container.

A sandbox whose spec has `services` (a compose file's other services: databases, web servers,
DNS) is a *group*: a user-defined bridge network of its own, `<sandbox id>-net`, created
`internal` (no route out of the machine), one container per service on it, `<sandbox id>-<name>`,
answering to its service name (and its aliases), and the sandbox's own container joined to it
under `spec.service_name` (`main`; Terminal-Bench's `client`). The main container stays on the
group network in every phase, so the services stay reachable by name when the agent's phase
has no network; the engine's default `bridge` (attached and detached per phase by
`DockerSandbox._apply_network`) is the only way out. A service gets the `bridge` too only when
the sandbox's environment phase is public, attached just after it starts, so that the group's
network is its first interface (`eth0`), as compose's network is.

Images: each service's image is found by name in the local engine (no registry is used) or
built from its build context through `ImageStore.image_for`, the same content-addressed
cache (`sandgym/ctx:<hash>`) task images use.

Addresses: the engine addresses the network, unless the spec fixes a `subnet` (compose
`ipam`); then the network is made on it, and the main container (`spec.ipv4_address`) and each
service (`ServiceSpec.ipv4_address`) get their fixed addresses there. A subnet belongs to one
network of the engine at a time: a second group on it is refused (`subnet_in_use`).

Start: services come up in dependency order (`depends_on`: started, healthy, or completed
successfully); the group is ready when every service with a healthcheck (its compose
healthcheck, handed to Docker, or its image's HEALTHCHECK) reports healthy, as `docker compose
up --wait` does. A service that turns unhealthy, or never gets healthy in the time its
healthcheck allows, is a `SandboxHealthcheckError` carrying Docker's last probe output.

Hard lifetime: when the sandbox has a deadline (`life_dir`), every service ends by that deadline
with no server running: sandgym's deadline keeper is its pid 1 (an image with /bin/bash), else a
watcher under Docker's init (`sandgym.sandboxes.docker.service_life`).

Labels: the network and every service container carry the sandbox's labels (owner, owner pid,
lease) plus `sandgym.group_of=<sandbox id>`, so closing the sandbox, the pool's sweep
(`DockerBackend.remove_sandbox`) and the reaper (a restarted server's `reap_on_start`,
`sandgym reap`) remove the whole group with its main container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.createlimit import take_token
from sandgym.sandboxes.docker.names import LABEL_BRIDGE_DIR
from sandgym.sandboxes.docker.service_life import (
    DeadlineForm,
    has_bash,
    has_shell,
    run_plain,
    run_with_deadline,
    static_bash_tar,
    usable_static_bash,
)
from sandgym.sandboxes.errors import SandboxCreateError, SandboxHealthcheckError
from sandgym.sandboxes.labels import LABEL_MANAGED
from sandgym.sandboxes.services import ServiceSpec, start_order
from sandgym.sandboxes.spec import SandboxSpec

if TYPE_CHECKING:
    from pathlib import Path

    from sandgym.sandboxes.docker.client import DockerEngine
    from sandgym.sandboxes.docker.confine import Confinement
    from sandgym.sandboxes.docker.images import ImageStore

log = logging.getLogger(__name__)

#: on a group's network and service containers: the id of the sandbox the group belongs to
LABEL_GROUP_OF = "sandgym.group_of"
#: on a service container: its service name
LABEL_SERVICE = "sandgym.service"
#: how often Docker's state is polled while waiting for health or an exit
POLL_S = 0.25
#: a wait for a healthcheck without any bound of its own (none configured) ends after this
MAX_HEALTH_WAIT_S = 900.0


def network_name(sandbox_id: str) -> str:
    return f"{sandbox_id}-net"


def service_container_name(sandbox_id: str, service: str) -> str:
    return f"{sandbox_id}-{service}"


def _logs_tail(api: Any, ref: str, lines: int = 20) -> str:
    """(Thread) the last lines a container printed, or '' when they cannot be read."""
    try:
        out = api.logs(ref, stdout=True, stderr=True, tail=lines)
    except Exception as exc:
        tolerate("docker.group_logs", exc, log)
        return ""
    text = out.decode("utf-8", errors="replace") if isinstance(out, bytes) else str(out)
    return text.strip()[-2000:]


def _health_bound_s(config: dict[str, Any] | None) -> float:
    """How long Docker may take to call a container healthy or unhealthy, from its
    `Config.Healthcheck` (nanoseconds; 0 = Docker's default), with a margin."""
    if not config:
        return MAX_HEALTH_WAIT_S

    def s(key: str, default: float) -> float:
        value = config.get(key)
        return float(value) / 1e9 if value else default

    retries = int(config.get("Retries") or 3)
    bound = s("StartPeriod", 0.0) + (s("Interval", 30.0) + s("Timeout", 30.0)) * (retries + 1)
    bound += 30.0
    return min(bound, MAX_HEALTH_WAIT_S)


async def wait_docker_health(
    api: Any, ref: str, what: str, *, required: bool = False, until: float | None = None
) -> None:
    """Wait until Docker reports container `ref` healthy. A container without a healthcheck
    passes at once unless `required` (a `service_healthy` dependency on it), which is an
    error. Unhealthy, stopped, or still starting after its healthcheck's time (or `until`,
    a monotonic deadline): SandboxHealthcheckError with Docker's last probe output."""
    deadline: float | None = until
    while True:
        info = await asyncio.to_thread(api.inspect_container, ref)
        state = info.get("State") or {}
        health = state.get("Health")
        if health is None:
            if required:
                raise SandboxCreateError(
                    f"{what}: expected a healthcheck to wait for (a dependency asks for it "
                    "healthy), found none in its compose service or image"
                )
            return
        if deadline is None:
            config = (info.get("Config") or {}).get("Healthcheck")
            deadline = time.monotonic() + _health_bound_s(config)
        status = health.get("Status")
        if status == "healthy":
            return
        probes = health.get("Log") or []
        last = probes[-1] if probes else {}
        output = str(last.get("Output") or "").strip()[-2000:]
        test = ((info.get("Config") or {}).get("Healthcheck") or {}).get("Test")
        if status == "unhealthy":
            raise SandboxHealthcheckError(
                f"{what}: Docker reports it unhealthy after {health.get('FailingStreak')} "
                f"failed probes of {test}; last probe: exit code {last.get('ExitCode')}, "
                f"output: {output or '(none)'}",
                output=output,
            )
        if state.get("Status") in ("exited", "dead") or not state.get("Running", True):
            logs = await asyncio.to_thread(_logs_tail, api, ref)
            raise SandboxHealthcheckError(
                f"{what}: stopped (exit code {state.get('ExitCode')}) before its healthcheck "
                f"passed; its last output: {logs or '(none)'}",
                output=logs,
            )
        if time.monotonic() > deadline:
            raise SandboxHealthcheckError(
                f"{what}: still {status!r} after the time its healthcheck {test} allows; "
                f"last probe output: {output or '(none)'}",
                output=output,
            )
        await asyncio.sleep(POLL_S)


async def wait_exit_ok(api: Any, ref: str, what: str) -> None:
    """Wait until container `ref` exits; SandboxCreateError unless with status 0 (compose's
    `service_completed_successfully`)."""
    while True:
        info = await asyncio.to_thread(api.inspect_container, ref)
        state = info.get("State") or {}
        if state.get("Status") in ("exited", "dead"):
            code = state.get("ExitCode")
            if code == 0:
                return
            logs = await asyncio.to_thread(_logs_tail, api, ref)
            raise SandboxCreateError(
                f"{what}: expected it to complete successfully, it exited with {code}; "
                f"its last output: {logs or '(none)'}"
            )
        await asyncio.sleep(POLL_S)


def _image_present(api: Any, ref: str) -> bool:
    """(Thread) whether the engine holds image `ref`."""
    import docker.errors

    try:
        api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


class DockerGroup:
    """The network and service containers of one sandbox (see the module docstring)."""

    def __init__(
        self,
        engine: DockerEngine,
        images: ImageStore,
        confine: Confinement,
        spec: SandboxSpec,
        sandbox_id: str,
        labels: dict[str, str],
    ) -> None:
        """`images` builds or finds a service's image; `confine`: the host config its services'
        containers get (the sandbox's own limits, but no storage bound)."""

        self.engine = engine
        self.images = images
        self.confine = confine
        self.spec = spec
        self.sandbox_id = sandbox_id
        self.labels = {k: v for k, v in labels.items() if k != LABEL_BRIDGE_DIR}
        self.labels[LABEL_GROUP_OF] = sandbox_id
        self.network = network_name(sandbox_id)
        self.containers: dict[str, str] = {}  # service name -> container id
        #: the host directory holding the sandbox's deadline (set by the backend when the
        #: sandbox has one): the services then end by it (docker.service_life)
        self.life_dir: Path | None = None

    @property
    def _api(self) -> Any:
        return self.engine.api

    # -- the main container's part -------------------------------------------------------------
    def main_create_kwargs(self) -> dict[str, Any]:
        """(Thread) create_container arguments that put the main container on the group
        network under its service name (its host config gets `network_mode=self.network`)."""
        api = self._api
        endpoint = api.create_endpoint_config(
            aliases=[self.spec.service_name], ipv4_address=self.spec.ipv4_address
        )
        return {"networking_config": api.create_networking_config({self.network: endpoint})}

    # -- start -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Network, images, then every service in dependency order; returns when every
        service with a healthcheck is healthy. On failure the caller removes the group."""
        services = start_order(self.spec.services)
        images = await asyncio.gather(*(self._image(s) for s in services))
        image_of = {s.name: img for s, img in zip(services, images, strict=True)}
        await asyncio.to_thread(self._create_network)
        up: dict[str, asyncio.Task[None]] = {}
        waits: dict[tuple[str, str], asyncio.Task[None]] = {}

        def condition(name: str, cond: str) -> asyncio.Task[None]:
            key = (name, cond)
            if key not in waits:
                waits[key] = asyncio.ensure_future(self._condition(up[name], name, cond))
            return waits[key]

        async def bring_up(svc: ServiceSpec) -> None:
            for dep, cond in svc.depends_on.items():
                await condition(dep, cond)
            # a container of its own: a token of the creation rate (the cap's slot is the
            # sandbox's creation's, which this runs inside: sandgym.sandboxes.createlimit)
            await take_token("docker")
            await asyncio.to_thread(self._create_and_start, svc, image_of[svc.name])

        for svc in services:
            up[svc.name] = asyncio.ensure_future(bring_up(svc))
        try:
            await asyncio.gather(*up.values())
            # ready: every service with a healthcheck healthy (compose `up --wait`)
            await asyncio.gather(*(condition(s.name, "ready") for s in services))
        finally:
            pending = [t for t in (*up.values(), *waits.values()) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            for t in (*up.values(), *waits.values()):  # no "exception never retrieved"
                if t.done() and not t.cancelled():
                    t.exception()

    async def _image(self, svc: ServiceSpec) -> str:
        """The service's image: by name from the local engine, or built (cached) from its
        context. A named image the engine lacks is the cause `image_missing` (no registry is
        used: a compose file's `vulhub/minio:...` stays missing, however often it is retried)."""
        if svc.build_context is None and svc.image is None:  # pragma: no cover (validated)
            raise SandboxCreateError(f"service {svc.name!r} has neither image nor build context")
        probe = SandboxSpec(
            image=svc.image or None, build_context=svc.build_context, dockerfile=svc.dockerfile
        )
        try:
            return await self.images.image_for(probe)
        except SandboxCreateError as exc:
            cause = exc.cause
            if svc.build_context is None and not await asyncio.to_thread(
                _image_present, self._api, str(svc.image)
            ):
                cause = "image_missing"
            raise SandboxCreateError(f"service {svc.name!r}: {exc}", cause) from exc

    async def _condition(self, started: asyncio.Task[None], name: str, cond: str) -> None:
        await started
        ref = self.containers[name]
        what = f"service {name!r} of sandbox {self.sandbox_id}"
        if cond == "service_healthy":
            await wait_docker_health(self._api, ref, what, required=True)
        elif cond == "service_completed_successfully":
            await wait_exit_ok(self._api, ref, what)
        elif cond == "ready":
            await wait_docker_health(self._api, ref, what)

    def _create_network(self) -> None:
        """(Thread) the group's private network: internal (no gateway out), labelled; on the
        spec's `subnet` when it fixes one (compose `ipam`). The engine gives a subnet to one
        network at a time: while another group (of this server or another on the engine) holds
        it, this is a `SandboxCreateError` with cause `subnet_in_use`."""
        import docker.types

        ipam = None
        if self.spec.subnet is not None:
            ipam = docker.types.IPAMConfig(
                pool_configs=[docker.types.IPAMPool(subnet=self.spec.subnet)]
            )
        try:
            self._api.create_network(
                self.network,
                driver="bridge",
                internal=True,
                labels=self.labels,
                check_duplicate=True,
                ipam=ipam,
            )
        except Exception as exc:
            text = str(exc)
            if self.spec.subnet is not None and "overlaps" in text:
                raise SandboxCreateError(
                    f"sandbox {self.sandbox_id}: its task fixes its network to subnet "
                    f"{self.spec.subnet}, which another network on this engine holds (one "
                    f"group per fixed subnet at a time): {text}",
                    "subnet_in_use",
                ) from exc
            raise SandboxCreateError(
                f"docker could not create network {self.network} for sandbox "
                f"{self.sandbox_id}: {exc}"
            ) from exc

    def _create_and_start(
        self, svc: ServiceSpec, image: str, form: DeadlineForm = "keeper"
    ) -> None:
        """(Thread) one service container: on the group network under its name and aliases,
        confined like the sandbox (limits, capabilities), on the bridge only when the
        environment is public; when the sandbox has a deadline, started under sandgym's keeper as
        pid 1 (`form` "keeper"); when its image has no /bin/bash, under the keeper run by the
        host's static bash copied in ("static_keeper"), or, where the host has none, under tini
        and the watcher ("watcher"), or, with no /bin/sh either, as written ("none")."""
        import docker.errors

        api = self._api
        name = service_container_name(self.sandbox_id, svc.name)
        limits = self.spec.model_copy(update={"storage_mb": None})
        run = (
            run_plain(svc)
            if self.life_dir is None
            else run_with_deadline(
                svc, api.inspect_image(image).get("Config") or {}, self.life_dir, form
            )
        )
        host = api.create_host_config(
            network_mode=self.network,
            binds=run.binds or None,
            **self.confine.host(limits, docker_init=run.docker_init),
        )
        endpoint = api.create_endpoint_config(
            aliases=[svc.name, *svc.aliases], ipv4_address=svc.ipv4_address
        )
        healthcheck: dict[str, Any] | None = None
        if svc.healthcheck_disabled:
            healthcheck = {"test": ["NONE"]}
        elif svc.healthcheck is not None:
            healthcheck = svc.healthcheck.docker_config()
        try:
            resp = api.create_container(
                image,
                name=name,
                hostname=svc.name,
                labels={**self.labels, LABEL_SERVICE: svc.name},
                environment=dict(svc.env),
                command=run.command,
                entrypoint=run.entrypoint,
                working_dir=svc.workdir,
                user=svc.user,
                healthcheck=healthcheck,
                volumes=list(svc.volumes) or None,  # anonymous: removed with it (v=True)
                host_config=host,
                networking_config=api.create_networking_config({self.network: endpoint}),
            )
            self.containers[svc.name] = resp["Id"]
            fallback = self._fallback(run.form, resp["Id"])
            if fallback is not None:
                if fallback == "none":
                    log.warning(
                        "service %r of sandbox %s: image %s has no /bin/bash and no /bin/sh "
                        "to keep the sandbox's deadline; it runs as written, without one",
                        svc.name,
                        self.sandbox_id,
                        image,
                    )
                api.remove_container(self.containers.pop(svc.name), force=True, v=True)
                self._create_and_start(svc, image, fallback)
                return
            if run.form == "static_keeper":
                host_bash = usable_static_bash()
                if host_bash is None:  # pragma: no cover (removed since _fallback chose it)
                    raise SandboxCreateError(
                        f"service {svc.name!r}: the host's static bash is gone"
                    )
                api.put_archive(resp["Id"], "/", static_bash_tar(host_bash))
            api.start(resp["Id"])
            if self.spec.network.mode == "public":
                # after the start: the engine puts a network with a gateway before an internal
                # one, so a bridge attached before would be eth0, while compose's own network is
                # eth0 there (a service listening on `interface=eth0`, jpillora/dnsmasq's
                # default, would not hear the group); the service has the route out a moment
                # after it starts
                api.connect_container_to_network(resp["Id"], "bridge")
        except docker.errors.APIError as exc:
            raise SandboxCreateError(
                f"docker could not start service {svc.name!r} ({image}) of sandbox "
                f"{self.sandbox_id}: {exc}"
            ) from exc

    def _fallback(self, form: DeadlineForm, container_id: str) -> DeadlineForm | None:
        """(Thread) the weaker form created container `container_id` must be made again with,
        when its image lacks the shell its form runs (/bin/bash for the keeper, /bin/sh for the
        watcher); None when it can start as it is."""
        if form == "keeper" and not has_bash(self._api, container_id):
            if usable_static_bash() is not None:
                return "static_keeper"
            return "watcher" if has_shell(self._api, container_id) else "none"
        if form == "watcher" and not has_shell(self._api, container_id):
            return "none"
        return None

    async def remove(self) -> None:
        """Remove every service container and the network (idempotent)."""
        await asyncio.to_thread(remove_group, self._api, self.sandbox_id)


def remove_group(api: Any, sandbox_id: str, owner: dict[str, str] | None = None) -> list[str]:
    """(Thread) remove the service containers and the network of sandbox `sandbox_id`'s group,
    found by their `sandgym.group_of` label (also ones whose creation's answer was lost), and
    only those whose labels hold every item of `owner` when given. Returns what it removed;
    what is already gone is no error."""
    import docker.errors

    filters = [f"{LABEL_GROUP_OF}={sandbox_id}", *(f"{k}={v}" for k, v in (owner or {}).items())]
    removed: list[str] = []
    for c in api.containers(all=True, filters={"label": filters}):
        try:
            api.remove_container(c["Id"], force=True, v=True)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise
        removed.append((c.get("Names") or [c["Id"]])[0].lstrip("/"))
    for net in api.networks(filters={"label": filters}):
        remove_network(api, net)
        removed.append(str(net.get("Name") or net["Id"]))
    return removed


def remove_network(api: Any, net: dict[str, Any]) -> None:
    """(Thread) remove one group network, first disconnecting any container still on it (a
    main container that is being removed at the same time)."""
    import docker.errors

    for attempt in range(3):
        try:
            api.remove_network(net["Id"])
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if attempt == 2 or "active endpoints" not in str(exc):
                raise
        with contextlib.suppress(Exception):
            info = api.inspect_network(net["Id"])
            for cid in info.get("Containers") or {}:
                with contextlib.suppress(Exception):
                    api.disconnect_container_from_network(cid, net["Id"], force=True)
        time.sleep(0.2)


def owned_group_ids(api: Any, owner_labels: list[str]) -> list[str]:
    """(Thread) sandbox ids of the group networks carrying every label of `owner_labels`."""
    return [
        (n.get("Labels") or {}).get(LABEL_GROUP_OF, "")
        for n in api.networks(filters={"label": [*owner_labels, LABEL_GROUP_OF]})
    ]


def reap_group_networks(
    api: Any, select: Any, removed: list[str], errors: list[tuple[str, str]]
) -> None:
    """(Thread) remove the managed group networks whose labels `select` accepts (the reaper's
    decision; their containers went first)."""

    for net in api.networks(filters={"label": [f"{LABEL_MANAGED}=1", LABEL_GROUP_OF]}):
        if not select(net.get("Labels") or {}):
            continue
        name = str(net.get("Name") or net["Id"])
        try:
            remove_network(api, net)
        except Exception as exc:
            errors.append((name, str(exc)))
        else:
            removed.append(name)
    log.debug("docker reap: group networks done")

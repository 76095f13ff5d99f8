"""Env servers placed by Ray, found through Ray, and balanced by the trainer.

A Ray node that offers the `sandgym` resource (`ray start --resources '{"sandgym": 1}'`) gets one
env server: an `EnvServerActor` pinned to it (NodeAffinitySchedulingStrategy), which runs the
server in a thread of its own process on that node's sandbox backend (and so on that host's
Docker engine). The actor is named `sandgym-envserver-<node id>` in the `sandgym` namespace, so
any driver of the cluster (the trainer, `sandgym cluster list`, an eval job) finds every live
server without a hand-kept URL list.

- `EnvServerFleet` (driver side) places servers on the nodes that offer the resource, and each
  `refresh()` places one on a node that joined (or came back: a restarted node is a new node id)
  and forgets those whose node died. A server's URL uses the node's address as Ray reports it.
- `discover_servers()` lists the servers some other driver placed (`sandgym cluster up`);
  `ray_servers(mode)` is what `sandgym train` and `sandgym eval` start from (off|place|discover).
- `ServerBalancer` is the trainer's bookkeeping: every group goes to the least-loaded healthy
  server that has room for the whole group (its pool and its snapshot live there), using each
  server's capacity answer (`GET /v1/sessions`: `max_sessions` less the episodes others run there);
  a server that stops answering is left out until it answers again.

A node's death kills its server's process: its sandboxes carry that process's pid, so the
server placed on the node that comes back (or `sandgym reap`) removes them at startup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sandgym.client.env_client import http_base
from sandgym.trainer.priority import normal_priority

log = logging.getLogger(__name__)

NAMESPACE = "sandgym"
ACTOR_PREFIX = "sandgym-envserver-"
DEFAULT_RESOURCE = "sandgym"


class ClusterError(RuntimeError):
    """Env servers could not be placed or found (no node offers the resource, startup failed)."""


@dataclass(frozen=True)
class ServerInfo:
    """One env server placed by Ray: where it listens and what it runs on."""

    url: str  # ws://NODE_IP:PORT/v1/env
    http_url: str
    node_id: str
    node_ip: str
    name: str  # the named actor
    pid: int  # the actor's process (its sandboxes' owner pid)
    owner_id: str  # the backend's owner id (labels of its sandboxes)
    backend: str


class EnvServerActor:
    """Ray actor: an env server (`BackgroundServer`) in this node's worker process."""

    def __init__(
        self, settings: dict[str, Any], node_id: str, node_ip: str, name: str = ""
    ) -> None:
        import os

        # lazy: only the Ray actor that runs an env server loads the server (fastapi, uvicorn:
        # +0.19 s CPU, measured); the layer rule's one exception
        from sandgym.server.runner import BackgroundServer
        from sandgym.server.settings import ServerSettings

        logging.basicConfig(level=logging.INFO)
        normal_priority()  # not Ray's nice 15: a busy node must not starve the server
        opts = dict(settings)
        # listen on the node's own address unless told otherwise (0.0.0.0 in containers)
        opts.setdefault("host", node_ip)
        opts.setdefault("port", 0)
        self._srv = BackgroundServer(ServerSettings(**opts)).start()
        advertised = node_ip if opts["host"] in ("0.0.0.0", "::") else opts["host"]
        backend = self._srv.service.backend
        self._info = ServerInfo(
            url=f"ws://{advertised}:{self._srv.port}/v1/env",
            http_url=f"http://{advertised}:{self._srv.port}",
            node_id=node_id,
            node_ip=node_ip,
            name=name,
            pid=os.getpid(),
            owner_id=str(getattr(backend, "owner_id", "")),
            backend=str(getattr(backend, "name", opts.get("backend", ""))),
        )
        log.info("env server %s on node %s at %s", name, node_id[:12], self._info.url)

    def info(self) -> ServerInfo:
        return self._info

    def running(self) -> bool:
        return self._srv.running

    def stop(self) -> bool:
        """Drain: episodes end and the pool destroys its sandboxes, then the server exits."""
        self._srv.stop(timeout_s=60.0)
        return True


def actor_name(node_id: str) -> str:
    return f"{ACTOR_PREFIX}{node_id}"


def sandgym_nodes(resource: str = DEFAULT_RESOURCE) -> list[dict[str, Any]]:
    """The alive Ray nodes that offer `resource`."""
    import ray

    return [
        n
        for n in ray.nodes()
        if n.get("Alive") and float((n.get("Resources") or {}).get(resource, 0)) > 0
    ]


class EnvServerFleet:
    """One env server per Ray node offering `resource`; `refresh()` follows nodes coming and
    going; `stop()` drains and removes them. Servers of a detached fleet outlive this driver
    (`sandgym cluster up --detach`; `sandgym cluster down` removes them)."""

    def __init__(
        self,
        settings: dict[str, Any] | None = None,
        resource: str = DEFAULT_RESOURCE,
        namespace: str = NAMESPACE,
        detached: bool = False,
        startup_timeout_s: float = 180.0,
    ) -> None:
        self.settings = dict(settings or {})
        self.resource = resource
        self.namespace = namespace
        self.detached = detached
        self.startup_timeout_s = startup_timeout_s
        self.servers: dict[str, ServerInfo] = {}  # node id -> server
        self._actors: dict[str, Any] = {}

    def _start_on(self, node: dict[str, Any]) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = node["NodeID"]
        amount = min(1.0, float(node["Resources"][self.resource]))
        name = actor_name(node_id)
        return (
            ray.remote(EnvServerActor)
            .options(
                name=name,
                namespace=self.namespace,
                get_if_exists=True,
                lifetime="detached" if self.detached else None,
                num_cpus=0,  # I/O-bound; the sandboxes' own CPU is the backend's to bound
                resources={self.resource: amount},
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                max_concurrency=8,
                max_restarts=0,
            )
            .remote(self.settings, node_id, node["NodeManagerAddress"], name)
        )

    def refresh(self) -> tuple[list[ServerInfo], list[ServerInfo]]:
        """Place a server on every offering node that has none; forget servers whose node
        died. Returns (started, lost)."""
        import ray

        nodes = {n["NodeID"]: n for n in sandgym_nodes(self.resource)}
        lost = []
        for node_id in [n for n in self.servers if n not in nodes]:
            lost.append(self.servers.pop(node_id))
            actor = self._actors.pop(node_id, None)
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:  # its node is gone; nothing to kill
                    pass
            log.warning("env server on node %s is gone (node died)", node_id[:12])
        pending = {
            node_id: self._start_on(node)
            for node_id, node in nodes.items()
            if node_id not in self.servers
        }
        started = []
        for node_id, actor in pending.items():
            try:
                info = ray.get(actor.info.remote(), timeout=self.startup_timeout_s)
            except Exception as exc:  # the node died meanwhile, or the server failed to start
                log.error("env server on node %s did not start: %r", node_id[:12], exc)
                try:
                    ray.kill(actor)
                except Exception:
                    pass
                continue
            self._actors[node_id] = actor
            self.servers[node_id] = info
            started.append(info)
            log.info("env server up on node %s: %s", node_id[:12], info.url)
        return started, lost

    def start(self) -> list[ServerInfo]:
        """The first placement: at least one server, or ClusterError saying why not."""
        self.refresh()
        if not self.servers:
            raise ClusterError(
                f"no alive Ray node offers the {self.resource!r} resource (start nodes with "
                f"`ray start ... --resources '{{\"{self.resource}\": 1}}'`), or no server started"
            )
        return list(self.servers.values())

    def stop(self, drain_timeout_s: float = 60.0) -> None:
        import ray

        actors = list(self._actors.values())
        refs = [a.stop.remote() for a in actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=drain_timeout_s)
        except Exception as exc:  # the servers are killed below whether they drained or not
            log.warning("env servers did not all drain before being killed: %r", exc)
        for a in actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self._actors.clear()
        self.servers.clear()


def discover_servers(
    namespace: str = NAMESPACE, timeout_s: float = 10.0, skip: set[str] | None = None
) -> list[ServerInfo]:
    """Env servers any driver placed in this cluster (named actors), those that answer; `skip`:
    actor names not to ask (those the caller placed itself)."""
    import ray

    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == namespace
        and str(a.get("name", "")).startswith(ACTOR_PREFIX)
        and a["name"] not in (skip or set())
    ]
    refs: dict[str, Any] = {}
    for name in names:
        try:
            refs[name] = ray.get_actor(name, namespace=namespace).info.remote()
        except ValueError:  # removed meanwhile
            continue
    found = []
    for name, ref in refs.items():
        try:
            found.append(ray.get(ref, timeout=timeout_s))
        except Exception as exc:
            log.warning("env server %s does not answer: %r", name, exc)
    return found


def ray_servers(
    mode: str, resource: str = DEFAULT_RESOURCE, settings: dict[str, Any] | None = None
) -> tuple[EnvServerFleet | None, list[ServerInfo]]:
    """The env servers a driver uses through Ray (`env.ray_servers` of train, `--ray-servers` of
    eval): `off` none; `discover` those other drivers placed; `place` one placed by this driver
    on every node offering `resource` (the fleet, to `stop()` at the end; ClusterError when none
    starts) and those others placed. Ray must be initialised."""
    if mode not in ("off", "place", "discover"):
        raise ValueError(f"ray servers mode {mode!r}: expected off, place or discover")
    if mode == "off":
        return None, []
    fleet = None
    found: list[ServerInfo] = []
    if mode == "place":
        fleet = EnvServerFleet(settings, resource=resource)
        found += fleet.start()
    placed = {i.name for i in found}
    found += discover_servers(timeout_s=5.0, skip=placed)
    return fleet, found


def remove_servers(namespace: str = NAMESPACE, drain_timeout_s: float = 60.0) -> list[str]:
    """Drain and remove every env server placed in the namespace (`sandgym cluster down`)."""
    import ray

    actors: list[tuple[str, Any]] = []
    for a in ray.util.list_named_actors(all_namespaces=True):
        name = str(a.get("name", ""))
        if a.get("namespace") == namespace and name.startswith(ACTOR_PREFIX):
            try:
                actors.append((name, ray.get_actor(name, namespace=namespace)))
            except ValueError:
                continue
    refs = [h.stop.remote() for _, h in actors]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=drain_timeout_s)
    for _, h in actors:
        try:
            ray.kill(h)
        except Exception:
            pass
    return [n for n, _ in actors]


# -- balancing -------------------------------------------------------------------------------


@dataclass
class ServerState:
    """What the trainer knows of one server."""

    url: str
    capacity: int = 0  # episodes it accepts from us (its max_sessions less what others run)
    in_flight: int = 0  # our episodes running there
    healthy: bool = True
    checked_at: float = 0.0
    placed: bool = False  # placed by our fleet (forgotten when its node dies)
    episodes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def probe_sessions(
    url: str, token: str | None = None, timeout_s: float = 2.0
) -> tuple[int, int] | None:
    """`(free, used)` slots as the server answers `GET /v1/sessions`: used = its episodes plus
    the resets holding a slot before their session is listed (`resetting`), free =
    `max_sessions - used`; None when it does not answer (down). A server without that answer (an
    older one) gets its `/healthz` only, and counts as 256 free."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = http_base(url)
    try:
        r = httpx.get(f"{base}/v1/sessions", headers=headers, timeout=timeout_s)
        if r.status_code == 200:
            body = r.json()
            used = int(body["count"]) + int(body.get("resetting", 0))
            return max(0, int(body["max_sessions"]) - used), used
        r = httpx.get(f"{base}/healthz", timeout=timeout_s)
        return (256, 0) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def probe_capacity(url: str, token: str | None = None, timeout_s: float = 2.0) -> int | None:
    """The server's free slots (`probe_sessions`'s first figure), or None when it is down."""
    answer = probe_sessions(url, token, timeout_s)
    return None if answer is None else answer[0]


class ServerBalancer:
    """Least-loaded placement of groups over the known servers, within each one's capacity.

    `choose(n)` returns the healthy server with the lowest load (our episodes there over its
    capacity) that has room for `n` more, or None when none has; `acquire`/`release` count our
    episodes. `poll()` asks every server its capacity (in parallel); a server that does not
    answer is unhealthy until it does."""

    def __init__(
        self,
        token: str | None = None,
        probe: Callable[[str, str | None], int | tuple[int, int] | None] | None = None,
    ) -> None:
        self.token = token
        self._probe: Callable[[str, str | None], int | tuple[int, int] | None] = probe or (
            lambda url, token: probe_sessions(url, token)
        )
        self.servers: dict[str, ServerState] = {}

    def add(self, url: str, placed: bool = False, capacity: int | None = None) -> ServerState:
        s = self.servers.get(url)
        if s is None:
            s = self.servers[url] = ServerState(url=url, placed=placed)
            s.healthy = False  # until its first answer
        if capacity is not None:
            s.capacity, s.healthy, s.checked_at = capacity, True, time.monotonic()
        return s

    def remove(self, url: str) -> None:
        self.servers.pop(url, None)

    def _update(self, url: str, answer: int | tuple[int, int] | None) -> None:
        s = self.servers.get(url)
        if s is None:
            return
        s.checked_at = time.monotonic()
        if answer is None:
            if s.healthy:
                log.warning("env server %s does not answer: no new groups go there", url)
            s.healthy = False
            return
        if not s.healthy:
            log.info("env server %s answers: in use", url)
        s.healthy = True
        free, used = answer if isinstance(answer, tuple) else (answer, None)
        # its free slots now plus ours it already counts = what it holds for us. Ours still in
        # transit (sent, not yet arrived) are in `in_flight` but not in `used`: counting them as
        # held would offer their slots twice and the server would refuse one with `capacity`.
        ours = s.in_flight if used is None else min(s.in_flight, used)
        s.capacity = free + ours

    def poll(self, urls: Iterable[str] | None = None) -> None:
        targets = list(self.servers) if urls is None else [u for u in urls if u in self.servers]
        if not targets:
            return
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            answers = list(pool.map(lambda u: self._probe(u, self.token), targets))
        for url, free in zip(targets, answers, strict=True):
            self._update(url, free)

    def mark_down(self, url: str) -> None:
        self._update(url, None)

    def _load(self, s: ServerState) -> tuple[float, int, str]:
        return (s.in_flight / s.capacity if s.capacity else 1.0, s.in_flight, s.url)

    def choose(self, n: int = 1) -> str | None:
        fits = [
            s for s in self.servers.values() if s.healthy and s.in_flight + max(1, n) <= s.capacity
        ]
        if not fits:
            return None
        return min(fits, key=self._load).url

    def plan(self, groups: int, n: int) -> list[str]:
        """Where the next `groups` groups of `n` would go (for prewarming), as things stand."""
        saved = {u: s.in_flight for u, s in self.servers.items()}
        out = []
        try:
            for _ in range(groups):
                url = self.choose(n)
                if url is None:
                    break
                out.append(url)
                self.servers[url].in_flight += n
        finally:
            for u, v in saved.items():
                self.servers[u].in_flight = v
        return out

    def acquire(self, url: str, n: int = 1) -> None:
        self.add(url).in_flight += n

    def release(self, url: str, n: int = 1) -> None:
        s = self.servers.get(url)
        if s is not None:
            s.in_flight = max(0, s.in_flight - n)
            s.episodes += n

    def healthy_urls(self) -> list[str]:
        return [u for u, s in self.servers.items() if s.healthy]

    def describe(self) -> list[dict[str, Any]]:
        return [
            {
                "url": s.url,
                "healthy": s.healthy,
                "capacity": s.capacity,
                "in_flight": s.in_flight,
                "episodes": s.episodes,
                "placed": s.placed,
            }
            for s in self.servers.values()
        ]

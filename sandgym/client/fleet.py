"""`Fleet`: several env servers behind one address, placed by the client.

Every door takes one address, `SANDGYM_URL` or its own `url`/`server_url` argument, in one of
three forms (`parse_fleet`):

- one server, `http://HOST:PORT` or `ws://HOST:PORT/v1/env` (as before: no probing, no placement);
- a comma-separated list of servers, `http://a:8765,http://b:8765`;
- `ray:auto` or `ray://HEAD:10001`: the servers `sandgym cluster up` placed on that Ray
  cluster (named actors `sandgym-envserver-<node>` in the `sandgym` namespace), resolved once
  when the fleet is made (`resolve_ray`; needs `ray`, imported only then).

Placement (`Fleet.candidates`) runs in the client, over the servers' own HTTP API: when its
picture is older than `poll_interval_s`, the fleet asks every server it does not hold as down
`GET /v1/sessions` (room: `max_sessions` less episodes, resets and sandboxes held),
`GET /v1/sandboxes` and `GET /v1/pool` (which environment fingerprints it keeps ready), in
parallel. A creation goes first to a server whose warm pool holds a ready sandbox of the same
environment (the fingerprint a server reported for an equal request earlier: repeated trials,
GRPO groups), then to one that built that environment before, then to the one with the most room
left; creations the fleet placed since the last poll count against a server's room and its ready
sandboxes. A server that does not answer (refused, reset, timed out, 5xx on `/healthz`) is held
down for a backoff that doubles per failure (1 s to 30 s by default) and asked again after it; a
server that answers again gets work again. Why in the client: a door already holds the client,
the servers already publish what placement needs, and no router process can itself be lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger(__name__)

#: where `sandgym cluster up` names its servers (sandgym.trainer.cluster; a unit test checks
#: the two agree, since the client layer may not import the trainer)
RAY_NAMESPACE = "sandgym"
RAY_ACTOR_PREFIX = "sandgym-envserver-"
#: room assumed for a server that answers `/healthz` but has no `/v1/sessions` (an older one)
UNKNOWN_ROOM = 256


class FleetSpecError(ValueError):
    """A fleet address that is none of the three forms (one URL, a list, `ray:`...)."""


class FleetUnavailableError(ConnectionError):
    """No server of the fleet is up with room: `servers` says what each one answered."""

    def __init__(self, message: str, servers: list[ServerState]) -> None:
        super().__init__(message)
        self.servers = servers


def http_base_of(url: str) -> str:
    """`ws://h:p/v1/env`, `http://h:p/`, `http://h:p` -> `http://h:p`."""
    base = url.strip().rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if base.startswith(ws):
            base = http + base[len(ws) :]
    base = base.removesuffix("/v1/env").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise FleetSpecError(
            f"expected a server URL (http://HOST:PORT or ws://HOST:PORT/v1/env), found {url!r}"
        )
    return base


def ws_url_of(base: str) -> str:
    """`http://h:p` -> `ws://h:p/v1/env` (the episode API of that server)."""
    scheme = "wss://" if base.startswith("https://") else "ws://"
    return scheme + base.split("://", 1)[1] + "/v1/env"


def is_ray_address(spec: str) -> bool:
    return spec.strip().startswith("ray:")


def resolve_ray(address: str) -> list[str]:
    """The URLs of the env servers `sandgym cluster up` placed on the Ray cluster at `address`
    (`ray:auto` = the local cluster, `ray://HEAD:PORT` = Ray's client). Raises FleetSpecError
    when Ray is not installed or the cluster holds no server."""
    try:
        import ray  # lazy: an optional dependency, only for a ray: address
    except ImportError as exc:
        raise FleetSpecError(
            f"expected `ray` installed to resolve the fleet address {address!r}, found none"
        ) from exc
    target = address.strip()
    if not target.startswith("ray://"):  # ray:auto, ray:HOST:PORT (the GCS), ray: = auto
        target = target.removeprefix("ray:") or "auto"
    started = not ray.is_initialized()
    if started:
        ray.init(address=target, namespace=RAY_NAMESPACE, log_to_driver=False)
    try:
        names = [
            str(a["name"])
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("namespace") == RAY_NAMESPACE
            and str(a.get("name", "")).startswith(RAY_ACTOR_PREFIX)
        ]
        urls: list[str] = []
        for name in sorted(names):
            try:
                info: Any = ray.get(
                    ray.get_actor(name, namespace=RAY_NAMESPACE).info.remote(), timeout=10
                )
            except Exception as exc:
                log.warning("fleet: env server %s does not answer Ray: %r", name, exc)
                continue
            urls.append(http_base_of(str(info.url)))
    finally:
        if started:
            ray.shutdown()
    if not urls:
        raise FleetSpecError(
            f"expected env servers placed by `sandgym cluster up` on {address!r} "
            f"(actors {RAY_ACTOR_PREFIX}* in namespace {RAY_NAMESPACE!r}), found none"
        )
    return urls


def parse_fleet(spec: str) -> list[str]:
    """The servers' HTTP bases of a fleet address (one URL, a comma list, or `ray:`...)."""
    text = spec.strip()
    if not text:
        raise FleetSpecError("expected a server URL, a comma-separated list, or ray:ADDRESS")
    if is_ray_address(text):
        return resolve_ray(text)
    urls = [http_base_of(u) for u in text.split(",") if u.strip()]
    if not urls:
        raise FleetSpecError(f"expected at least one server URL in {spec!r}, found none")
    return list(dict.fromkeys(urls))


def request_key(*parts: str | None) -> str:
    """A client-side key of what a creation asks for (equal requests, equal keys)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(b"\0" if p is None else p.encode())
        h.update(b"\1")
    return h.hexdigest()[:24]


_SHARED: dict[tuple[str, str | None], Fleet] = {}
_SHARED_LOCK = threading.Lock()


def shared_fleet(address: str, token: str | None = None) -> Fleet:
    """The process's one `Fleet` of `address` (made on first use): every client and door of the
    process given that address shares its picture (placements, servers held down), so episodes
    and sandboxes made one by one still spread, and a dead server is learnt once."""
    key = (address.strip(), token)
    with _SHARED_LOCK:
        fleet = _SHARED.get(key)
        if fleet is None:
            fleet = _SHARED[key] = Fleet.from_address(address, token)
        return fleet


@dataclass
class ServerState:
    """What the fleet knows of one server."""

    url: str  # http base
    healthy: bool = True  # until a probe or a call says otherwise
    room: int = UNKNOWN_ROOM  # free slots at the last poll
    ready: dict[str, int] = field(default_factory=dict)  # pool key -> ready sandboxes
    checked_at: float = 0.0
    down_until: float = 0.0
    failures: int = 0
    placed_since_poll: int = 0
    taken: dict[str, int] = field(default_factory=dict)  # key -> ready ones we took since poll
    placed: int = 0  # creations placed here in all
    taken_total: dict[str, int] = field(default_factory=dict)  # key -> ready ones taken in all
    last_error: str | None = None


class Fleet:
    """The servers behind one address and where new work goes (see the module doc)."""

    def __init__(
        self,
        urls: list[str],
        token: str | None = None,
        *,
        poll_interval_s: float = 1.0,
        probe_timeout_s: float = 2.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise FleetSpecError("expected at least one server URL, found none")
        self.servers = {u: ServerState(url=u) for u in (http_base_of(x) for x in urls)}
        self.poll_interval_s = poll_interval_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._probe_timeout_s = probe_timeout_s
        self._transport = transport
        #: request key -> the pool key (fingerprint) a server reported for it
        self._fingerprints: dict[str, str] = {}

    @classmethod
    def from_address(cls, spec: str, token: str | None = None, **kw: Any) -> Fleet:
        return cls(parse_fleet(spec), token, **kw)

    @property
    def single(self) -> bool:
        """One server: nothing to place, nothing probed (the behaviour of one URL as before)."""
        return len(self.servers) == 1

    async def aclose(self) -> None:
        """Nothing to release: each poll opens and closes its own HTTP client (so a fleet
        outlives any client that shares it). Kept for symmetry with the clients."""

    # -- health -----------------------------------------------------------------------------------
    def mark_down(self, url: str, reason: str) -> None:
        """A call to `url` failed at the transport: no new work goes there for a backoff."""
        s = self.servers.get(http_base_of(url))
        if s is None:
            return
        if s.healthy:
            log.warning("fleet: env server %s is down (%s): new work goes elsewhere", s.url, reason)
        s.healthy = False
        s.failures += 1
        s.last_error = reason
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (s.failures - 1))
        s.down_until = time.monotonic() + delay

    async def _probe(self, http: httpx.AsyncClient, s: ServerState) -> None:
        # the reply counts at most what was placed before it was asked for: what is placed
        # while it is on its way (a creation sent at once with the poll) still counts after it
        base_placed, base_taken = s.placed, dict(s.taken_total)
        try:
            sessions, sandboxes, pool = await asyncio.gather(
                http.get(f"{s.url}/v1/sessions"),
                http.get(f"{s.url}/v1/sandboxes"),
                http.get(f"{s.url}/v1/pool"),
            )
        except httpx.HTTPError as exc:
            self.mark_down(s.url, f"{type(exc).__name__}: {exc}")
            return
        now = time.monotonic()
        if sessions.status_code >= 500 or pool.status_code >= 500:
            self.mark_down(s.url, f"HTTP {sessions.status_code} from /v1/sessions")
            return
        room = UNKNOWN_ROOM
        if sessions.status_code == 200:
            body = sessions.json()
            held = int(body["count"]) + int(body.get("resetting", 0))
            if sandboxes.status_code == 200:
                held += int(sandboxes.json()["count"])
            room = max(0, int(body["max_sessions"]) - held)
        ready: dict[str, int] = {}
        if pool.status_code == 200:
            for key, k in (pool.json().get("keys") or {}).items():
                ready[str(key)] = int(k.get("ready", 0))
        if not s.healthy:
            log.info("fleet: env server %s answers again: it gets new work", s.url)
        s.healthy, s.failures, s.last_error = True, 0, None
        s.room, s.ready, s.checked_at = room, ready, now
        s.placed_since_poll = max(0, s.placed - base_placed)
        s.taken = {
            fp: n - base_taken.get(fp, 0)
            for fp, n in s.taken_total.items()
            if n - base_taken.get(fp, 0) > 0
        }

    async def refresh(self, force: bool = False) -> None:
        """Ask every server not held down (or whose backoff ended) for its room and pool. No
        lock: a fleet is shared by clients on different event loops, and two polls at once
        only ask twice."""
        now = time.monotonic()
        due = [
            s
            for s in self.servers.values()
            if (s.healthy and (force or now - s.checked_at >= self.poll_interval_s))
            or (not s.healthy and now >= s.down_until)
        ]
        if due:
            async with httpx.AsyncClient(
                headers=self._headers, timeout=self._probe_timeout_s, transport=self._transport
            ) as http:
                await asyncio.gather(*(self._probe(http, s) for s in due))

    # -- placement --------------------------------------------------------------------------------
    def learn(self, key: str, fingerprint: str) -> None:
        """A server made `key`'s request under pool key `fingerprint` (its warm pool keeps it)."""
        self._fingerprints[key] = fingerprint

    def _rank(self, s: ServerState, key: str | None) -> tuple[int, int, int, str]:
        fp = self._fingerprints.get(key) if key else None
        tier = 2
        if fp is not None and fp in s.ready:
            tier = 0 if s.ready[fp] - s.taken.get(fp, 0) > 0 else 1
        return (tier, -(s.room - s.placed_since_poll), s.placed, s.url)

    async def candidates(self, key: str | None = None) -> list[str]:
        """Servers to try for new work of `key`, best first: up, with room, warm before cold,
        most room first. FleetUnavailableError when none is up with room."""
        if self.single:
            return list(self.servers)
        await self.refresh()
        up = [s for s in self.servers.values() if s.healthy and s.room - s.placed_since_poll > 0]
        if not up:
            states = "; ".join(
                f"{s.url}: "
                + (
                    f"up, room {s.room - s.placed_since_poll}"
                    if s.healthy
                    else f"down ({s.last_error})"
                )
                for s in self.servers.values()
            )
            raise FleetUnavailableError(
                f"expected a server of the fleet up with room, found none ({states})",
                list(self.servers.values()),
            )
        return [s.url for s in sorted(up, key=lambda s: self._rank(s, key))]

    def placed(self, url: str, key: str | None = None) -> None:
        """New work of `key` goes to `url`: it counts against its room (and a ready sandbox)
        from now on. Callers mark it before sending, so concurrent placements see each other."""
        s = self.servers[http_base_of(url)]
        s.placed += 1
        s.placed_since_poll += 1
        fp = self._fingerprints.get(key) if key else None
        if fp is not None:
            s.taken[fp] = s.taken.get(fp, 0) + 1
            s.taken_total[fp] = s.taken_total.get(fp, 0) + 1

    def unplace(self, url: str, key: str | None = None) -> None:
        """Work `placed` on `url` did not get there (refused, no answer): take it back."""
        s = self.servers[http_base_of(url)]
        s.placed = max(0, s.placed - 1)
        s.placed_since_poll = max(0, s.placed_since_poll - 1)
        fp = self._fingerprints.get(key) if key else None
        if fp is not None and s.taken.get(fp):
            s.taken[fp] -= 1
        if fp is not None and s.taken_total.get(fp):
            s.taken_total[fp] -= 1

    def describe(self) -> list[dict[str, Any]]:
        """Each server's state (for logs and records)."""
        return [
            {
                "url": s.url,
                "healthy": s.healthy,
                "room": s.room,
                "placed": s.placed,
                "failures": s.failures,
                "last_error": s.last_error,
            }
            for s in self.servers.values()
        ]


__all__ = [
    "Fleet",
    "FleetSpecError",
    "FleetUnavailableError",
    "ServerState",
    "http_base_of",
    "is_ray_address",
    "parse_fleet",
    "request_key",
    "resolve_ray",
    "shared_fleet",
    "ws_url_of",
]

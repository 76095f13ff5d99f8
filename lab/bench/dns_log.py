"""A logging DNS forwarder for `sandgym bench harbor_compat --dns-log`: which host names a task's
sandboxes looked up while a phase ran, and which of them got no address here.

`DnsLog` listens on UDP port 53 of one address the sandboxes can reach (the docker engine's
default bridge gateway, `bridge_gateway()`), forwards every query unchanged to the host's own
resolver (the first `nameserver` of /etc/resolv.conf) and the reply unchanged back, and records
each lookup: the name, its type, the reply's rcode and how many answers it carried. The bench
gives its sandboxes this address as their DNS server (`SandboxSpec.dns`; on a compose group's own
network the engine's embedded DNS forwards outside names to it), so the answers they get are the
ones they would get without it; only the record is new. `mark(phase)` starts a phase; `unanswered()`
gives, per phase, the names looked up there that got no address in any reply (NXDOMAIN, a
refusal, a failure, an empty answer or no reply), in the order first asked. What the task's
image build and its compose services look up reaches the same log from lab/bench/dns_sniff.py (its
`sources`), which reads the engine's bridges.

That is run-time evidence of what a phase tried to reach, not a guess from the task's text: a
name resolved through /etc/hosts or a compose service name never reaches it. Replies too large
for UDP (TC set) are passed on as they are; the TCP retry is not served (the lookup then fails
for the sandbox as it would not elsewhere: none was seen in the runs this was written for).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

#: how long a forwarded query waits for the host resolver's reply
UPSTREAM_TIMEOUT_S = 5.0


class Lookup(BaseModel):
    """One query a sandbox sent, and what the host's resolver answered."""

    at: float = Field(description="time.monotonic() when it arrived")
    phase: str | None = Field(description="the phase marked when it arrived (None: before any)")
    client: str = Field(description="the sandbox address it came from")
    name: str = Field(description="the name looked up, lower case, without a trailing dot")
    qtype: int = Field(description="the query type (1 A, 28 AAAA, ...)")
    rcode: int | None = Field(description="the reply's rcode (None: no reply from the resolver)")
    answers: int = Field(0, description="the reply's answer count")

    @property
    def answered(self) -> bool:
        return self.rcode == 0 and self.answers > 0


def parse_question(msg: bytes) -> tuple[str, int] | None:
    """The first question's (name, type) of a DNS message, or None when it has none or is
    malformed (compression is not used in questions a client sends)."""
    if len(msg) < 12 or struct.unpack("!H", msg[4:6])[0] < 1:
        return None
    labels: list[str] = []
    i = 12
    while True:
        if i >= len(msg):
            return None
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 or i + 1 + n > len(msg):
            return None
        labels.append(msg[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    if i + 2 > len(msg):
        return None
    return ".".join(labels).lower().rstrip("."), struct.unpack("!H", msg[i : i + 2])[0]


def reply_summary(msg: bytes) -> tuple[int, int] | None:
    """(rcode, answer count) of a DNS reply, or None when it is too short to be one."""
    if len(msg) < 12:
        return None
    flags, _, ancount = struct.unpack("!HHH", msg[2:8])
    return flags & 0x000F, ancount


def host_resolver(resolv_conf: Path = Path("/etc/resolv.conf")) -> str:
    """The first `nameserver` of the host's resolv.conf."""
    for line in resolv_conf.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            return parts[1]
    raise RuntimeError(f"no nameserver line in {resolv_conf}: expected one, found none")


def bridge_gateway(docker_cli: str = "docker") -> str:
    """The docker engine's default bridge gateway address (where containers reach the host):
    the bridge network's IPAM gateway, or, where the engine records none (Debian's docker.io
    20.10 on a fresh data root lists only the subnet), the subnet's first host address, which
    is the one the engine gives its bridge then."""
    r = subprocess.run(
        [docker_cli, "network", "inspect", "bridge", "-f", "{{json .IPAM.Config}}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    try:
        configs = json.loads(r.stdout) if r.returncode == 0 else None
    except json.JSONDecodeError:
        configs = None
    for cfg in configs or ():
        if cfg.get("Gateway"):
            return str(cfg["Gateway"])
        if cfg.get("Subnet"):
            net = ipaddress.ip_network(cfg["Subnet"], strict=False)
            if net.version == 4 and net.num_addresses > 2:
                return str(net.network_address + 1)
    raise RuntimeError(
        f"the engine's bridge gateway: expected an IPv4 gateway or subnet from `docker network "
        f"inspect bridge`, found exit {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
    )


class LookupSource(Protocol):
    """Something else that records lookups into a DnsLog's `lookups`."""

    def flush(self) -> None:
        """Add what it has seen so far to the log."""

    def drain(self) -> None:
        """Take in what has arrived so far under the phase marked now (called before a new
        phase is marked, so a lookup read late is not put in the next phase)."""

    def close(self) -> None:
        """Stop recording."""


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: DnsLog) -> None:
        self.owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.owner._transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.ensure_future(self.owner._forward(data, addr))
        self.owner._pending.add(task)
        task.add_done_callback(self.owner._pending.discard)


class DnsLog:
    """The forwarder (see the module docstring). `async with DnsLog(addr, upstream):`."""

    def __init__(self, listen: str, upstream: str, port: int = 53) -> None:
        self.listen, self.upstream, self.port = listen, upstream, port
        self.lookups: list[Lookup] = []
        self.phase: str | None = None
        #: other sources of lookups, flushed into `lookups` before it is read or reset and
        #: closed with the log (lab/bench/dns_sniff.py: the builds' and services' lookups)
        self.sources: list[LookupSource] = []
        self._transport: asyncio.DatagramTransport | None = None
        self._pending: set[asyncio.Future[None]] = set()

    async def __aenter__(self) -> DnsLog:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(
            lambda: _Protocol(self), local_addr=(self.listen, self.port)
        )
        log.info("dns log on %s:%d, forwarding to %s", self.listen, self.port, self.upstream)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for src in self.sources:
            src.close()
        if self._transport is not None:
            self._transport.close()
        for task in list(self._pending):
            task.cancel()

    def mark(self, phase: str | None) -> None:
        """Lookups from now on belong to `phase` (None: to no phase). What the sources have
        received by now still belongs to the phase before."""
        for src in self.sources:
            src.drain()
        self.phase = phase

    def _flush_sources(self) -> None:
        for src in self.sources:
            src.flush()

    def reset(self) -> None:
        """Forget every lookup seen so far (a new attempt starts)."""
        self._flush_sources()
        self.lookups.clear()

    def unanswered(self, phases: list[str]) -> dict[str, list[str]]:
        """Per phase, the names looked up there that got no address in any reply, in the order
        first asked (phases with none are left out)."""
        self._flush_sources()
        out: dict[str, list[str]] = {}
        for phase in phases:
            seen = [lk for lk in self.lookups if lk.phase == phase]
            answered = {lk.name for lk in seen if lk.answered}
            names = list(dict.fromkeys(lk.name for lk in seen if lk.name not in answered))
            if names:
                out[phase] = names
        return out

    async def _forward(self, data: bytes, addr: tuple[str, int]) -> None:
        q = parse_question(data)
        phase, at = self.phase, time.monotonic()
        reply = await asyncio.to_thread(self._ask_upstream, data)
        if q is not None:
            summary = reply_summary(reply) if reply is not None else None
            self.lookups.append(
                Lookup(
                    at=at,
                    phase=phase,
                    client=addr[0],
                    name=q[0],
                    qtype=q[1],
                    rcode=None if summary is None else summary[0],
                    answers=0 if summary is None else summary[1],
                )
            )
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)

    def _ask_upstream(self, data: bytes) -> bytes | None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(UPSTREAM_TIMEOUT_S)
            try:
                s.sendto(data, (self.upstream, 53))
                reply, _ = s.recvfrom(65535)
            except OSError:
                return None
            return reply


class DnsLoggedBackend:
    """A sandbox backend whose sandboxes use `dns_server` as their DNS server unless their spec
    names its own (`SandboxSpec.dns`); everything else is the wrapped backend's."""

    def __init__(self, backend: Any, dns_server: str) -> None:
        self._backend = backend
        self.dns_server = dns_server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def create(self, spec: Any, *args: Any, **kwargs: Any) -> Any:
        if not spec.dns:
            spec = spec.model_copy(update={"dns": (self.dns_server,)})
        return await self._backend.create(spec, *args, **kwargs)

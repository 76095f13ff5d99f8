"""The DNS lookups seen on the docker engine's bridges, for `sandgym bench harbor_compat
--dns-log`: what a task's image build and its compose services looked up, which the logging
forwarder (lab/bench/dns_log.py) never sees, because only the sandboxes are given it as their server.

`BridgeSniffer(dns_log)` opens a packet socket on every bridge the engine made (`docker0` and
its `br-*` networks, scanned again as compose groups add theirs) and reads the IPv4 UDP packets
to and from port 53 that cross them: a build step's or a service's query leaves its container
through its bridge, and the resolver's reply comes back the same way. Each query is paired with
its reply by (client address, client port, DNS id) and recorded in `dns_log.lookups` under the
phase marked when it was seen (`DnsLog.mark`), in the same form as the forwarder's: so
`DnsLog.unanswered(["build", ...])` gives the names a build looked up that got no address here.
Traffic to or from the forwarder's own address is left out (the forwarder records it). A query
that no reply answers is recorded with no rcode when the log is read (`flush`).

It only reads: packets are neither changed nor delayed. It needs CAP_NET_RAW (root) and Linux.
A name resolved from /etc/hosts, or by the engine's embedded DNS for a service name, never
crosses a bridge, so it is not seen; the embedded DNS's forwarded queries for outside names are
(they leave from the container's own address).
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lab.bench.dns_log import Lookup, parse_question, reply_summary

if TYPE_CHECKING:
    from lab.bench.dns_log import DnsLog

log = logging.getLogger(__name__)

ETH_P_IP = 0x0800
#: a tap on every protocol: only such a socket is given the packets a bridge sends (the replies)
ETH_P_ALL = 0x0003
#: how often the bridges are scanned again (a compose group's network appears while it runs)
RESCAN_S = 0.5


def engine_bridges(sys_class_net: Path = Path("/sys/class/net")) -> list[str]:
    """The Linux bridges the docker engine made: `docker0` and its networks' `br-<id>`."""
    return sorted(
        p.name
        for p in sys_class_net.iterdir()
        if (p / "bridge").is_dir() and (p.name == "docker0" or p.name.startswith("br-"))
    )


def udp_datagram(pkt: bytes) -> tuple[str, int, str, int, bytes] | None:
    """(source address, source port, destination address, destination port, payload) of an
    unfragmented IPv4 UDP packet, or None for anything else."""
    if len(pkt) < 20 or pkt[0] >> 4 != 4:
        return None
    ihl = (pkt[0] & 0x0F) * 4
    if pkt[9] != socket.IPPROTO_UDP or ihl < 20 or len(pkt) < ihl + 8:
        return None
    if struct.unpack("!H", pkt[6:8])[0] & 0x3FFF:  # a fragment (more follow, or an offset)
        return None
    sport, dport = struct.unpack("!HH", pkt[ihl : ihl + 4])
    return socket.inet_ntoa(pkt[12:16]), sport, socket.inet_ntoa(pkt[16:20]), dport, pkt[ihl + 8 :]


class DnsPairing:
    """Queries paired with their replies, from the packets seen (no sockets: `feed` them)."""

    def __init__(self, phase_of: Callable[[], str | None], exclude: set[str]) -> None:
        self.phase_of = phase_of
        self.exclude = exclude
        self.done: list[Lookup] = []
        self._open: dict[tuple[str, int, int], Lookup] = {}
        self._lock = threading.Lock()

    def feed(self, pkt: bytes, at: float) -> None:
        """One IPv4 packet as it crossed a bridge."""
        udp = udp_datagram(pkt)
        if udp is None:
            return
        src, sport, dst, dport, msg = udp
        if len(msg) < 12:
            return
        dns_id, flags = struct.unpack("!HH", msg[:4])
        is_reply = bool(flags & 0x8000)
        if dport == 53 and not is_reply and dst not in self.exclude:
            q = parse_question(msg)
            if q is None:
                return
            with self._lock:
                self._open[(src, sport, dns_id)] = Lookup(
                    at=at, phase=self.phase_of(), client=src, name=q[0], qtype=q[1], rcode=None
                )
        elif sport == 53 and is_reply and src not in self.exclude:
            summary = reply_summary(msg)
            with self._lock:
                lk = self._open.pop((dst, dport, dns_id), None)
                if lk is None or summary is None:
                    return
                self.done.append(lk.model_copy(update={"rcode": summary[0], "answers": summary[1]}))

    def flush(self) -> list[Lookup]:
        """The lookups finished so far, and the queries still unanswered (with no rcode);
        both are handed over once."""
        with self._lock:
            out = self.done + list(self._open.values())
            self.done, self._open = [], {}
        return out


class BridgeSniffer:
    """Reads the engine's bridges in a thread while open (`with BridgeSniffer(dns_log):`), and
    adds what it paired to `dns_log.lookups` when `flush()` is called (a `LookupSource` of
    lab/bench/dns_log.py)."""

    def __init__(self, dns_log: DnsLog, bridges: Callable[[], list[str]] = engine_bridges) -> None:
        self.dns_log = dns_log
        self.bridges = bridges
        self.pairing = DnsPairing(lambda: dns_log.phase, exclude={dns_log.listen})
        self._socks: dict[str, socket.socket] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reading = threading.Lock()  # one reader of the sockets at a time

    def __enter__(self) -> BridgeSniffer:
        self._rescan()  # the bridges there now are read from the start
        self._thread = threading.Thread(target=self._run, name="dns-sniff", daemon=True)
        self._thread.start()
        log.info("dns sniffer on %s", ", ".join(self._socks) or "no bridge yet")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading and close the sockets."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in self._socks.values():
            s.close()
        self._socks.clear()

    def flush(self) -> None:
        """Move what was seen so far into the log (call it before reading the log)."""
        self.dns_log.lookups.extend(self.pairing.flush())

    def drain(self) -> None:
        """Read every packet queued on the bridges now, under the phase marked now: the thread
        may be behind on a busy machine, and would otherwise pair them under the next phase."""
        with self._reading:
            for s in list(self._socks.values()):
                self._read(s)

    def _read(self, s: socket.socket) -> None:
        while True:
            try:
                pkt, addr = s.recvfrom(65535)
            except (BlockingIOError, OSError):
                return
            if addr[1] == ETH_P_IP:
                self.pairing.feed(pkt, time.monotonic())

    def _rescan(self) -> None:
        names = set(self.bridges())
        for gone in set(self._socks) - names:
            self._socks.pop(gone).close()
        for name in sorted(names - set(self._socks)):
            s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
            try:
                s.bind((name, ETH_P_ALL))
            except OSError:  # removed between the scan and the bind
                s.close()
                continue
            s.setblocking(False)
            self._socks[name] = s

    def _run(self) -> None:
        next_scan = time.monotonic() + RESCAN_S
        while not self._stop.is_set():
            socks = list(self._socks.values())
            try:
                ready, _, _ = select.select(socks, [], [], 0.1) if socks else ([], [], [])
            except (OSError, ValueError):  # a socket closed by a rescan
                ready = []
            if not socks:
                self._stop.wait(0.1)
            with self._reading:
                for s in ready:
                    self._read(s)
            if time.monotonic() >= next_scan:
                with self._reading:
                    self._rescan()
                next_scan = time.monotonic() + RESCAN_S

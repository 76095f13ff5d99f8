"""The lookups read off the engine's bridges (lab/bench/dns_sniff.py) and what they add to the DNS log
of `sandgym bench harbor_compat --dns-log`: each query paired with its own reply, the forwarder's
traffic left to the forwarder, the phase that was marked when the query crossed, and a failed
image build whose lookup got no address as evidence (`dns_evidence`, the build phase)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

from lab.bench.compat_outcome import decide, dns_evidence
from lab.bench.dns_log import DnsLog, Lookup
from lab.bench.dns_sniff import ETH_P_IP, BridgeSniffer, DnsPairing, engine_bridges, udp_datagram


def _dns(dns_id: int, flags: int, name: str, answers: int = 0) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", dns_id, flags, 1, answers, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", 1, 1)
    )


def _ip_udp(src: str, sport: int, dst: str, dport: int, payload: bytes, frag: int = 0) -> bytes:
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    return (
        struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(udp), 1, frag, 64, 17, 0)
        + socket.inet_aton(src)
        + socket.inet_aton(dst)
        + udp
    )


def _query(src: str, sport: int, dns_id: int, name: str, dst: str = "10.0.0.53") -> bytes:
    return _ip_udp(src, sport, dst, 53, _dns(dns_id, 0x0100, name))


def _reply(
    dst: str, dport: int, dns_id: int, name: str, rcode: int, answers: int, src: str = "10.0.0.53"
) -> bytes:
    return _ip_udp(src, 53, dst, dport, _dns(dns_id, 0x8180 | rcode, name, answers))


def test_an_ipv4_udp_datagram_is_read_and_anything_else_is_not() -> None:
    pkt = _query("172.17.0.2", 40000, 7, "pypi.org")
    src, sport, dst, dport, payload = udp_datagram(pkt)  # type: ignore[misc]
    assert (src, sport, dst, dport) == ("172.17.0.2", 40000, "10.0.0.53", 53)
    assert payload == _dns(7, 0x0100, "pypi.org")
    tcp = bytearray(pkt)
    tcp[9] = 6
    assert udp_datagram(bytes(tcp)) is None
    assert udp_datagram(b"\x60" + pkt[1:]) is None  # IPv6
    assert udp_datagram(pkt[:25]) is None  # cut inside the UDP header
    frag = _ip_udp("172.17.0.2", 40000, "10.0.0.53", 53, b"x" * 12, frag=0x2000)
    assert udp_datagram(frag) is None  # more fragments follow


def test_each_query_is_paired_with_its_own_reply_under_the_phase_it_crossed_in() -> None:
    phase = {"now": "build"}
    pairing = DnsPairing(lambda: phase["now"], exclude={"172.17.0.1"})
    pairing.feed(_query("172.17.0.2", 40000, 7, "github.com"), at=1.0)
    pairing.feed(_query("172.17.0.2", 40001, 8, "deb.debian.org"), at=1.5)
    pairing.feed(_query("172.17.0.3", 40000, 7, "huggingface.co"), at=1.6)  # same port and id
    phase["now"] = "oracle"  # the replies come after the next phase is marked
    pairing.feed(_reply("172.17.0.2", 40001, 8, "deb.debian.org", 0, 1), at=2.0)
    pairing.feed(_reply("172.17.0.2", 40000, 7, "github.com", 3, 0), at=2.1)
    pairing.feed(_reply("172.17.0.2", 40000, 9, "github.com", 0, 1), at=2.2)  # no such query
    # the forwarder's own traffic is the forwarder's to record
    pairing.feed(_query("172.17.0.2", 40002, 10, "pypi.org", dst="172.17.0.1"), at=2.3)
    got = {(lk.client, lk.name): lk for lk in pairing.flush()}
    assert set(got) == {
        ("172.17.0.2", "github.com"),
        ("172.17.0.2", "deb.debian.org"),
        ("172.17.0.3", "huggingface.co"),
    }
    gh = got[("172.17.0.2", "github.com")]
    assert (gh.phase, gh.rcode, gh.answers, gh.at) == ("build", 3, 0, 1.0)
    deb = got[("172.17.0.2", "deb.debian.org")]
    assert (deb.rcode, deb.answers, deb.answered) == (0, 1, True)
    hf = got[("172.17.0.3", "huggingface.co")]
    assert (hf.phase, hf.rcode) == ("build", None)  # never answered
    assert pairing.flush() == []  # handed over once


def test_the_log_takes_a_sources_lookups_when_it_is_read_and_forgets_them_on_reset() -> None:
    log = DnsLog("172.17.0.1", "10.0.0.53")

    class Source:
        def __init__(self) -> None:
            self.pending: list[Lookup] = []
            self.closed = False

        def flush(self) -> None:
            log.lookups.extend(self.pending)
            self.pending = []

        def drain(self) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    src = Source()
    log.sources.append(src)
    src.pending = [
        Lookup(at=0.0, phase="build", client="172.17.0.2", name="github.com", qtype=1, rcode=3)
    ]
    assert log.unanswered(["build", "oracle"]) == {"build": ["github.com"]}
    src.pending = [
        Lookup(at=1.0, phase="build", client="172.17.0.2", name="example.com", qtype=1, rcode=3)
    ]
    log.reset()  # a new attempt: what the source still held is dropped with the rest
    assert log.unanswered(["build"]) == {}


class _QueuedPackets:
    """A bridge's packet socket with packets waiting that its reading thread has not read yet."""

    def __init__(self, packets: list[bytes]) -> None:
        self.packets = packets

    def recvfrom(self, size: int) -> tuple[bytes, tuple[str, int]]:
        if not self.packets:
            raise BlockingIOError
        return self.packets.pop(0), ("docker0", ETH_P_IP)

    def close(self) -> None:
        pass


def test_what_crossed_before_a_new_phase_is_marked_stays_in_the_phase_before() -> None:
    # the build's query and its NXDOMAIN crossed the bridge while "build" was marked; the
    # sniffer's thread, behind on a busy machine, has not read them when "oracle" is marked
    log = DnsLog("172.17.0.1", "10.0.0.53")
    sniffer = BridgeSniffer(log, bridges=lambda: [])  # its thread is never started
    queued = _QueuedPackets([])
    sniffer._socks["docker0"] = queued  # type: ignore[assignment]
    log.sources.append(sniffer)
    log.mark("build")
    queued.packets += [
        _query("172.17.0.2", 40000, 7, "weights.invalid"),
        _reply("172.17.0.2", 40000, 7, "weights.invalid", 3, 0),
    ]
    log.mark("oracle")
    queued.packets.append(_query("172.17.0.2", 40001, 8, "late.invalid"))
    log.mark(None)
    assert log.unanswered(["build", "oracle"]) == {
        "build": ["weights.invalid"],
        "oracle": ["late.invalid"],
    }


def test_only_the_engines_bridges_are_read(tmp_path: Path) -> None:
    for name, bridge in (("docker0", True), ("br-0a1b", True), ("eth0", False), ("virbr0", True)):
        (tmp_path / name).mkdir()
        if bridge:
            (tmp_path / name / "bridge").mkdir()
    (tmp_path / "br-file").mkdir()  # named like one, but no bridge
    assert engine_bridges(tmp_path) == ["br-0a1b", "docker0"]


def _build_line(**extra: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "task_id": "t",
        "env_builds": False,
        "build_error": (
            "SandboxCreateError: building ctx/Dockerfile failed: The command '/bin/sh -c python3 "
            "/fetch.py' returned a non-zero code: 1\n--- build log tail ---\n"
            "urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>"
        ),
        "oracle_reward": None,
        "noop_reward": None,
        "dns_log": True,
        "dns_unanswered": {"build": ["_http._tcp.deb.debian.org", "weights.example.org"]},
        "referenced_unreachable_hosts": {},
    }
    line.update(extra)
    return line


def test_a_failed_builds_unanswered_lookup_and_its_failed_lookup_are_evidence() -> None:
    ev = dns_evidence(_build_line())
    assert ev is not None
    assert (ev.needs, ev.phase) == ("weights.example.org", "build")
    assert ev.file.startswith("the DNS log of the image build")
    out = decide(_build_line(), ["build_network"])
    assert (out.category, out.reason) == ("unreachable_host", "needs_unreachable_host")


def test_a_build_that_succeeded_or_looked_nothing_up_gives_no_build_evidence() -> None:
    assert dns_evidence(_build_line(env_builds=True, build_error=None)) is None
    assert dns_evidence(_build_line(dns_unanswered={"oracle": ["weights.example.org"]})) is None
    assert dns_evidence(_build_line(build_error="no space left on device")) is None
    assert decide(_build_line(dns_unanswered={}), ["build_network"]).category == "failing"

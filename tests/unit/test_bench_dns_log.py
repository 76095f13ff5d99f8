"""The DNS log of `sandgym bench harbor_compat --dns-log` (lab/bench/dns_log.py) and the evidence it
gives (`lab.bench.compat_outcome.dns_evidence`): the wire parsing, which names count as unanswered
per phase, and the rule that a failing episode's unanswered lookup plus a failed lookup in its
output puts the task outside the reachable figures, while either alone does not."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from lab.bench.compat_outcome import decide, dns_evidence
from lab.bench.dns_log import DnsLog, Lookup, bridge_gateway, parse_question, reply_summary


def _query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return (
        struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def test_the_question_and_the_reply_are_read_off_the_wire() -> None:
    assert parse_question(_query("Bootstrap.PyPA.io", 28)) == ("bootstrap.pypa.io", 28)
    assert parse_question(b"\0" * 11) is None  # shorter than a header
    assert parse_question(_query("pypi.org")[:-3]) is None  # cut inside the question
    nx = struct.pack("!HHHHHH", 7, 0x8183, 1, 0, 0, 0)  # a reply, NXDOMAIN (rcode 3)
    ok = struct.pack("!HHHHHH", 7, 0x8180, 1, 2, 0, 0)  # a reply, NOERROR, two answers
    assert (reply_summary(nx), reply_summary(ok), reply_summary(b"x")) == ((3, 0), (0, 2), None)


def _lk(
    phase: str | None, name: str, rcode: int | None, answers: int = 0, qtype: int = 1
) -> Lookup:
    return Lookup(
        at=0.0,
        phase=phase,
        client="172.17.0.9",
        name=name,
        qtype=qtype,
        rcode=rcode,
        answers=answers,
    )


def test_a_name_is_unanswered_in_a_phase_only_if_no_reply_there_gave_an_address() -> None:
    log = DnsLog("127.0.0.1", "127.0.0.1")
    log.lookups = [
        _lk("oracle", "pypi.org", 0, 0, qtype=28),  # no AAAA record ...
        _lk("oracle", "pypi.org", 0, 1),  # ... but an A record: answered
        _lk("oracle", "bootstrap.pypa.io", 3),
        _lk("oracle", "example.com", None),  # no reply at all
        _lk("oracle", "bootstrap.pypa.io", 3, qtype=28),
        _lk("noop", "example.com", 5),
        _lk(None, "outside.example.org", 3),  # between phases: no phase's
    ]
    assert log.unanswered(["oracle", "noop", "build"]) == {
        "oracle": ["bootstrap.pypa.io", "example.com"],
        "noop": ["example.com"],
    }


def _line(**kw: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "task_id": "t",
        "base_image": "python:3.13-slim-bookworm",
        "oracle_reward": 0.0,
        "noop_reward": 0.0,
        "phase_errors": [],
        "oracle_output": "Traceback ...\nurllib.error.URLError: <urlopen error [Errno -3] "
        "Temporary failure in name resolution>\n",
        "dns_log": True,
        "dns_unanswered": {"oracle": ["bootstrap.pypa.io"]},
    }
    entry.update(kw)
    return entry


def test_an_unanswered_lookup_and_a_failed_lookup_in_the_failing_episode_are_evidence() -> None:
    ev = dns_evidence(_line())
    assert ev is not None and (ev.needs, ev.phase) == ("bootstrap.pypa.io", "oracle")
    assert "Temporary failure in name resolution" in ev.output_line
    assert "DNS log of the oracle episode" in ev.file
    out = decide(_line(), ["oracle_below_one"])
    assert (out.category, out.reason) == ("unreachable_host", "needs_unreachable_host")
    # the host the failure line names wins over the first one looked up
    named = _line(
        oracle_verifier_output="curl: (6) Could not resolve host: example.com",
        oracle_output="",
        dns_unanswered={"oracle": ["ntp.ubuntu.com", "example.com"]},
    )
    assert dns_evidence(named).needs == "example.com"  # type: ignore[union-attr]


def test_either_half_alone_or_another_episode_is_no_evidence() -> None:
    assert dns_evidence(_line(oracle_output="AssertionError: 41 != 42")) is None
    assert dns_evidence(_line(dns_unanswered={})) is None
    assert dns_evidence(_line(dns_unanswered={"oracle": ["db", "printer.local"]})) is None
    # the lookup was in the no-op episode, which did not fall short: not the cause
    assert dns_evidence(_line(dns_unanswered={"noop": ["bootstrap.pypa.io"]})) is None
    # a clean oracle: nothing fell short
    assert dns_evidence(_line(oracle_reward=1.0)) is None
    assert decide(_line(dns_unanswered={}), ["oracle_below_one"]).category == "failing"
    # a no-op episode that errored, with its verifier's failed fetch: evidence from it
    noop = _line(
        oracle_reward=1.0,
        oracle_output="",
        noop_reward=None,
        noop_verifier_output="Failed to connect to api.example.net port 443",
        phase_errors=[
            {"phase": "noop", "error_type": "VerifierError", "cause": "no_reward", "message": "x"}
        ],
        dns_unanswered={"noop": ["api.example.net"]},
    )
    ev = dns_evidence(noop)
    assert ev is not None and (ev.needs, ev.phase) == ("api.example.net", "verifier")


def test_service_names_are_no_hosts_and_a_host_the_task_fetches_comes_first() -> None:
    """apt asks for `_http._tcp.<mirror>` SRV records first and reaches a mirror without them by
    its address: such a name is never the host a task needs. With no failure line naming a
    host, one the task's own files fetch is named before the first looked up."""
    srv = "_http._tcp.deb.debian.org"
    only_srv = _line(dns_unanswered={"oracle": [srv]})
    assert dns_evidence(only_srv) is None
    both = _line(
        dns_unanswered={"oracle": [srv, "example.net", "github.com"]},
        referenced_unreachable_hosts={"tests/test_outputs.py": ["github.com"]},
    )
    ev = dns_evidence(both)
    assert ev is not None and ev.needs == "github.com", ev
    unreferenced = _line(dns_unanswered={"oracle": [srv, "example.net", "github.com"]})
    ev = dns_evidence(unreferenced)
    assert ev is not None and ev.needs == "example.net", ev


def test_dns_log_is_refused_where_its_lookups_could_not_be_told_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dns-log needs docker and one task at a time: the run refuses to start otherwise, with
    what it expected and found (exit 2), before any task runs."""
    import argparse

    from lab.bench import harbor_compat as hc

    root = tmp_path / "ds"
    root.mkdir()
    parser = argparse.ArgumentParser()
    hc.add_arguments(parser)
    args = parser.parse_args(
        ["--tasks-dir", str(root), "--backend", "null", "--dns-log", "--concurrency", "2"]
    )
    assert hc.run(args) == 2
    err = capsys.readouterr().err
    assert "expected --backend docker and --concurrency 1" in err
    assert "found --backend null --concurrency 2" in err


@pytest.mark.parametrize(
    ("ipam", "expected"),
    [
        ('[{"Subnet":"172.17.0.0/16","Gateway":"172.17.0.1"}]', "172.17.0.1"),
        ('[{"Subnet":"10.9.0.0/24","Gateway":"10.9.0.254"}]', "10.9.0.254"),
        # Debian's docker.io 20.10 on a fresh data root records the subnet alone
        ('[{"Subnet":"172.18.0.0/16"}]', "172.18.0.1"),
    ],
)
def test_bridge_gateway_reads_the_gateway_or_the_subnets_first_host(
    tmp_path: Path, ipam: str, expected: str
) -> None:
    cli = tmp_path / "docker"
    cli.write_text(f"#!/bin/sh\necho '{ipam}'\n")
    cli.chmod(0o755)
    assert bridge_gateway(str(cli)) == expected


def test_bridge_gateway_without_an_address_says_what_it_found(tmp_path: Path) -> None:
    cli = tmp_path / "docker"
    cli.write_text("#!/bin/sh\necho '[]'\n")
    cli.chmod(0o755)
    with pytest.raises(RuntimeError, match="expected an IPv4 gateway or subnet"):
        bridge_gateway(str(cli))

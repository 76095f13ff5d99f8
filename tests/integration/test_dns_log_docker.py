"""`sandgym bench harbor_compat --dns-log` on the real Docker engine: a task whose solution
fetches from a host that has no address (an `.invalid` name: none anywhere) through urllib,
whose error names no host. Checked with the logging DNS forwarder (lab/bench/dns_log.py) on the
engine's bridge gateway, the line records the lookup and is put outside the reachable figures
with that host as evidence; the same check without it stays `failing` (the output names no host).
Names that resolve (pypi.org) are not recorded. The same holds for a task whose image build
fetches such a host from a script in its context: the build's lookup is read off the engine's
bridge (lab/bench/dns_sniff.py), which `--dns-log` starts beside the forwarder. Needs root (it
listens on port 53 and opens packet sockets)."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lab.bench import harbor_compat as hc
from lab.bench.dns_log import DnsLog, DnsLoggedBackend, bridge_gateway, host_resolver
from sandgym.tasks import load_task_dir
from tests.docker_engine import bootstrap_terminal_image, engine_answers, owned_docker_backend

pytestmark = pytest.mark.docker

if not engine_answers():
    pytest.skip("no Docker engine answers", allow_module_level=True)

HOST = "sandgym-dns-log-test.invalid"
BUILD_HOST = "sandgym-dns-sniff-build.invalid"


@pytest.fixture(scope="module", autouse=True)
def terminal_image() -> None:
    bootstrap_terminal_image()


@pytest.fixture
async def backend() -> AsyncIterator[object]:
    async for b in owned_docker_backend():
        yield b


def _write_task(
    root: Path, name: str, instruction: str, solve: str, environment: dict[str, str]
) -> Path:
    """A Harbor task directory whose test rewards /app/done; `environment` holds the files of
    its build context (its Dockerfile among them)."""
    t = root / name
    for d in ("environment", "tests", "solution"):
        (t / d).mkdir(parents=True)
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    (t / "instruction.md").write_text(instruction)
    for file, text in environment.items():
        (t / "environment" / file).write_text(text)
    (t / "solution" / "solve.sh").write_text(solve)
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ -e /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    return t


def _task(root: Path) -> Path:
    return _write_task(
        root,
        "fetches-get-pip",
        "Install pip.\n",
        "#!/bin/bash\ngetent hosts pypi.org\n"
        f"python3 -c \"import urllib.request as u; u.urlopen('https://{HOST}/get-pip.py')\" "
        "&& touch /app/done\n",
        {"Dockerfile": "FROM sandgym/terminal\nWORKDIR /app\n"},
    )


async def test_a_lookup_seen_at_run_time_is_the_evidence(tmp_path: Path, backend) -> None:
    task = load_task_dir(_task(tmp_path))
    gateway = bridge_gateway()
    async with DnsLog(gateway, host_resolver()) as dns:
        logged = await hc._check_one(
            task, DnsLoggedBackend(backend, gateway), {}, 300.0, 0, dns=dns
        )
    assert (logged["oracle_reward"], logged["noop_reward"]) == (0.0, 0.0)
    assert logged["dns_log"] is True
    assert HOST in logged["dns_unanswered"]["oracle"]
    assert "pypi.org" not in logged["dns_unanswered"]["oracle"]  # it resolves here
    assert logged["outcome"]["category"] == "unreachable_host"
    assert logged["outcome"]["evidence"]["needs"] == HOST
    assert logged["reasons"][0] == "needs_unreachable_host"

    plain = await hc._check_one(task, backend, {}, 300.0, 0)
    assert "dns_unanswered" not in plain
    assert plain["outcome"]["category"] == "failing"  # urllib's error names no host


def _task_fetching_in_its_build(root: Path) -> Path:
    # the host is in a script of the build context, so no failing output line names it
    return _write_task(
        root,
        "fetches-weights-in-build",
        "Use the weights.\n",
        "#!/bin/bash\ntouch /app/done\n",
        {
            "fetch.py": f"import urllib.request as u\nu.urlopen('https://{BUILD_HOST}/weights.bin')\n",
            "Dockerfile": (
                "FROM sandgym/terminal\nCOPY fetch.py /fetch.py\nRUN python3 /fetch.py\n"
                "WORKDIR /app\n"
            ),
        },
    )


async def test_a_lookup_the_build_made_is_read_off_the_bridge(tmp_path: Path, backend) -> None:
    task = load_task_dir(_task_fetching_in_its_build(tmp_path))
    args = argparse.Namespace(backend="docker", concurrency=1)
    logged_backend, dns = await hc._start_dns_log(args, backend)
    try:
        logged = await hc._check_one(task, logged_backend, {}, 300.0, 0, dns=dns)
    finally:
        await dns.__aexit__(None, None, None)
    assert logged["env_builds"] is False
    assert BUILD_HOST in logged["dns_unanswered"]["build"]
    assert logged["outcome"]["category"] == "unreachable_host"
    assert logged["outcome"]["evidence"]["needs"] == BUILD_HOST
    assert logged["outcome"]["evidence"]["phase"] == "build"

    plain = await hc._check_one(task, backend, {}, 300.0, 0)
    assert plain["env_builds"] is False
    assert plain["outcome"]["category"] == "failing"  # urllib's error names no host

"""`sandgym bench harbor_compat --dns-log` on the real Docker engine: a task whose solution
fetches from a host that has no address (an `.invalid` name: none anywhere) through urllib,
whose error names no host. Checked with the logging DNS forwarder (bench/dns_log.py) on the
engine's bridge gateway, the line records the lookup and is put outside the reachable figures
with that host as evidence; the same check without it stays `failing` (the output names no host).
Names that resolve (pypi.org) are not recorded. Needs root (it listens on port 53)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench import harbor_compat as hc
from bench.dns_log import DnsLog, DnsLoggedBackend, bridge_gateway, host_resolver
from tasks import load_task_dir
from tests.docker_engine import bootstrap_terminal_image, engine_answers, owned_docker_backend

pytestmark = pytest.mark.docker

if not engine_answers():
    pytest.skip("no Docker engine answers", allow_module_level=True)

HOST = "sandgym-dns-log-test.invalid"


@pytest.fixture(scope="module", autouse=True)
def terminal_image() -> None:
    bootstrap_terminal_image()


@pytest.fixture
async def backend() -> AsyncIterator[object]:
    async for b in owned_docker_backend():
        yield b


def _task(root: Path) -> Path:
    t = root / "fetches-get-pip"
    for d in ("environment", "tests", "solution"):
        (t / d).mkdir(parents=True)
    (t / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    (t / "instruction.md").write_text("Install pip.\n")
    (t / "environment" / "Dockerfile").write_text("FROM sandgym/terminal\nWORKDIR /app\n")
    (t / "solution" / "solve.sh").write_text(
        "#!/bin/bash\ngetent hosts pypi.org\n"
        f"python3 -c \"import urllib.request as u; u.urlopen('https://{HOST}/get-pip.py')\" "
        "&& touch /app/done\n"
    )
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "if [ -e /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    return t


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

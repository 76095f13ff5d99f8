"""Compose's fixed addressing: a network's `ipam` subnet and the services' `ipv4_address`
(Terminal-Bench 1's home-server-https: a DNS server, an API mock and the agent's container at
172.20.0.10/.20/.30 on 172.20.0.0/16), loaded into the SandboxSpec and the docker endpoint
settings, and every form sandgym cannot honour refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.sandboxes.services import ServiceSpec
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.tasks import load_task_dir
from sandgym.tasks.errors import ComposeUnsupportedError
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from tests.unit.test_compose_services import harbor_task, tb1_task

TB1_FIXED = """\
    services:
      webserver:
        build:
          dockerfile: Dockerfile
        image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
        container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
        command: ["sh", "-c", "sleep infinity"]
        dns:
          - 172.20.0.10
        extra_hosts:
          - "homeserver.local:172.20.0.30"
        networks:
          homelab:
            ipv4_address: 172.20.0.30
      dns-server:
        image: sandgym/terminal:latest
        networks:
          homelab:
            ipv4_address: 172.20.0.10
      api:
        image: sandgym/terminal:latest
        networks:
          homelab:
            aliases: [api-mock]
    networks:
      homelab:
        driver: bridge
        ipam:
          config:
            - subnet: 172.20.0.0/16
"""


def test_subnet_and_addresses_reach_the_sandbox_spec(tmp_path: Path) -> None:
    task = load_task_dir(tb1_task(tmp_path, TB1_FIXED))
    env = task.environment
    assert (env.subnet, env.ipv4_address) == ("172.20.0.0/16", "172.20.0.30")
    by_name = {s.name: s for s in env.services}
    assert by_name["dns-server"].ipv4_address == "172.20.0.10"
    assert by_name["api"].ipv4_address is None  # the engine addresses it
    assert by_name["api"].aliases == ("api-mock",)
    spec = sandbox_spec_for(task)
    assert (spec.subnet, spec.ipv4_address) == ("172.20.0.0/16", "172.20.0.30")
    # the addressing changes what group is made: it is in the fingerprint
    plain = spec.model_copy(
        update={
            "subnet": None,
            "ipv4_address": None,
            "services": tuple(s.model_copy(update={"ipv4_address": None}) for s in spec.services),
        }
    )
    assert spec.fingerprint("docker") != plain.fingerprint("docker")
    moved = spec.model_copy(update={"ipv4_address": "172.20.0.31"})
    assert moved.fingerprint("docker") != spec.fingerprint("docker")


def test_a_harbor_compose_file_carries_them_too(tmp_path: Path) -> None:
    compose = (
        "services:\n  main:\n    networks: {net: {ipv4_address: 10.9.0.5}}\n"
        "  db:\n    image: postgres:15\n    networks: {net: {ipv4_address: 10.9.0.6}}\n"
        "networks:\n  net:\n    ipam: {config: [{subnet: 10.9.0.0/24}]}\n"
    )
    spec = sandbox_spec_for(load_task_dir(harbor_task(tmp_path, compose)))
    assert (spec.subnet, spec.ipv4_address) == ("10.9.0.0/24", "10.9.0.5")
    assert [s.ipv4_address for s in spec.services] == ["10.9.0.6"]


@pytest.mark.parametrize(
    ("compose", "needle"),
    [
        (  # compose itself needs a configured subnet for a fixed address
            "services:\n  main: {}\n  db:\n    image: x\n    networks: {n: {ipv4_address: 10.9.0.6}}\n"
            "networks:\n  n: {}\n",
            "which fixes no subnet",
        ),
        (
            "services:\n  main: {}\n  db:\n    image: x\n    networks: {n: {ipv4_address: 10.8.0.6}}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24}]}}\n",
            "is not a host address of subnet 10.9.0.0/24",
        ),
        (
            "services:\n  main:\n    networks: {n: {ipv4_address: 10.9.0.6}}\n  db:\n    image: x\n"
            "    networks: {n: {ipv4_address: 10.9.0.6}}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24}]}}\n",
            "address 10.9.0.6 is also service 'main''s",
        ),
        (
            "services:\n  main: {}\n  db:\n    image: x\n    networks: {n: {ipv4_address: 10.9.0.1}}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24}]}}\n",
            "the subnet's gateway",
        ),
        (
            "services:\n  main: {}\n  db:\n    image: x\n    networks: {n: {ipv6_address: 'fd00::5'}}\n",
            "a fixed IPv6 address is not supported",
        ),
        (
            "services:\n  main: {}\n  db: {image: x}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24, gateway: 10.9.0.254}]}}\n",
            "with a `subnet` only",
        ),
        (
            "services:\n  main: {}\n  db: {image: x}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24}]}}\n"
            "  m: {ipam: {config: [{subnet: 10.8.0.0/24}]}}\n",
            "a second subnet",
        ),
        (
            "services:\n  main:\n    networks: {n: {ipv4_address: 10.9.0.6}}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24}]}}\n",
            "for the main service alone",
        ),
        (
            "services:\n  main: {}\n  db:\n    image: x\n    networks: {n: {ipv4_address: nowhere}}\n"
            "networks:\n  n: {ipam: {config: [{subnet: 10.9.0.0/24}]}}\n",
            "expected an IPv4 address, found 'nowhere'",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(
    tmp_path: Path, compose: str, needle: str
) -> None:
    with pytest.raises(ComposeUnsupportedError) as err:
        load_task_dir(harbor_task(tmp_path, compose))
    assert needle in str(err.value), err.value


def test_the_spec_checks_its_addresses() -> None:
    svc = ServiceSpec(name="db", image="x", ipv4_address="10.9.0.6")
    with pytest.raises(ValueError, match="needs the network's subnet"):
        SandboxSpec(services=(svc,))
    with pytest.raises(ValueError, match="is not a host address"):
        SandboxSpec(services=(svc,), subnet="10.8.0.0/24")
    with pytest.raises(ValueError, match="found no services"):
        SandboxSpec(subnet="10.9.0.0/24")
    ok = SandboxSpec(services=(svc,), subnet="10.9.0.0/24", ipv4_address="10.9.0.7")
    assert ok.ipv4_address == "10.9.0.7"

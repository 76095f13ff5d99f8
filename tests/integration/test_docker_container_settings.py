"""Compose's container settings on the docker backend, against the real engine: the main
service's `tmpfs` (a size-capped tmpfs; the verifier's container gets it too, empty), `dns` and
`extra_hosts` (the sandbox's resolv.conf and /etc/hosts, which the verifier's container shares),
a service's anonymous volume (`volumes: [/mnt/data1]`), removed with the group, and a service's
own confinement (the sandbox's capabilities and limits)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from sandgym.sandboxes.docker import DockerBackend
from sandgym.sandboxes.services import ServiceSpec
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.tasks import private_verify
from tests.reliability.conftest import IMAGE, docker_ready

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_ready(), reason=f"no Docker engine or no {IMAGE}"),
]

SPEC = SandboxSpec(
    image=IMAGE,
    workdir="/app",
    cpus=1,
    memory_mb=256,
    pids_limit=128,
    tmpfs=(("/scratch", "size=1M,mode=755"),),
    dns=("192.0.2.1",),
    extra_hosts=(("example.test", "10.1.2.3"),),
    services=(
        ServiceSpec(
            name="store", image=IMAGE, command=("sleep", "infinity"), volumes=("/mnt/data1",)
        ),
    ),
)


def docker_words(*args: str) -> list[str]:
    """The words `docker ARGS` prints."""
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True
    ).stdout.split()


PROBE = (
    "findmnt -n -o FSTYPE,OPTIONS /scratch; "
    "dd if=/dev/zero of=/scratch/big bs=1M count=2 2>/dev/null; echo dd=$?; "
    "ls /scratch; grep -c example.test /etc/hosts; grep '^nameserver' /etc/resolv.conf; "
    "getent hosts example.test"
)


async def test_tmpfs_dns_extra_hosts_and_anonymous_volumes(tmp_path: Path) -> None:
    b = DockerBackend(owner_id="test-cs-" + os.urandom(4).hex())
    sb = await b.create(SPEC)
    volume: str | None = None
    try:
        await sb.exec("echo agent > /scratch/note")
        res = await sb.exec(PROBE, timeout_s=30)
        out = res.stdout.splitlines()
        assert out[0].startswith("tmpfs ") and "size=1024k" in out[0] and "mode=755" in out[0]
        assert out[1] == "dd=1"  # the size cap holds: 2 MiB do not fit in 1 MiB
        assert "note" in res.stdout
        # a group's container resolves through the engine's embedded DNS, which forwards to
        # the configured server; the /etc/hosts line is the container's own
        assert out[-1].split() == ["10.1.2.3", "example.test"], res.stdout

        # the verifier's container: the same hosts file, and the tmpfs, empty
        tests = tmp_path / "tests"
        tests.mkdir()
        (tests / "test.sh").write_text(
            "#!/bin/bash\nfindmnt -n -o FSTYPE /scratch; ls -A /scratch | wc -l; "
            "getent hosts example.test; echo 1 > /logs/verifier/reward.txt\n"
        )
        nonce = private_verify.new_nonce()
        payload = private_verify.build_payload(nonce, tests, {})
        vres = await sb.exec_private(
            private_verify.wrapper_argv(["bash", "/tests/test.sh"]), payload, timeout_s=60
        )
        assert vres.exit_code == 0, vres
        assert vres.stdout.split()[:4] == ["tmpfs", "0", "10.1.2.3", "example.test"], vres

        # the service's anonymous volume: mounted at its path, a volume of its own
        name = f"{sb.id}-store"
        mounts = await asyncio.to_thread(
            docker_words,
            "inspect",
            "-f",
            "{{range .Mounts}}{{.Type}} {{.Name}} {{.Destination}}{{end}}",
            name,
        )
        assert mounts[0] == "volume" and mounts[2] == "/mnt/data1", mounts
        volume = mounts[1]
    finally:
        await sb.close()
        await b.reap(only_expired=False)
        await b.aclose()
    gone = await asyncio.to_thread(docker_words, "volume", "ls", "-q", "--filter", f"name={volume}")
    assert volume is not None and gone == [], gone


async def test_a_service_container_is_confined_as_the_sandbox_is() -> None:
    """A service beside the sandbox runs under the same confinement as the sandbox's own
    container (`docker.confine.Confinement`): all capabilities dropped but `CAP_ADD`,
    `no-new-privileges`, and the spec's CPU, memory and pids limits."""
    import json

    from sandgym.sandboxes.docker.confine import CAP_ADD

    b = DockerBackend(owner_id="test-svc-confine-" + os.urandom(4).hex())
    spec = SandboxSpec(
        image=IMAGE,
        cpus=1,
        memory_mb=256,
        pids_limit=128,
        services=(ServiceSpec(name="store", image=IMAGE, command=("sleep", "infinity")),),
    )
    sb = await b.create(spec)
    try:
        words = await asyncio.to_thread(
            docker_words, "inspect", "-f", "{{json .HostConfig}}", f"{sb.id}-store"
        )
        host = json.loads(words[0])
    finally:
        await sb.close()
        await b.reap(only_expired=False)
        await b.aclose()
    assert (host["CapDrop"], host["CapAdd"]) == (["ALL"], CAP_ADD), host
    assert "no-new-privileges" in host["SecurityOpt"], host["SecurityOpt"]
    assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (256 * 2**20,) * 2 + (128,)
    assert host["CpuQuota"] > 0 and host["CpuQuota"] == host["CpuPeriod"], host


SUBNET = "10.213.7.0/24"  # unusual, so no network of the engine's own holds it
FIXED = SandboxSpec(
    image=IMAGE,
    workdir="/app",
    cpus=1,
    memory_mb=256,
    pids_limit=128,
    subnet=SUBNET,
    ipv4_address="10.213.7.30",
    network=True,  # public: the services get the bridge too, after the group's network
    services=(
        ServiceSpec(
            name="dns-server",
            image=IMAGE,
            command=("sleep", "infinity"),
            ipv4_address="10.213.7.10",
        ),
        ServiceSpec(name="api", image=IMAGE, command=("sleep", "infinity")),
    ),
)


async def test_fixed_subnet_and_addresses_one_group_at_a_time() -> None:
    """Compose's `ipam` subnet and `ipv4_address` (home-server-https): the group's network is
    made on the subnet, the main container and a service get their fixed addresses, a service
    without one gets an address of the subnet; a second group on the same subnet while the
    first lives is refused by its cause, and after the first is closed one is made again."""
    from sandgym.sandboxes.errors import SandboxCreateError

    b = DockerBackend(owner_id="test-fixed-" + os.urandom(4).hex())
    first = await b.create(FIXED)
    try:
        mine = (await first.exec("hostname -i", timeout_s=30)).stdout.split()
        res = await first.exec(
            "getent hosts dns-server | cut -d' ' -f1; getent hosts api | cut -d' ' -f1",
            timeout_s=30,
        )
        dns_ip, api_ip = res.stdout.split()
        assert "10.213.7.30" in mine and dns_ip == "10.213.7.10", (mine, res.stdout)
        assert api_ip.startswith("10.213.7.") and api_ip not in (*mine, dns_ip), res.stdout
        # the group's network is the service's eth0 (as compose's is), the bridge comes after
        routes = await asyncio.to_thread(
            docker_words, "exec", f"{first.id}-dns-server", "cat", "/proc/net/route"
        )
        eth0 = {routes[i + 1] for i, w in enumerate(routes) if w == "eth0"}
        eth1 = {routes[i + 1] for i, w in enumerate(routes) if w == "eth1"}
        assert "0007D50A" in eth0 and "00000000" in eth1, routes  # 10.213.7.0; default route
        with pytest.raises(SandboxCreateError) as err:
            await b.create(FIXED)
        assert err.value.cause == "subnet_in_use", err.value
        assert SUBNET in str(err.value)
    finally:
        await first.close()
    again = await b.create(FIXED)
    try:
        res = await again.exec("hostname -i", timeout_s=30)
        assert "10.213.7.30" in res.stdout.split(), res.stdout
    finally:
        await again.close()
        await b.reap(only_expired=False)
        await b.aclose()
    left = await asyncio.to_thread(
        docker_words, "network", "ls", "-q", "--filter", f"label=sandgym.group_of={again.id}"
    )
    assert left == [], left


async def test_one_context_two_dockerfiles_build_two_images(tmp_path: Path) -> None:
    """home-server-https's main service and its API mock build one context (`.`) with two
    Dockerfiles: each gets its own image (the cache key holds the Dockerfile's name), and the
    default Dockerfile keeps the key it always had (the context's hash)."""
    (tmp_path / "Dockerfile").write_text(f"FROM {IMAGE}\nLABEL sandgym.test-which=main\n")
    (tmp_path / "Dockerfile.api-mock").write_text(f"FROM {IMAGE}\nLABEL sandgym.test-which=mock\n")
    main = SandboxSpec(image=None, build_context=tmp_path)
    mock = SandboxSpec(image=None, build_context=tmp_path, dockerfile="Dockerfile.api-mock")
    assert main.build_key() == main.context_hash()
    assert mock.build_key() != main.build_key()
    b = DockerBackend(owner_id="test-df-" + os.urandom(4).hex())
    tags: list[str] = []
    try:
        for spec in (main, mock):
            tags.append(await b.image_for(spec))
        labels = [
            (await asyncio.to_thread(docker_words, "inspect", "-f", "{{json .Config.Labels}}", t))[
                0
            ]
            for t in tags
        ]
        assert tags[0] != tags[1], tags
        assert (
            '"sandgym.test-which":"main"' in labels[0]
            and '"sandgym.test-which":"mock"' in labels[1]
        )
    finally:
        for t in tags:
            await asyncio.to_thread(
                subprocess.run, ["docker", "rmi", "-f", t], capture_output=True, check=False
            )
        await b.aclose()

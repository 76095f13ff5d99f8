"""Network policies: Harbor's task.toml forms and defaults, the server's clamp, the sandbox spec a
task asks for, which backends refuse what, and the egress proxy's allow/deny decisions (its
listener made in this process's own network namespace, through the same setns path)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from sandgym.sandboxes import NetworkPolicy, NetworkPolicyUnsupportedError, SandboxSpec, get_backend
from sandgym.sandboxes.egress import EgressProxy, split_host_port
from sandgym.sandboxes.network import NO_NETWORK, PUBLIC, clamp, parse_policy
from sandgym.tasks.errors import TaskLoadError
from sandgym.tasks.loaders import load_task_dir
from sandgym.tasks.sandbox_spec import sandbox_spec_for

ALLOW_A = NetworkPolicy(mode="allowlist", allowed_hosts=["a.example"])


def _harbor(tmp_path: Path, toml_body: str) -> Path:
    d = tmp_path / "t"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "instruction.md").write_text("do it\n")
    (d / "task.toml").write_text('version = "1.0"\n' + textwrap.dedent(toml_body))
    return d


def _plan(tmp_path: Path, toml_body: str) -> dict[str, object]:
    return load_task_dir(_harbor(tmp_path, toml_body)).network_plan().describe()


# -- Harbor's forms and defaults --------------------------------------------------------------


def test_unset_means_public_in_every_phase(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "")
    assert plan["environment"] == plan["agent"] == plan["verifier"] == {"mode": "public"}


@pytest.mark.parametrize(("value", "mode"), [("true", "public"), ("false", "no-network")])
def test_legacy_allow_internet(tmp_path: Path, value: str, mode: str) -> None:
    plan = _plan(tmp_path, f"[environment]\nallow_internet = {value}\n")
    assert plan["environment"] == plan["agent"] == plan["verifier"] == {"mode": mode}


def test_network_mode_wins_over_allow_internet(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[environment]\nallow_internet = true\nnetwork_mode = "no-network"\n')
    assert plan["agent"] == {"mode": "no-network"}


def test_allowlist_with_hosts_normalised(tmp_path: Path) -> None:
    body = '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["PyPI.org.", "pypi.org"]\n'
    plan = _plan(tmp_path, body)
    assert plan["environment"] == {"mode": "allowlist", "allowed_hosts": ["pypi.org"]}


def test_hosts_alone_mean_allowlist(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[agent]\nallowed_hosts = ["pypi.org"]\n')
    assert plan["agent"] == {"mode": "allowlist", "allowed_hosts": ["pypi.org"]}
    assert plan["environment"] == plan["verifier"] == {"mode": "public"}


def test_phases_override_the_baseline_each_on_its_own(tmp_path: Path) -> None:
    body = """
        [environment]
        network_mode = "public"
        [agent]
        network_mode = "no-network"
        [verifier]
        network_mode = "allowlist"
        allowed_hosts = ["files.example"]
    """
    plan = _plan(tmp_path, body)
    assert plan["environment"] == {"mode": "public"}
    assert plan["agent"] == {"mode": "no-network"}
    assert plan["verifier"] == {"mode": "allowlist", "allowed_hosts": ["files.example"]}


def test_a_phase_without_its_own_inherits_a_restricted_baseline(tmp_path: Path) -> None:
    body = '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n'
    plan = _plan(tmp_path, body)
    assert plan["agent"] == {"mode": "no-network"}
    assert plan["verifier"] == {"mode": "public"}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('[environment]\nnetwork_mode = "internet"\n', "network_mode must be one of"),
        (
            '[agent]\nnetwork_mode = "public"\nallowed_hosts = ["a.example"]\n',
            "only valid with network_mode = 'allowlist'",
        ),
        ('[verifier]\nallowed_hosts = ["https://a.example/x"]\n', "not URLs"),
        ('[environment]\nallowed_hosts = "a.example"\n', "must be a list"),
        ('[environment]\nallow_internet = "yes"\n', "true or false"),
    ],
)
def test_malformed_policies_are_named_load_errors(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(TaskLoadError, match=match):
        load_task_dir(_harbor(tmp_path, body))


def test_terminal_bench_1_gets_its_harness_network(tmp_path: Path) -> None:
    d = tmp_path / "tb1"
    d.mkdir()
    (d / "task.yaml").write_text("instruction: do it\n")
    (d / "Dockerfile").write_text("FROM sandgym/terminal:latest\n")
    (d / "run-tests.sh").write_text("pytest\n")
    plan = load_task_dir(d).network_plan().describe()
    assert plan["agent"] == plan["verifier"] == {"mode": "public"}


def test_the_catalog_stays_hermetic() -> None:
    from sandgym.tasks import TaskRegistry

    reg = TaskRegistry([], include_builtin=True)
    assert reg.ids(), "the built-in catalog lists no task"
    for task_id in reg.ids():
        plan = reg.get(task_id).network_plan()
        assert {plan.environment.mode, plan.agent.mode, plan.verifier.mode} == {"no-network"}


# -- clamp --------------------------------------------------------------------------------------


def test_clamp_never_makes_a_policy_more_open() -> None:
    assert clamp(PUBLIC, None) == PUBLIC
    assert clamp(PUBLIC, NO_NETWORK) == NO_NETWORK
    assert clamp(PUBLIC, ALLOW_A) == ALLOW_A
    assert clamp(NO_NETWORK, PUBLIC) == NO_NETWORK
    assert clamp(NO_NETWORK, ALLOW_A) == NO_NETWORK
    both = NetworkPolicy(mode="allowlist", allowed_hosts=["a.example", "b.example"])
    assert clamp(both, ALLOW_A) == ALLOW_A
    other = NetworkPolicy(mode="allowlist", allowed_hosts=["c.example"])
    assert clamp(other, ALLOW_A) == NO_NETWORK


def test_plan_clamp_is_reported(tmp_path: Path) -> None:
    task = load_task_dir(_harbor(tmp_path, '[agent]\nnetwork_mode = "no-network"\n'))
    plan = task.network_plan().clamp(NO_NETWORK).describe()
    assert plan["environment"] == plan["verifier"] == {"mode": "no-network"}
    assert plan["clamp"] == {"mode": "no-network"} and plan["clamped"] is True
    same = task.network_plan().clamp(PUBLIC).describe()
    assert same["clamped"] is False and same["verifier"] == {"mode": "public"}


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("public", PUBLIC),
        ("no-network", NO_NETWORK),
        ("allowlist:a.example", ALLOW_A),
        ("allowlist:", NetworkPolicy(mode="allowlist")),
    ],
)
def test_parse_policy(text: str, policy: NetworkPolicy) -> None:
    assert parse_policy(text) == policy


@pytest.mark.parametrize("text", ["internet", "public:a.example", "allowlist:http://x/"])
def test_parse_policy_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_policy(text)


def test_server_settings_refuse_a_bad_ceiling() -> None:
    from sandgym.server.settings import ServerSettings

    with pytest.raises(ValueError, match="expected a network policy"):
        ServerSettings(network_ceiling="offline")
    assert ServerSettings(network_ceiling="no-network").network_ceiling_policy() == NO_NETWORK


# -- the spec a task asks for, and who refuses it ------------------------------------------


def test_spec_starts_with_the_environment_and_can_switch_to_the_phases(tmp_path: Path) -> None:
    body = '[agent]\nnetwork_mode = "no-network"\n[verifier]\nallowed_hosts = ["a.example"]\n'
    task = load_task_dir(_harbor(tmp_path, body))
    spec = sandbox_spec_for(task)
    assert spec.network == PUBLIC
    assert spec.network_later == (NO_NETWORK, ALLOW_A)
    assert spec.needs_proxy and spec.ever_public
    clamped = sandbox_spec_for(task, network_ceiling=NO_NETWORK)
    assert clamped.network == NO_NETWORK and clamped.network_later == ()
    assert clamped.fingerprint() != spec.fingerprint()


def test_legacy_bool_spec() -> None:
    assert SandboxSpec(network=True).network == PUBLIC
    assert SandboxSpec(network=False).network == NO_NETWORK
    assert SandboxSpec().network == NO_NETWORK


async def test_a_sandbox_switches_only_to_planned_policies() -> None:
    backend = get_backend("null")
    sb = await backend.create(SandboxSpec(network=PUBLIC, network_later=(NO_NETWORK,)))
    try:
        await sb.set_network(NO_NETWORK)
        assert sb.network == NO_NETWORK
        with pytest.raises(NetworkPolicyUnsupportedError, match="was not created for"):
            await sb.set_network(ALLOW_A)
        assert sb.network == NO_NETWORK
    finally:
        await sb.close()


async def test_e2b_refuses_an_allowlist_and_a_phase_switch(tmp_path: Path) -> None:
    from tests.fakes.e2b_fake import FakeE2BCloud  # the in-process stand-in of the E2B service

    cloud = FakeE2BCloud(root=tmp_path / "cloud")
    backend = get_backend("e2b", api_key=cloud.api_key, sdk=cloud.sdk)
    with pytest.raises(NetworkPolicyUnsupportedError, match="allowlist"):
        backend.check_network(SandboxSpec(network=ALLOW_A))
    with pytest.raises(NetworkPolicyUnsupportedError, match="switch"):
        backend.check_network(SandboxSpec(network=PUBLIC, network_later=(NO_NETWORK,)))
    backend.check_network(SandboxSpec(network=PUBLIC))
    backend.check_network(SandboxSpec(network=NO_NETWORK))
    await backend.aclose()
    await cloud.aclose()


def test_local_refuses_public_beside_a_restricted_phase(tmp_path: Path) -> None:
    backend = get_backend("local", root=tmp_path / "root")
    with pytest.raises(NetworkPolicyUnsupportedError, match="use docker"):
        backend.check_network(SandboxSpec(network=PUBLIC, network_later=(NO_NETWORK,)))
    backend.check_network(SandboxSpec(network=NO_NETWORK, network_later=(ALLOW_A,)))
    backend.check_network(SandboxSpec(network=PUBLIC))


# -- the egress proxy ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "default", "out"),
    [
        ("a.example:443", 443, ("a.example", 443)),
        ("a.example", 80, ("a.example", 80)),
        ("[::1]:8080", 443, ("::1", 8080)),
        ("127.0.0.1:81", 80, ("127.0.0.1", 81)),
    ],
)
def test_split_host_port(target: str, default: int, out: tuple[str, int]) -> None:
    assert split_host_port(target, default) == out


@pytest.mark.parametrize("target", ["a.example:x", ":80", "a.example:0", "[::1"])
def test_split_host_port_refuses(target: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(target, 443)


async def _echo_server() -> tuple[asyncio.AbstractServer, int]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        data = await r.read(65536)
        w.write(b"HTTP/1.0 200 OK\r\n\r\nsaw:" + data.split(b"\r\n")[0])
        await w.drain()
        w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def _through(port: int, request: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(request)
    await w.drain()
    out = await asyncio.wait_for(r.read(65536), 10)
    if out.startswith(b"HTTP/1.1 200 Connection established"):
        w.write(b"GET /tunnelled HTTP/1.0\r\n\r\n")
        await w.drain()
        out += await asyncio.wait_for(r.read(65536), 10)
    w.close()
    return out


@pytest.mark.skipif(
    not Path("/proc/thread-self/ns/net").exists(), reason="needs Linux network namespaces"
)
async def test_proxy_lets_listed_hosts_through_and_refuses_the_rest() -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("setns needs root")
    upstream, up_port = await _echo_server()
    proxy = EgressProxy("t", NetworkPolicy(mode="allowlist", allowed_hosts=["127.0.0.1"]))
    # its listener, made through setns into this process's own namespace, on a free port
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await proxy.start("/proc/self/ns/net", port=port)
    try:
        get = f"GET http://127.0.0.1:{up_port}/x?y=1 HTTP/1.1\r\nHost: h\r\n\r\n".encode()
        out = await _through(port, get)
        assert b"saw:GET /x?y=1 HTTP/1.1" in out  # origin-form on the way out
        tunnel = await _through(port, f"CONNECT 127.0.0.1:{up_port} HTTP/1.1\r\n\r\n".encode())
        assert b"saw:GET /tunnelled" in tunnel
        denied = await _through(port, f"CONNECT localhost:{up_port} HTTP/1.1\r\n\r\n".encode())
        assert denied.startswith(b"HTTP/1.1 403") and b"localhost is not allowed" in denied
        proxy.set_policy(NO_NETWORK)  # a phase switch: new connections see the new policy
        off = await _through(port, get)
        assert off.startswith(b"HTTP/1.1 403") and b"network is off" in off
        assert (proxy.allowed, proxy.denied) == (2, 2)
        bad = await _through(port, b"GET /relative HTTP/1.1\r\n\r\n")
        assert bad.startswith(b"HTTP/1.1 400")
    finally:
        await proxy.close()
        upstream.close()

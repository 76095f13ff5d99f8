"""The sandbox API (protocol 1.2) on the docker backend, through a real server and its client:
create from an environment tar (Dockerfile built, files, ENV, WORKDIR), exec with stdout, stderr
and exit code apart (argv, cwd, env, user, timeout), files both ways, network switching between
the declared policies, the warm pool for an equal environment, the idle timeout that frees a
sandbox whose caller went away, close, and the token."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandgym.client import sandbox_client as sc
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.wire.sandbox_protocol import (
    CreateSandboxRequest,
    ExecRequest,
    SandboxEnvironment,
    SandboxNetwork,
)
from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until, wait_until_in_thread

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]

TOKEN = "sandbox-api-test"


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    owner = "test-sbxapi-" + os.urandom(4).hex()
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        backend="docker",
        backend_options={"owner_id": owner},
        include_builtin=False,
        token=TOKEN,
        sweep_interval_s=0.2,
    )
    with BackgroundServer(settings) as srv:
        yield srv


def _env_dir(tmp_path: Path) -> Path:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "Dockerfile").write_text(
        "FROM sandgym/terminal:latest\nWORKDIR /srv\nENV GREETING=hello\nCOPY data.txt /srv/\n"
    )
    (env / "data.txt").write_text("data of the environment\n")
    return env


def _containers(owner: str) -> list[str]:
    """Names of the containers labelled with this server's owner id (container name = sandbox
    id), in any state; one list call, no per-container inspect (they may vanish meanwhile)."""
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": f"sandgym.owner={owner}"})
        return [n.lstrip("/") for c in found for n in c["Names"]]
    finally:
        client.close()


async def test_sandbox_api_on_docker(server: BackgroundServer, tmp_path: Path) -> None:
    owner = server.app.state.service.backend.owner_id
    env = _env_dir(tmp_path)
    create = CreateSandboxRequest(
        environment=SandboxEnvironment(memory_mb=512, cpus=1),
        environment_tar=sc.pack_environment(env),
        network=SandboxNetwork(mode="no-network"),
        network_later=[SandboxNetwork(mode="public")],
        name="api-test",
    )
    async with sc.SandboxClient(server.http_url, token=TOKEN) as client:
        info = await client.create(create)
        sid = info.sandbox_id
        assert info.workdir == "/srv" and info.network.mode == "no-network"
        assert [n.mode for n in info.networks] == ["no-network", "public"]

        # exec: a shell string, its streams and exit code apart; WORKDIR, ENV and COPY applied
        res = await client.exec(
            sid,
            ExecRequest(
                command='cat data.txt; echo "$GREETING $EXTRA"; echo oops >&2; exit 3',
                env={"EXTRA": "there"},
            ),
        )
        assert (res.exit_code, res.stdout, res.stderr) == (
            3,
            "data of the environment\nhello there\n",
            "oops\n",
        )
        # argv, cwd and user
        res = await client.exec(
            sid, ExecRequest(command=["sh", "-c", "pwd; id -un"], cwd="/tmp", user="nobody")
        )
        assert res.stdout == "/tmp\nnobody\n" and res.exit_code == 0
        with pytest.raises(sc.ExecTimeoutError, match="timed out after 1 seconds"):
            await client.exec(sid, ExecRequest(command="sleep 30", timeout_s=1))

        # files both ways
        src = tmp_path / "up"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "b.txt").write_text("bee")
        (src / "a.txt").write_text("ay")
        await client.upload_dir(sid, src, "/data/in")
        await client.upload_file(sid, env / "data.txt", "/data/one/copy.txt")
        res = await client.exec(
            sid, ExecRequest(command="cat /data/in/a.txt /data/in/sub/b.txt /data/one/copy.txt")
        )
        assert res.stdout == "aybeedata of the environment\n"
        await client.exec(sid, ExecRequest(command="mkdir -p /out/d && echo r > /out/d/r.txt"))
        await client.download_dir(sid, "/out", tmp_path / "down")
        assert (tmp_path / "down" / "d" / "r.txt").read_text() == "r\n"
        await client.download_file(sid, "/out/d/r.txt", tmp_path / "single.txt")
        assert (tmp_path / "single.txt").read_text() == "r\n"
        with pytest.raises(sc.RemoteFileNotFoundError):
            await client.download_file(sid, "/no/such/file", tmp_path / "x")

        # network: loopback only, then the bridge; a policy it was not made for is refused
        res = await client.exec(sid, ExecRequest(command="ls /sys/class/net"))
        assert res.stdout.split() == ["lo"]
        after = await client.set_network(sid, SandboxNetwork(mode="public"))
        assert after.network.mode == "public"
        res = await client.exec(sid, ExecRequest(command="ls /sys/class/net"))
        assert [n for n in res.stdout.split() if n != "lo"], (
            res.stdout
        )  # an interface on the bridge
        with pytest.raises(sc.NetworkUnsupportedError, match="not created for network"):
            await client.set_network(
                sid, SandboxNetwork(mode="allowlist", allowed_hosts=["pypi.org"])
            )

        # close: the container is gone; the id is unknown afterwards
        assert await client.close(sid) is True
        assert await client.is_alive(sid) is False
        await wait_until_in_thread(
            lambda: sid not in _containers(owner),
            60.0, 0.1, "the closed sandbox's container removed",
        )  # fmt: skip
        with pytest.raises(sc.UnknownSandboxError):
            await client.exec(sid, ExecRequest(command="true"))

        # an equal environment (same content, packed again) is the same pool key; the close made
        # no replacement for it (the warm target is the operator's: test_pool_release_refill),
        # so the sandbox is made anew
        again = await client.create(create.model_copy(update={"idle_timeout_s": 0.5}))
        assert again.fingerprint == info.fingerprint and again.from_pool is False

        # idle past its timeout: closed by the server, its container removed
        async def gone() -> bool:  # (listing is no request to the sandbox: not activity)
            listed = await client.list()
            return again.sandbox_id not in {x.sandbox_id for x in listed.sandboxes}

        await wait_until(gone, 60.0, 0.1, "the idle sandbox closed")
        await wait_until_in_thread(
            lambda: again.sandbox_id not in _containers(owner), 60.0, 0.1, "its container removed"
        )

        # a bad environment is a named error, not a 500
        with pytest.raises(sc.EnvironmentInvalidError, match="Dockerfile or docker-compose"):
            empty = tmp_path / "empty"
            empty.mkdir()
            (empty / "README").write_text("no Dockerfile here")
            await client.create(CreateSandboxRequest(environment_tar=sc.pack_environment(empty)))

    # the token is required
    async with sc.SandboxClient(server.http_url, token="wrong") as bad:
        with pytest.raises(sc.UnauthorizedError):
            await bad.list()
    async with httpx.AsyncClient() as raw:
        r = await raw.get(server.http_url + "/v1/sandboxes")
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"

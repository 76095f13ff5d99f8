"""Multi-container Harbor tasks on docker, through the real env server: a task whose
`environment/docker-compose.yaml` adds services beside `main` runs as one group on a private
network of its own; the agent reaches the services by name, the verifier (in its own container
sharing the sandbox's network namespace) queries them, and closing leaves no container and no
network behind; a SIGKILLed `sandgym serve` leaves its group to the restarted server's reaper.
Healthchecks: a service's compose healthcheck (Docker's health) and the task's `[environment]
healthcheck` both hold the sandbox back until they pass (the first command sees both services
answer); one that never passes fails the reset with its output.

The services are a tiny key-value HTTP server built FROM sandgym/terminal:latest (python3), so
nothing is pulled; each starts listening only after `KV_DELAY` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until_in_thread

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason="image sandgym/terminal not built"),
]

KV = textwrap.dedent(
    """\
    import http.server, os, time
    time.sleep(float(os.environ.get("KV_DELAY", "0")))
    store = {"ready": os.environ.get("KV_NAME", "kv")}
    class H(http.server.BaseHTTPRequestHandler):
        def _send(self, code, body):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            v = store.get(self.path.strip("/"))
            self._send(200, v.encode()) if v is not None else self._send(404, b"")
        def do_PUT(self):
            n = int(self.headers.get("Content-Length") or 0)
            store[self.path.strip("/")] = self.rfile.read(n).decode()
            self._send(204, b"")
        def log_message(self, *a):
            pass
    http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
    """
)

#: kv: a compose healthcheck (Docker's health, waited for) and 5 s before it listens. Without
#: the wait, main would be handed out seconds before kv answers, and the first command would not
#: see it.
COMPOSE = textwrap.dedent(
    """\
    services:
      main:
        environment:
          FROM_COMPOSE: "yes"
        depends_on:
          kv:
            condition: service_healthy
      kv:
        build:
          context: ./kv
        environment:
          KV_DELAY: "5"
          KV_NAME: kv
        healthcheck:
          test: ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/ready')"]
          interval: 500ms
          timeout: 5s
          retries: 30
        ports: ["8000"]
    """
)

HEALTH_FAIL = """
[environment.healthcheck]
command = "echo kv-store-not-ready-$((6*7)) >&2; exit 3"
interval_sec = 0.2
retries = 2
timeout_sec = 5
"""


def make_task(root: Path, name: str, health: str, services: bool = True) -> str:
    d = root / name
    (d / "environment" / "kv").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM sandgym/terminal:latest\nWORKDIR /app\n")
    (d / "environment" / "kv" / "Dockerfile").write_text(
        'FROM sandgym/terminal:latest\nCOPY kv.py /kv.py\nCMD ["python3", "/kv.py"]\n'
    )
    (d / "environment" / "kv" / "kv.py").write_text(KV)
    if services:
        (d / "environment" / "docker-compose.yaml").write_text(COMPOSE)
    (d / "task.toml").write_text(
        'version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n' + health
    )
    (d / "instruction.md").write_text("Store the value 42 under key `answer` in the kv service.\n")
    (d / "solution" / "solve.sh").write_text(
        "#!/bin/bash\ncurl -fsS -X PUT --data 42 http://kv:8000/answer\n"
    )
    (d / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'if [ "$(curl -fsS -m 5 http://kv:8000/answer)" = 42 ]; then echo 1 > '
        "/logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return name


def _docker(*args: str) -> list[str]:
    out = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def leftovers(label: str) -> tuple[list[str], list[str]]:
    """(containers, networks) carrying `label` (key=value)."""
    return (
        _docker("ps", "-aq", "--filter", f"label={label}"),
        _docker("network", "ls", "-q", "--filter", f"label={label}"),
    )


def group_left(sandbox_id: str) -> tuple[list[str], list[str]]:
    """(containers, networks) of one sandbox: its own container and its group's."""
    from sandgym.sandboxes.docker.group import LABEL_GROUP_OF

    own = _docker("ps", "-aq", "--filter", f"name=^{sandbox_id}$")
    side, nets = leftovers(f"{LABEL_GROUP_OF}={sandbox_id}")
    return own + side, nets


async def test_two_service_task_through_the_server(tmp_path: Path) -> None:
    from sandgym.client.env_client import AsyncEnvClient
    from sandgym.sandboxes.docker.group import LABEL_GROUP_OF
    from sandgym.server.runner import BackgroundServer
    from sandgym.server.settings import ServerSettings

    task_id = make_task(tmp_path, "kv-" + uuid.uuid4().hex[:8], "")
    label = f"sandgym.task={task_id}"
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend="docker", task_dirs=[tmp_path], include_builtin=False
    )
    srv = BackgroundServer(settings)
    srv.start()
    try:
        async with AsyncEnvClient(srv.url, request_timeout_s=300) as env:
            # oracle: 1.0
            obs, info = await env.reset(task_id, seed=0)
            sid = info["sandbox_id"]
            # the first command sees the service up (Docker's health was waited for), by
            # name, from a sandbox whose agent phase has no network
            res = await env.step(
                {
                    "kind": "command",
                    "command": "curl -fsS -m 3 http://kv:8000/ready; echo; echo $FROM_COMPOSE",
                }
            )
            assert res.observation["exit_code"] == 0, res.observation["output"]
            assert res.observation["output"].split() == ["kv", "yes"]
            # the group: main + kv on one network of its own, all labelled
            containers, networks = await asyncio.to_thread(leftovers, f"{LABEL_GROUP_OF}={sid}")
            assert len(containers) == 1 and len(networks) == 1, (containers, networks)
            res = await env.step(
                {"kind": "command", "command": "curl -fsS -X PUT --data 42 http://kv:8000/answer"}
            )
            assert res.observation["exit_code"] == 0, res.observation["output"]
            res = await env.step({"kind": "submit"})
            assert res.terminated and res.reward == 1.0, res.info
            # no-op: 0.0 (a fresh group: the stored value went with the last one)
            _, info2 = await env.reset(task_id, seed=0)
            res = await env.step({"kind": "submit"})
            assert res.terminated and res.reward == 0.0, res.info
            await env.close()
        # nothing left of either episode's group after its close (the pool may already hold a
        # fresh replacement for the next episode: that one goes when the server stops)
        for closed in (sid, info2["sandbox_id"]):
            await wait_until_in_thread(
                lambda c=closed: group_left(c) == ([], []), 30, 0.3, f"nothing left of {closed}"
            )
    finally:
        srv.stop()
    assert await asyncio.to_thread(leftovers, label) == ([], [])


async def test_healthcheck_that_never_passes_fails_the_reset(tmp_path: Path) -> None:
    from sandgym.client.env_client import AsyncEnvClient, EnvError
    from sandgym.server.runner import BackgroundServer
    from sandgym.server.settings import ServerSettings

    task_id = make_task(tmp_path, "sick-" + uuid.uuid4().hex[:8], HEALTH_FAIL, services=False)
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend="docker", task_dirs=[tmp_path], include_builtin=False
    )
    srv = BackgroundServer(settings)
    srv.start()
    try:
        async with AsyncEnvClient(srv.url, request_timeout_s=300) as env:
            with pytest.raises(EnvError) as err:
                await env.reset(task_id, seed=0)
        msg = str(err.value)
        assert "healthcheck" in msg and "kv-store-not-ready-42" in msg, msg
        assert "failed 2 times in a row" in msg, msg
        assert err.value.code == "internal", err.value.code
    finally:
        srv.stop()
    assert await asyncio.to_thread(leftovers, f"sandgym.task={task_id}") == ([], [])


async def test_sigkilled_server_leaves_a_group_the_restarted_one_reaps(tmp_path: Path) -> None:
    from sandgym.client.env_client import AsyncEnvClient
    from sandgym.sandboxes.docker.group import LABEL_GROUP_OF
    from sandgym.server.runner import ServerProcess

    task_id = make_task(tmp_path, "kvkill-" + uuid.uuid4().hex[:8], "")
    label = f"sandgym.task={task_id}"

    def start() -> ServerProcess:
        return ServerProcess(
            "docker",
            args=["--tasks", str(tmp_path)],
            env={"SANDGYM_INCLUDE_BUILTIN": "false"},
            startup_timeout_s=120,
        )

    srv = await asyncio.to_thread(start)
    restarted = None
    try:
        env = AsyncEnvClient(srv.url, request_timeout_s=300, reconnect_backoff_s=0.05)
        _, info = await env.reset(task_id, seed=0)
        sid = info["sandbox_id"]
        srv.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(srv.proc.wait, 30)
        with contextlib.suppress(Exception):
            await env.drop_connection()
        # SIGKILL ran no cleanup: the whole group is still there
        containers, networks = await asyncio.to_thread(leftovers, label)
        assert len(containers) == 2 and len(networks) == 1, (containers, networks)
        side, _ = await asyncio.to_thread(leftovers, f"{LABEL_GROUP_OF}={sid}")
        assert len(side) == 1
        restarted = await asyncio.to_thread(start)
        await wait_until_in_thread(
            lambda: leftovers(label) == ([], []), 30, 0.3, "the restarted server to reap the group"
        )
    finally:
        await asyncio.to_thread(srv.stop)
        if restarted is not None:
            await asyncio.to_thread(restarted.stop)
    assert await asyncio.to_thread(leftovers, label) == ([], [])


async def test_healthcheck_delays_the_sandbox_until_it_passes() -> None:
    """The sandbox's own healthcheck (Harbor's [environment] healthcheck) holds creation back:
    it polls for a file that this test puts into the container 1.5 s after it appears;
    `create` returns only after that, and the first command sees the file."""
    from sandgym.sandboxes import SandboxSpec
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.services import HealthcheckSpec

    owner = "test-health-" + uuid.uuid4().hex[:6]
    backend = DockerBackend(owner_id=owner)
    spec = SandboxSpec(
        healthcheck=HealthcheckSpec(
            command="test -f /tmp/go", interval_s=0.2, start_interval_s=0.2, retries=100
        )
    )
    released: list[float] = []

    async def release() -> None:
        def mine() -> list[str]:
            return _docker("ps", "-q", "--filter", f"label=sandgym.owner={owner}")

        await wait_until_in_thread(lambda: bool(mine()), 60, 0.3, "the container")
        await asyncio.sleep(1.5)
        await asyncio.to_thread(_docker, "exec", mine()[0], "touch", "/tmp/go")
        released.append(time.monotonic())

    try:
        releaser = asyncio.create_task(release())
        sb = await backend.create(spec)
        done = time.monotonic()
        await releaser
        assert released and done >= released[0], "create returned before the healthcheck passed"
        assert (await sb.exec("test -f /tmp/go")).exit_code == 0
        await sb.close()
    finally:
        await backend.reap(only_expired=False)
        await backend.aclose()


async def test_a_service_image_the_engine_lacks_is_named_by_its_cause() -> None:
    """A compose service naming an image the engine does not hold (Terminal-Bench 1's
    security-vulhub-minio: `vulhub/minio:...`; no registry is used) fails the creation with
    the cause `image_missing`, which tells it from an engine fault (retried) and from a failed
    build; nothing of the group is left."""
    from sandgym.sandboxes import SandboxCreateError, SandboxSpec
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.services import ServiceSpec

    absent = "sandgym-test/absent-" + uuid.uuid4().hex[:8] + ":never"
    owner = "test-noimg-" + uuid.uuid4().hex[:6]
    backend = DockerBackend(owner_id=owner)
    spec = SandboxSpec(services=(ServiceSpec(name="store", image=absent),))
    try:
        with pytest.raises(SandboxCreateError) as info:
            await backend.create(spec)
        assert info.value.cause == "image_missing", info.value.cause
        assert f"service 'store': image '{absent}' is not present" in str(info.value)
        assert leftovers(f"sandgym.owner={owner}") == ([], [])
    finally:
        await backend.reap(only_expired=False)
        await backend.aclose()

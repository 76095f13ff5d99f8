"""Security checks through a real server: token auth on every endpoint, reward tampering,
path traversal through the file actions and through symlinks, task loading runs no host code.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.sandboxes import get_backend
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings
from sandgym.tasks import TaskRegistry, load_task_dir
from sandgym.tasks.errors import TaskError
from tests.reliability.conftest import REL_TASK, docker_ready, local_ready

TOKEN = "s3cret-token"
BACKENDS = [
    pytest.param(
        "local", marks=pytest.mark.skipif(not local_ready(), reason="bubblewrap not installed")
    ),
    pytest.param(
        "docker",
        marks=[
            pytest.mark.docker,
            pytest.mark.skipif(not docker_ready(), reason="no Docker engine or image"),
        ],
    ),
]


def server(backend: str, task_dirs: list[Path], **kw: object) -> BackgroundServer:
    settings = ServerSettings(
        host="127.0.0.1", port=0, backend=backend, task_dirs=task_dirs, include_builtin=False, **kw
    )
    be = get_backend("null") if backend == "null" else None
    return BackgroundServer(settings, be)


# -- token auth --------------------------------------------------------------------------------
async def test_token_required_on_every_endpoint(rel_tasks: Path) -> None:
    with server("null", [rel_tasks], token=TOKEN) as srv:
        # Every route the app has, not a hand-kept list: a new endpoint is covered at once.
        http_routes = [
            (m, r.path)
            for r in srv.app.routes
            if isinstance(r, APIRoute | Route) and not isinstance(r, APIWebSocketRoute)
            for m in sorted((r.methods or set()) - {"HEAD"})
        ]
        assert {p for _, p in http_routes} >= {
            "/healthz", "/metrics", "/v1/tasks", "/v1/pool", "/v1/sessions", "/v1/pool/prewarm",
        }  # fmt: skip
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for method, path in http_routes:
                body = {"task_ids": [REL_TASK], "count": 0} if method == "POST" else None
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                    r = await http.request(method, path, json=body, headers=headers)
                    if path == "/healthz":
                        assert r.status_code == 200
                    else:
                        assert r.status_code == 401, (method, path, headers, r.status_code)
                good = {"Authorization": f"Bearer {TOKEN}"}
                r = await http.request(method, path, json=body, headers=good)
                assert r.status_code < 400, (method, path, r.status_code, r.text[:200])
        # Websocket: refused with 4401 without the token or with a wrong one.
        for headers in (None, {"Authorization": "Bearer wrong"}):
            async with connect(srv.url, additional_headers=headers) as ws:
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.send(json.dumps({"type": "close", "request_id": "1"}))
                    await asyncio.wait_for(ws.recv(), 10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        with pytest.raises(EnvError) as err:
            async with AsyncEnvClient(srv.url, token="wrong") as c:
                await c.reset(REL_TASK)
        assert err.value.code == "unauthorized"
        async with AsyncEnvClient(srv.url, token=TOKEN) as c:
            await c.reset(REL_TASK)
            assert (await c.step("echo hi")).observation["output"] == "hi\n"


# -- reward tampering through the server ---------------------------------------------------------
FORGE = (
    "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
    "echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
    "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
    "chmod -R a-w /logs/verifier /tests"
)
#: A daemon left behind that kills anything running from /tests (the verifier).
VERIFIER_KILLER = (
    "nohup setsid sh -c 'while :; do pkill -9 -f /tests/ ; sleep 0.01; done' >/dev/null 2>&1 &"
)


@pytest.fixture(params=BACKENDS)
def tamper_server(request: pytest.FixtureRequest, rel_tasks: Path) -> Iterator[BackgroundServer]:
    with server(request.param, [rel_tasks]) as srv:
        yield srv


async def submit_after(url: str, actions: list[dict[str, object] | str]) -> float | str:
    """Reward of an episode that did `actions` then submitted (or the error code)."""
    async with AsyncEnvClient(url, request_timeout_s=180) as c:
        await c.reset(REL_TASK)
        for a in actions:
            await c.step(a)
        try:
            final = await c.step({"kind": "submit"})
        except EnvError as exc:
            return exc.code
        assert final.terminated
        return final.reward


async def test_agent_cannot_change_its_reward(tamper_server: BackgroundServer) -> None:
    url = tamper_server.url
    # Forged reward files and a planted test script, by command and by file actions.
    assert await submit_after(url, [FORGE]) == 0.0
    forged_files: list[dict[str, object] | str] = [
        {"kind": "write_file", "path": "/logs/verifier/reward.txt", "content": "1\n"},
        {"kind": "write_file", "path": "/logs/verifier/reward.json", "content": '{"reward":1}'},
        {"kind": "write_file", "path": "/tests/test.sh", "content": "echo 1 > /logs/verifier/reward.txt\n", "mode": 0o755},
    ]  # fmt: skip
    assert await submit_after(url, forged_files) == 0.0
    # Killing the verifier yields no reward (0 or a verifier error), never a forged 1.
    assert await submit_after(url, [VERIFIER_KILLER, "sleep 0.2"]) in (0.0, "verifier_error")
    # The honest path still scores: tampering after solving does not lower the reward.
    assert await submit_after(url, ["echo hello > /app/hello.txt", FORGE]) == 1.0


#: A daemon left behind that waits for the verifier to start, then keeps swapping in a forged
#: reward file by atomic rename (so the verifier never reads a half-written one).
REWARD_RACER = (
    "nohup setsid bash -c 'while [ ! -f /tests/test.sh ]; do :; done; "
    "while :; do echo 1 > /tmp/.r; mv -f /tmp/.r /logs/verifier/reward.txt 2>/dev/null; done' "
    ">/dev/null 2>&1 &"
)


#: A daemon that tries every way it has at the verifier's files, from the moment it starts:
#: the shared paths, the verifier's /proc/PID/root, joining its mount namespace, and swapping
#: the directories under the verifier's mounts (removing or renaming them).
REWARD_SIEGE = (
    "nohup setsid bash -c 'while :; do "
    "echo 1 > /logs/verifier/reward.txt; echo 1 > /tmp/.r; "
    "for p in /proc/[0-9]*; do "
    "cp /tmp/.r $p/root/logs/verifier/reward.txt 2>/dev/null; "
    'printf "echo 1 > /logs/verifier/reward.txt\\n" > $p/root/tests/test.sh 2>/dev/null; '
    "nsenter -t ${p#/proc/} -m cp /tmp/.r /logs/verifier/reward.txt 2>/dev/null; "
    "done; "
    "mv /logs /logs.x 2>/dev/null; mv /tests /tests.x 2>/dev/null; "
    "rm -rf /logs/verifier /tests 2>/dev/null; mkdir -p /logs/verifier /tests; "
    'printf "echo 1 > /logs/verifier/reward.txt\\n" > /tests/test.sh; '
    "done' >/dev/null 2>&1 &"
)


@pytest.mark.parametrize("daemon", [REWARD_RACER, REWARD_SIEGE], ids=["racer", "siege"])
async def test_daemon_racing_the_reward_file_gains_nothing(
    tamper_server: BackgroundServer, daemon: str
) -> None:
    """Local: the verifier's private mount namespace; docker: its own container from a
    snapshot of the sandbox (DockerSandbox.exec_private), in the sandbox's process namespace but
    holding a capability the daemon lacks. The daemon reaches neither."""
    rewards = [await submit_after(tamper_server.url, [daemon, "sleep 0.3"]) for _ in range(3)]
    assert all(r in (0.0, "verifier_error") for r in rewards), rewards
    # the same daemon beside an honest solution: the verifier still sees the real answer
    assert await submit_after(tamper_server.url, [daemon, "echo hello > /app/hello.txt"]) == 1.0


SERVICE_TASK = "svc-task"


@pytest.fixture(scope="module")
def service_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A task whose tests query a service the agent must leave running on localhost."""
    root = tmp_path_factory.mktemp("svctasks")
    t = root / SERVICE_TASK
    (t / "tests").mkdir(parents=True)
    (t / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 30\n[environment]\n'
        'docker_image = "sandgym/terminal:latest"\ncpus = 1\nmemory_mb = 256\n'
    )
    (t / "instruction.md").write_text(
        "Serve /app over HTTP on 127.0.0.1:8124; /app/answer.txt holds 42\n"
    )
    (t / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        "got=$(python3 -c 'import urllib.request as u; "
        'print(u.urlopen("http://127.0.0.1:8124/answer.txt", timeout=5).read().decode().strip())\' '
        "2>/dev/null)\n"
        'if [ "$got" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    )
    return root


@pytest.mark.parametrize("backend", BACKENDS)
async def test_tests_can_query_a_service_the_agent_left_running(
    backend: str, service_tasks: Path
) -> None:
    """The private verifier still reaches the agent's services (docker: its own container
    shares the sandbox's network namespace); without the service the task fails."""
    serve = "cd /app && (nohup python3 -m http.server 8124 --bind 127.0.0.1 >/dev/null 2>&1 &)"
    wait = (
        "for i in $(seq 50); do python3 -c 'import socket; "
        'socket.create_connection(("127.0.0.1", 8124))\' 2>/dev/null && break; sleep 0.1; done'
    )
    with server(backend, [service_tasks]) as srv:
        async with AsyncEnvClient(srv.url, request_timeout_s=180) as c:
            await c.reset(SERVICE_TASK)
            await c.step(f"echo 42 > /app/answer.txt && {serve} && {wait}")
            assert (await c.step({"kind": "submit"})).reward == 1.0
        async with AsyncEnvClient(srv.url, request_timeout_s=180) as c:
            await c.reset(SERVICE_TASK)
            await c.step("echo 42 > /app/answer.txt")  # the file, but no service
            assert (await c.step({"kind": "submit"})).reward == 0.0


async def test_agent_processes_hold_no_capabilities(tamper_server: BackgroundServer) -> None:
    """The agent is root of its sandbox without capabilities (local: dropped on entering the
    user namespace; docker: the container's reduced set), never with CAP_SYS_ADMIN."""
    async with AsyncEnvClient(tamper_server.url, request_timeout_s=120) as c:
        await c.reset(REL_TASK)
        out = (await c.step("grep CapEff /proc/self/status")).observation["output"]
        eff = int(out.split()[1], 16)
        assert not eff & (1 << 21), out  # CAP_SYS_ADMIN
        if tamper_server.settings.backend == "local":
            assert eff == 0, out


# -- path traversal through the file actions and symlinks ----------------------------------------
@pytest.fixture
def host_secret() -> Iterator[Path]:
    p = Path(f"/tmp/sandgym-host-secret-{secrets.token_hex(4)}")
    p.write_text("HOSTSECRET\n")
    yield p
    p.unlink(missing_ok=True)


async def test_file_actions_cannot_leave_the_sandbox(
    tamper_server: BackgroundServer, host_secret: Path
) -> None:
    planted = Path(f"/tmp/sandgym-escape-{secrets.token_hex(4)}")
    async with AsyncEnvClient(tamper_server.url, request_timeout_s=120) as c:
        await c.reset(REL_TASK)
        # Symlinks made inside the sandbox that point at host paths (absolute and relative).
        await c.step(
            f"ln -s / /app/root; ln -s {host_secret} /app/abs; "
            f"ln -s ../../../../../../..{host_secret} /app/rel; ln -s /tmp /app/tmpdir; "
            "ln -s /proc/1/root /app/p1"
        )
        reads = [
            str(host_secret), f"/../../../..{host_secret}", f"/app/../../..{host_secret}",
            f"/app/root{host_secret}", "/app/abs", "/app/rel", f"/app/tmpdir/{host_secret.name}",
            f"/app/p1{host_secret}",
        ]  # fmt: skip
        for path in reads:
            try:
                res = await c.step({"kind": "read_file", "path": path})
                out = res.observation["output"]
            except EnvError as exc:
                out = f"{exc.code}: {exc.message}"
            assert "HOSTSECRET" not in out, (path, out)
        writes = [
            str(planted), f"/../../..{planted}", f"/app/root{planted}",
            f"/app/tmpdir/{planted.name}", f"/app/p1{planted}",
        ]  # fmt: skip
        for path in writes:
            try:
                await c.step({"kind": "write_file", "path": path, "content": "PWNED"})
            except EnvError as exc:
                assert exc.code == "invalid_message", exc
            assert not await asyncio.to_thread(planted.exists), path
        # A symlink the agent plants in place of a file the host writes through.
        await c.step(f"ln -sf {host_secret} /app/target")
        try:
            await c.step({"kind": "write_file", "path": "/app/target", "content": "PWNED"})
        except EnvError as exc:
            assert exc.code == "invalid_message", exc
        assert await asyncio.to_thread(host_secret.read_text) == "HOSTSECRET\n"


def harbor_task(root: Path, name: str, dockerfile: str = "FROM sandgym/terminal\n") -> Path:
    t = root / name
    (t / "environment").mkdir(parents=True)
    (t / "tests").mkdir()
    (t / "task.toml").write_text('version = "1.0"\n')
    (t / "instruction.md").write_text("do it\n")
    (t / "environment" / "Dockerfile").write_text(dockerfile)
    (t / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return t


def test_task_dir_symlinks_out_of_the_task_are_refused(tmp_path: Path, host_secret: Path) -> None:
    # COPY of a build-context symlink that points out of the context.
    t = harbor_task(tmp_path, "copy-escape", "FROM sandgym/terminal\nCOPY leak /app/leak\n")
    (t / "environment" / "leak").symlink_to(host_secret)
    with pytest.raises(TaskError, match="leaves the context|outside|symlink"):
        from sandgym.tasks.sandbox_spec import sandbox_spec_for

        sandbox_spec_for(load_task_dir(t))
    # Task files (instruction, tests) that are symlinks to host files.
    t2 = harbor_task(tmp_path, "instr-escape")
    (t2 / "instruction.md").unlink()
    (t2 / "instruction.md").symlink_to(host_secret)
    # refused, naming the link (an instruction read through it would hand the host file to the
    # agent)
    with pytest.raises(TaskError, match=r"symlink instruction\.md .*points outside"):
        load_task_dir(t2)


def test_task_dir_symlinks_do_not_reach_the_sandbox(tmp_path: Path, host_secret: Path) -> None:
    """A task's tests/ holding a symlink to a host file: the verifier's copy of tests/ would
    carry the host file's content into the sandbox (where an agent's daemon could read it). The
    loader refuses the task, naming the link; a task that loaded would be a failure here, not a
    pass (this test returned early on either outcome before)."""
    t = harbor_task(tmp_path, "tests-escape")
    (t / "tests" / "leak").symlink_to(host_secret)
    with pytest.raises(TaskError, match=r"symlink tests/leak .*points outside the task directory"):
        load_task_dir(t)


def test_loading_task_dirs_runs_no_host_code(tmp_path: Path) -> None:
    marker = tmp_path / "EXECUTED"
    hostile = textwrap.dedent(
        f"""\
        #!/bin/sh
        touch {marker}
        """
    )
    t = harbor_task(tmp_path / "tasks", "hostile", f"FROM sandgym/terminal\nRUN touch {marker}\n")
    (t / "tests" / "test.sh").write_text(hostile)
    (t / "solution").mkdir()
    (t / "solution" / "solve.sh").write_text(hostile)
    for name in ("__init__.py", "conftest.py", "setup.py", "task.py"):
        (t / name).write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (t / "environment" / "docker-compose.yaml").write_text(
        f"services:\n  main:\n    command: touch {marker}\n"
    )
    tb = tmp_path / "tasks" / "tb-hostile"
    tb.mkdir()
    (tb / "task.yaml").write_text(f"instruction: do it\nsetup: touch {marker}\n")
    (tb / "Dockerfile").write_text(f"FROM sandgym/terminal\nRUN touch {marker}\n")
    (tb / "run-tests.sh").write_text(hostile)
    (tb / "solution.sh").write_text(hostile)
    reg = TaskRegistry([tmp_path / "tasks"], include_builtin=False)
    ids = reg.ids()
    assert "hostile" in ids
    from sandgym.tasks.sandbox_spec import sandbox_spec_for

    for tid in ids:
        sandbox_spec_for(reg.get(tid))
    # Through the server too: startup loads the directory, /v1/tasks lists it.
    with server("null", [tmp_path / "tasks"]) as srv:
        assert "hostile" in httpx.get(f"{srv.http_url}/v1/tasks").json()["tasks"]
    assert not marker.exists(), "loading a task directory executed code on the host"
    assert shutil.which("sh") is not None and os.access(t / "tests" / "test.sh", os.R_OK)


@pytest.mark.skipif(not local_ready(), reason="bubblewrap not installed")
async def test_local_sandbox_cannot_read_host_secrets_in_shared_etc() -> None:
    """The local backend shares the host's /etc read-only; its secret files read as empty
    (sandbox root is host root in the user namespace when the server runs as root)."""
    from sandgym.sandboxes.local import _host_secret_files
    from sandgym.sandboxes.spec import SandboxSpec

    secrets_here = _host_secret_files()
    # the skip is for a host without such files, never for a lookup that misses them
    shadows = ("/etc/shadow", "/etc/gshadow")
    on_host = {p for p in shadows if await asyncio.to_thread(os.path.isfile, p)}
    assert on_host <= set(secrets_here), (on_host, secrets_here)
    if not secrets_here:
        pytest.skip("no host secret files here to hide")
    backend = get_backend("local")
    sb = await backend.create(SandboxSpec(memory_mb=128))
    try:
        for path in secrets_here:
            r = await sb.exec(f"cat {path} 2>/dev/null | wc -c")
            assert r.stdout.strip() == "0", (path, r)
        assert (await sb.exec("test -r /etc/passwd && echo shared")).stdout == "shared\n"
    finally:
        await sb.close()
        await backend.aclose()

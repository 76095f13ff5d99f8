"""A user's RL project with its own `tasks/`, `trainer/`, `integrations/`, `envserver/` (and
`sandboxes/`, `server/`, `client/`) packages, first on `sys.path`, takes sandgym beside them
with no collision (issue 57, item 4):

- a fresh interpreter, cwd the project and the project first on `PYTHONPATH`, imports
  `sandgym.client` and a door (`sandgym.integrations.skyrl`), makes `sandgym/Terminal-v0` with
  Gymnasium and plays `builtin/hello-file` to reward 1.0;
- the server it plays against is `python -m sandgym.cli serve --backend local`, started from the
  same project directory;
- neither process imports any of the user's packages (each one's `__init__` logs its import with
  the pid), and afterwards the user's own `tasks.registry`, `trainer.config`, ... are the ones a
  plain `import` finds, from the project's files.

Before the one-namespace move, sandgym's wheel installed top-level `tasks`, `trainer`, ...: the
user's `tasks` shadowed ours and the server failed late (`cannot import name 'TaskRegistry'`).
A bare `import tasks` put back into any sandgym module the server or the client loads fails this.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from sandgym.server.runner import free_port
from tests.waiting import wait_until

pytest.importorskip("skyrl_gym", reason="the SkyRL door needs sandgym[skyrl]")

#: the user's packages, each with a module whose name is one of ours
USER_MODULES = {
    "tasks": "registry",
    "trainer": "config",
    "integrations": "skyrl",
    "envserver": "app",
    "sandboxes": "pool",
    "server": "settings",
    "client": "env_client",
}

LOGGING_INIT = textwrap.dedent(
    """\
    import os
    with open(os.environ["USER_PKG_LOG"], "a") as log:
        log.write(f"{os.getpid()} {__name__}\\n")
    """
)

CLIENT = textwrap.dedent(
    """\
    import json, os, sys

    import gymnasium

    import sandgym.client
    import sandgym.integrations.skyrl

    env = gymnasium.make(
        "sandgym/Terminal-v0", server_url=os.environ["SERVER_URL"], task_id="builtin/hello-file"
    )
    try:
        env.reset(seed=0)
        env.step("echo 'Hello, world!' > /app/hello.txt")
        _, reward, terminated, truncated, _ = env.step({"kind": "submit"})
    finally:
        env.close()
    users = sorted(os.environ["USER_PACKAGES"].split(","))
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in users)
    mine = {}
    for package, module in json.loads(os.environ["USER_MODULES"]).items():
        m = __import__(f"{package}.{module}", fromlist=["MARK"])
        mine[package] = {"file": m.__file__, "mark": m.MARK}
    print(json.dumps({"reward": reward, "terminated": terminated, "truncated": truncated,
                      "leaked": leaked, "mine": mine, "pid": os.getpid()}))
    """
)


def make_user_project(root: Path) -> Path:
    """A project dir with the user's packages (logging each import) and the client script."""
    for package, module in USER_MODULES.items():
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(LOGGING_INIT)
        (root / package / f"{module}.py").write_text(f'MARK = "user {package}.{module}"\n')
    (root / "play.py").write_text(CLIENT)
    return root


async def test_a_user_project_with_our_package_names_runs_client_door_and_server(
    tmp_path: Path,
) -> None:
    project = make_user_project(tmp_path / "project")
    log = tmp_path / "user-imports.log"
    log.touch()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]),
        "USER_PKG_LOG": str(log),
        "USER_PACKAGES": ",".join(USER_MODULES),
        "USER_MODULES": json.dumps(USER_MODULES),
    }
    port = free_port("127.0.0.1")
    server_log = tmp_path / "server.log"  # a file, not a pipe nobody drains
    err = server_log.open("w")
    server = await asyncio.to_thread(
        subprocess.Popen,
        [
            sys.executable,
            "-m",
            "sandgym.cli",
            "serve",
            "--backend",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--pool-size",
            "1",
        ],  # fmt: skip
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    err.close()  # the child holds its own copy
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def healthy() -> bool:
                assert server.poll() is None, (
                    f"sandgym serve, started in the user project, exited with {server.returncode}:"
                    f" {server_log.read_text()[-3000:]}"
                )
                try:
                    return (await http.get("/healthz", timeout=1)).status_code == 200
                except httpx.HTTPError:
                    return False

            await wait_until(healthy, timeout_s=120, what="the server's /healthz")
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "play.py"],
            cwd=project,
            env={**env, "SERVER_URL": f"ws://127.0.0.1:{port}/v1/env"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"the user's script failed: {proc.stderr[-3000:]}"
        played = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(server.wait, 60)
        except subprocess.TimeoutExpired:
            server.kill()
            await asyncio.to_thread(server.wait)
    assert (played["reward"], played["terminated"], played["truncated"]) == (1.0, True, False)
    assert played["leaked"] == [], f"sandgym loaded the user's packages: {played['leaked']}"
    assert played["mine"] == {
        package: {
            "file": str(project / package / f"{module}.py"),
            "mark": f"user {package}.{module}",
        }
        for package, module in USER_MODULES.items()
    }
    # the only imports of the user's packages are the script's own, after the episode
    expected = {f"{played['pid']} {p}" for p in USER_MODULES}
    assert sorted(log.read_text().splitlines()) == sorted(expected), (
        f"expected only the user's script (pid {played['pid']}) to import its packages; the"
        f" server was pid {server.pid}; log: {log.read_text()}"
    )

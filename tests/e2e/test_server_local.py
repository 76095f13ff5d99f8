"""Full episodes through the server on the `local` backend (real bash in bubblewrap): the
oracle's actions score 1.0, a no-op scores 0.0, resume keeps the real shell's state, and a
Gymnasium env passes `check_env` against it."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
from gymnasium.utils.env_checker import check_env

from sandgym.cli.run_cli import oracle_actions
from sandgym.client.env_client import AsyncEnvClient
from sandgym.client.gym_env import RemoteEnv
from sandgym.tasks import TaskRegistry
from tests.e2e.conftest import NULL_TASK, local_available

pytestmark = pytest.mark.skipif(not local_available(), reason="bubblewrap (bwrap) not installed")


@pytest.fixture
def local_server(make_server):
    return make_server("local")


@pytest.mark.parametrize("task_id", ["builtin/hello-file", "builtin/tui-counter", NULL_TASK])
async def test_oracle_episode_scores_one(local_server, task_dir, task_id):
    task = TaskRegistry([task_dir]).get(task_id)
    async with AsyncEnvClient(local_server.url) as env:
        obs, info = await env.reset(task_id, seed=0)
        assert obs["output"].strip() and info["backend"] == "local"
        for action in oracle_actions(task):
            res = await env.step(action)
            assert not (res.terminated or res.truncated)
        final = await env.step({"kind": "submit"})
    assert final.terminated is True and final.reward == 1.0, final.info.get("verifier_output")
    assert final.info["verifier_s"] > 0


async def test_noop_episode_scores_zero(local_server):
    async with AsyncEnvClient(local_server.url) as env:
        await env.reset("builtin/hello-file")
        final = await env.step({"kind": "submit"})
    assert final.terminated is True and final.reward == 0.0


async def test_resume_keeps_real_shell_state(local_server):
    async with AsyncEnvClient(local_server.url, reconnect_backoff_s=0.01) as env:
        await env.reset(NULL_TASK)
        await env.step("export X=1; cd /tmp")
        await env.drop_connection()
        res = await env.step('echo "$X $(pwd)"')
        assert res.observation["output"].strip() == "1 /tmp"
        assert env.reconnects == 1


async def test_command_output_and_exit_code(local_server):
    async with AsyncEnvClient(local_server.url) as env:
        await env.reset(NULL_TASK)
        res = await env.step("echo out; echo err >&2; exit_code() { return 3; }; exit_code")
        assert "out" in res.observation["output"] and "err" in res.observation["output"]
        assert res.observation["exit_code"] == 3
        keys = await env.step({"kind": "keys", "keys": "echo typed\r"})
        assert "typed" in keys.observation["screen"]


def test_check_env_on_local(local_server):
    env = RemoteEnv(local_server.url, task_id=NULL_TASK)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


async def test_lost_submit_reply_is_recovered_after_resume(local_server):
    """The connection drops right after `submit` is sent: the client resumes and resends, and
    the server answers from its cache (the verifier does not run twice)."""
    async with AsyncEnvClient(local_server.url, reconnect_backoff_s=0.01) as env:
        await env.reset("builtin/hello-file")
        await env.step("echo 'Hello, world!' > /app/hello.txt")
        ws = env._ws
        assert ws is not None
        original_recv = ws.recv

        async def drop_then_recv(*a, **kw):  # the reply is lost with the connection
            await ws.close()
            return await original_recv(*a, **kw)

        ws.recv = drop_then_recv  # type: ignore[method-assign]
        final = await env.step({"kind": "submit"})
    assert env.reconnects == 1
    assert final.terminated is True and final.reward == 1.0


def test_sandgym_run_cli_oracle(capsys):
    from sandgym.cli import main

    rc = main(["run", "--task", "builtin/hello-file", "--backend", "local", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert rc == 0 and record["reward"] == 1.0 and record["error"] is None
    kinds = [s["action"]["kind"] for s in record["steps"]]
    assert kinds == ["write_file", "command", "submit"]


@pytest.mark.skipif(
    not all(shutil.which(p) for p in ("Xvfb", "xdotool")), reason="no Xvfb/xdotool on this host"
)
async def test_desktop_task_episode(local_server):
    task = TaskRegistry().get("builtin/desktop-press-button")
    async with AsyncEnvClient(local_server.url) as env:
        obs, info = await env.reset(task.id, seed=0)
        assert info["desktop"] is True and obs["output"].strip()
        assert base64.b64decode(obs["image"]).startswith(b"\x89PNG")
        click = await env.step({"kind": "move", "x": 5, "y": 5})
        assert click.observation["exit_code"] == 0 and click.observation["image"]
        for action in oracle_actions(task):
            await env.step(action)
        final = await env.step({"kind": "submit"})
    assert final.reward == 1.0, final.info.get("verifier_output")

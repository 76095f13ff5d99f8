"""OpenEnv's released client and validator (openenv==0.10.0, the dev extra's pin) against
`sandgym serve`'s OpenEnv wire endpoint (sandgym/server/openenv_wire.py), on the local backend.

The same task and seed give the same reward through OpenEnv's `GenericEnvClient` as through
sandgym's own `AsyncEnvClient`; `max_concurrent_envs` refuses a socket beyond it with OpenEnv's
`CAPACITY_REACHED`; a dropped socket's episode is resumed; OpenEnv's own runtime validator
(`openenv validate --url`) passes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from websockets.sync.client import connect

from sandgym.client.env_client import AsyncEnvClient
from sandgym.server.runner import BackgroundServer
from tests.e2e.conftest import REAL_BACKENDS

openenv_core = pytest.importorskip("openenv.core")

TASK = "builtin/hello-file"
SOLVE = {"kind": "command", "command": "printf 'Hello, world!\\n' > /app/hello.txt"}
SUBMIT = {"kind": "submit"}


def _sandgym_reward(url: str, actions: list[dict]) -> float:
    async def play() -> float:
        async with AsyncEnvClient(url) as env:
            await env.reset(TASK, seed=0)
            for a in actions:
                res = await env.step(a)
            return res.reward

    return asyncio.run(play())


@pytest.mark.parametrize("backend", REAL_BACKENDS[:1])
def test_openenv_client_runs_sandgym_episodes(
    backend: str, make_server: Callable[..., BackgroundServer]
) -> None:
    srv = make_server(backend, openenv_max_concurrent_envs=1)
    base = srv.http_url + "/openenv"
    rewards = {}
    with openenv_core.GenericEnvClient(base_url=base).sync() as env:
        first = env.reset(task_id=TASK, seed=0)
        assert "/app/hello.txt" in first.observation["output"]
        assert first.done is False and first.reward is None
        assert first.metadata["session_id"] in {s.session_id for s in srv.service.sessions_view()}
        assert env.state()["step_count"] == 0

        # max_concurrent_envs=1: a second OpenEnv session is refused as OpenEnv's server does
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            with openenv_core.GenericEnvClient(base_url=base).sync() as other:
                other.reset(task_id=TASK, seed=0)

        res = env.step(SOLVE)
        assert res.observation["exit_code"] == 0 and res.done is False
        assert env.state()["step_count"] == 1
        res = env.step(SUBMIT)
        assert res.done is True and res.metadata["terminated"] is True
        rewards["solved"] = res.reward

        env.reset(task_id=TASK, seed=0)  # a second episode on the same socket
        res = env.step(SUBMIT)
        rewards["noop"] = res.reward

        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"kind": "no-such-action"})
    assert rewards == {"solved": 1.0, "noop": 0.0}
    assert rewards["solved"] == _sandgym_reward(srv.url, [SOLVE, SUBMIT])
    assert rewards["noop"] == _sandgym_reward(srv.url, [SUBMIT])


@pytest.mark.parametrize("backend", REAL_BACKENDS[:1])
def test_openenv_socket_drop_resumes_and_http_routes(
    backend: str, make_server: Callable[..., BackgroundServer]
) -> None:
    from openenv.cli._validation import validate_running_environment

    srv = make_server(backend)
    ws_url = srv.url.split("/v1/")[0] + "/openenv/ws"
    with connect(ws_url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": TASK, "seed": 0}}))
        meta = json.loads(ws.recv())["data"]["metadata"]
        ws.send(json.dumps({"type": "step", "data": SOLVE}))
        assert json.loads(ws.recv())["data"]["observation"]["exit_code"] == 0
    # dropped without `close`: the episode waits for its resume
    query = f"?session_id={meta['session_id']}&resume_token={meta['resume_token']}"
    with connect(ws_url + query) as ws:
        ws.send(json.dumps({"type": "step", "data": SUBMIT}))
        reply = json.loads(ws.recv())
    assert reply["type"] == "observation" and reply["data"]["reward"] == 1.0, reply

    report = validate_running_environment(srv.http_url + "/openenv")
    assert report["passed"], report["summary"]
    assert report["mode"] == "simulation" and report["standard_profile"] == "openenv-http/1.x"

    import httpx

    body = {"action": SUBMIT, "task_id": TASK, "seed": 0}  # a fresh one-action episode
    r = httpx.post(srv.http_url + "/openenv/step", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["reward"] == 0.0 and r.json()["done"] is True
    r = httpx.post(srv.http_url + "/openenv/reset", json={"task_id": "no/such"}, timeout=60)
    assert r.status_code == 404 and r.json()["detail"]["code"] == "unknown_task"
    assert srv.service.sessions_view() == []

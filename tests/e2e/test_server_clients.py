"""The Python clients end to end: `gymnasium.make("sandgym/Terminal-v0")` and `check_env`,
and `run_episodes` streaming results as they finish (null backend)."""

from __future__ import annotations

import asyncio
import contextlib

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import sandgym.client
from sandgym.client.env_client import EnvError
from sandgym.client.episode_loop import EpisodeRequest, EpisodeState, run_episodes
from sandgym.client.gym_env import RemoteEnv
from tests.e2e.conftest import NULL_TASK
from tests.waiting import wait_until


def test_gymnasium_make_and_check_env(null_server):
    env = gymnasium.make(sandgym.client.ENV_ID, server_url=null_server.url, task_id=NULL_TASK)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        obs, info = env.reset(seed=3)
        assert env.observation_space.contains(obs)
        assert "Write hello" in obs["output"] and info["seed"] == 3
        obs, reward, terminated, truncated, info = env.step("echo hi")
        assert obs["output"] == "hi\n" and int(obs["exit_code"]) == 0
        assert (reward, terminated, truncated) == (0.0, False, False)
        obs, *_ = env.step({"kind": "read_file", "path": "/app/missing"})
        assert int(obs["exit_code"]) == 1
        assert env.action_space.contains("ls -la") and env.action_space.sample()
    finally:
        env.close()


def test_remote_env_surfaces_server_errors(null_server):
    env = RemoteEnv(null_server.url, task_id="no/such-task")
    try:
        with pytest.raises(EnvError) as exc:
            env.reset()
        assert exc.value.code == "unknown_task"
    finally:
        env.close()


async def test_run_episodes_streams_results(null_server):
    # Episode 0 is held until the consumer has received the other five results: only a
    # run_episodes that yields episodes as they finish gets there (one that yields in submission
    # order would wait on episode 0 and time out, then yield it first).
    others_received = asyncio.Event()

    async def agent(state: EpisodeState):
        if state.steps:
            return None  # submit after one command
        if state.request.seed == 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(others_received.wait(), 30)
        return f"echo {state.request.seed}"

    episodes = [EpisodeRequest(NULL_TASK, seed=i) for i in range(6)]
    order = []
    async for res in run_episodes(null_server.url, episodes, agent, concurrency=3):
        order.append(res.seed)
        if len(order) == 5:
            others_received.set()
        # the null backend's fake shell cannot run the verifier: submit fails with a code, a
        # server fault, so the episode is masked (no reward), never scored 0
        assert res.error is not None and res.code == "internal"
        assert (res.outcome, res.reward) == ("masked", None)
        assert res.steps[0]["observation"]["output"] == f"{res.seed}\n"
    assert sorted(order) == list(range(6))
    assert order[-1] == 0  # yielded as finished, not in submission order


async def test_client_prewarms_and_reads_typed_info(null_server):
    """`AsyncEnvClient.prewarm` fills the pool (the next reset is a hit, as its typed info says);
    a refused prewarm raises the server's code; an unreachable server raises
    `ConnectionLostError`."""
    from sandgym.client.env_client import AsyncEnvClient, ConnectionLostError
    from sandgym.wire.protocol import PrewarmReply, ResetInfo

    async with AsyncEnvClient(null_server.url) as env:
        reply = await env.prewarm([NULL_TASK], count=2)
        assert reply == PrewarmReply(scheduled=1, count=2)
        await wait_until(  # the pool fills in the background
            lambda: null_server.service.pool.snapshot().totals.ready == 2,
            10.0, 0.02, "two ready sandboxes",
        )  # fmt: skip
        _, info = await env.reset(NULL_TASK, seed=4)
        assert isinstance(env.reset_info, ResetInfo)
        assert env.reset_info.from_pool is True and info["from_pool"] is True
        assert (env.reset_info.task_id, env.reset_info.seed) == (NULL_TASK, 4)
        res = await env.step("echo hi")
        assert res.typed_info.step == 1 and res.typed_info.action_s is not None
        with pytest.raises(EnvError) as refused:
            await env.prewarm(["no/such-task"])
        assert refused.value.code == "unknown_task"
        assert not isinstance(refused.value, ConnectionLostError)
    nobody = AsyncEnvClient("ws://127.0.0.1:9/v1/env")  # the discard port: nothing listens
    with pytest.raises(ConnectionLostError):
        await nobody.prewarm([NULL_TASK])


async def test_invalid_reset_options_are_refused_by_the_client(null_server):
    from sandgym.client.env_client import AsyncEnvClient

    async with AsyncEnvClient(null_server.url) as env:
        with pytest.raises(EnvError) as exc:
            await env.reset(NULL_TASK, options={"group": {"id": "g", "size": 0}})
        assert exc.value.code == "invalid_message" and "group.size" in exc.value.message
        with pytest.raises(EnvError) as exc:
            await env.reset(NULL_TASK, options={"colour": "red"})
        assert exc.value.code == "invalid_message"
        assert not null_server.service.sessions  # nothing reached the server


async def test_a_dropped_connection_is_connection_lost(make_server):
    """A server that goes away mid-episode: the client's resume attempts fail, and it raises
    `ConnectionLostError` (still an `EnvError`), not a server error code alone."""
    from sandgym.client.env_client import AsyncEnvClient, ConnectionLostError

    srv = make_server("null")
    env = AsyncEnvClient(srv.url, max_reconnects=1, reconnect_backoff_s=0.01)
    try:
        await env.reset(NULL_TASK)
        srv.stop()
        with pytest.raises(ConnectionLostError) as exc:
            await env.step("echo hi")
        assert exc.value.retryable is True and "lost" in exc.value.message
    finally:
        env._ws = None  # the socket is gone with its server
        await env.close()


async def test_run_episodes_masks_a_server_killed_mid_episode(make_server):
    """A real server stopped between two of the agent's actions: the episode ends masked (no
    reward, the lost connection recorded), never scored 0.0 (issue 57: the one loop)."""
    from sandgym.client.env_client import ConnectionLostError

    srv = make_server("null")

    def agent(state: EpisodeState):
        if state.steps:
            srv.stop()  # the server dies with the episode running
        return "echo hi"

    results = [
        r
        async for r in run_episodes(
            srv.url, [NULL_TASK], agent,
            client_kwargs={"max_reconnects": 1, "reconnect_backoff_s": 0.01},
        )
    ]  # fmt: skip
    assert len(results) == 1
    res = results[0]
    assert [s["observation"]["output"] for s in res.steps] == ["hi\n"]
    assert (res.outcome, res.reward) == ("masked", None)
    assert isinstance(res.error, ConnectionLostError) and res.code == "sandbox_lost"

"""The one episode loop (sandgym/client/episode_loop.py) in each runner that uses it: a lost
connection mid-episode (the server killed) and a server fault end the episode masked (no
reward), never scored 0.0; a failure the agent can cause (`action_timeout`) ends it scored 0;
an episode the environment ends is scored with the server's reward.

Runners: `run_episodes`, `sandgym run` (`run_cli.play`), the trainer's `run_episode` and the
doors' `SyncEpisode`; each against tests/fakes/env_ws.py's server."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from sandgym.cli import run_cli
from sandgym.client.env_client import AsyncEnvClient, ConnectionLostError, EnvError
from sandgym.client.episode_loop import (
    EpisodeRequest,
    EpisodeState,
    LoopSession,
    classify,
    play_episode,
    run_episodes,
)
from sandgym.integrations import episode as sync_episode
from sandgym.trainer.episode import Episode
from sandgym.trainer.episode_runner import EpisodeSession, run_episode
from tests.fakes.env_ws import FakeEnvServer

#: a client that gives up on a dead server at once (the default retries for seconds)
FAST = {"max_reconnects": 1, "reconnect_backoff_s": 0.01}
COMMAND = {"kind": "command", "command": "echo hi"}


# -- run_episodes ------------------------------------------------------------------------------------
async def _run_episodes(fake: FakeEnvServer) -> Any:
    def agent(state: EpisodeState) -> dict[str, Any] | None:
        return None if state.steps else COMMAND  # one command, then submit

    results = [
        r
        async for r in run_episodes(
            fake.url, [EpisodeRequest("t", seed=1)], agent, client_kwargs=FAST
        )
    ]
    assert len(results) == 1
    return results[0]


async def test_run_episodes_masks_a_killed_server() -> None:
    async with FakeEnvServer("killed") as fake:
        res = await _run_episodes(fake)
    assert fake.killed, "the server was never killed"
    assert (res.outcome, res.reward) == ("masked", None)
    assert isinstance(res.error, ConnectionLostError) and res.code == "sandbox_lost"


async def test_run_episodes_masks_a_server_fault() -> None:
    async with FakeEnvServer("internal") as fake:
        res = await _run_episodes(fake)
    assert (res.outcome, res.reward, res.code) == ("masked", None, "internal")


async def test_run_episodes_scores_an_action_timeout_0_and_closes_the_episode() -> None:
    async with FakeEnvServer("action_timeout") as fake:
        res = await _run_episodes(fake)
        assert fake.closed == 1, "the episode the failure ended was not closed on the server"
    assert (res.outcome, res.reward, res.code) == ("agent_failure", 0.0, "action_timeout")


async def test_run_episodes_scores_what_the_server_scores() -> None:
    async with FakeEnvServer("scored") as fake:
        res = await _run_episodes(fake)
    assert (res.outcome, res.reward, res.terminated, res.error) == ("scored", 1.0, True, None)
    assert [s["action"]["kind"] for s in res.steps] == ["command", "submit"]


async def test_run_episodes_submits_at_the_step_limit() -> None:
    async with FakeEnvServer("scored") as fake:
        results = [r async for r in run_episodes(fake.url, ["t"], lambda s: COMMAND, max_steps=3)]
    assert [[s["action"]["kind"] for s in r.steps] for r in results] == [
        ["command", "command", "command", "submit"]
    ]
    assert results[0].reward == 1.0


# -- sandgym run ---------------------------------------------------------------------------------------
@pytest.fixture
def fast_run_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_cli, "AsyncEnvClient", functools.partial(AsyncEnvClient, **FAST))


@pytest.mark.usefixtures("fast_run_cli")
async def test_sandgym_run_masks_a_killed_server() -> None:
    async with FakeEnvServer("killed") as fake:
        record = await run_cli.play(fake.url, "t", [[COMMAND]], 0, None)
    assert fake.killed
    assert (record["outcome"], record["reward"]) == ("masked", None)
    assert record["error"]["code"] == "sandbox_lost" and "lost" in record["error"]["message"]


@pytest.mark.usefixtures("fast_run_cli")
async def test_sandgym_run_scores_an_action_timeout_0() -> None:
    async with FakeEnvServer("action_timeout") as fake:
        record = await run_cli.play(fake.url, "t", [[COMMAND]], 0, None)
    assert (record["outcome"], record["reward"]) == ("agent_failure", 0.0)
    assert record["error"]["code"] == "action_timeout"


@pytest.mark.usefixtures("fast_run_cli")
async def test_sandgym_run_records_a_scored_episode() -> None:
    async with FakeEnvServer("scored") as fake:
        record = await run_cli.play(fake.url, "t", [[COMMAND]], 0, None)
    assert (record["outcome"], record["reward"], record["error"]) == ("scored", 1.0, None)
    assert [s["action"]["kind"] for s in record["steps"]] == ["command", "submit"]
    assert record["instruction"] == "write hello to /app/hello.txt"


# -- the trainer's runner ------------------------------------------------------------------------------
async def _trainer_episode(fake: FakeEnvServer) -> Episode:
    async def play(session: EpisodeSession) -> str:
        await session.step(COMMAND)
        return "turn_limit"

    return await run_episode(
        lambda: AsyncEnvClient(fake.url, **FAST),
        Episode("t", 0),
        play,  # type: ignore[arg-type]
    )


async def test_the_trainer_masks_a_killed_server() -> None:
    async with FakeEnvServer("killed") as fake:
        ep = await _trainer_episode(fake)
    assert fake.killed
    assert ep.termination == "connection" and ep.is_infra_failure, ep.termination


async def test_the_trainer_scores_an_action_timeout_0() -> None:
    async with FakeEnvServer("action_timeout") as fake:
        ep = await _trainer_episode(fake)
    assert ep.termination == "action_timeout" and ep.reward == 0.0
    assert not ep.is_infra_failure and not ep.drops_group


async def test_the_trainer_submits_for_an_agent_at_its_turn_limit() -> None:
    async with FakeEnvServer("scored") as fake:
        ep = await _trainer_episode(fake)
    assert (ep.termination, ep.reward, ep.error) == ("turn_limit", 1.0, None)
    assert [s.action["kind"] for s in ep.trajectories[0].steps] == ["command", "submit"]
    assert ep.instruction == "write hello to /app/hello.txt"


# -- SyncEpisode (the TRL and SkyRL doors) ------------------------------------------------------------
@pytest.fixture
def fast_sync_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_episode, "AsyncEnvClient", functools.partial(AsyncEnvClient, **FAST))


def _act_once(url: str) -> tuple[BaseException | None, float | None, str | None, float | None]:
    """Reset, one command, then finish; (what act raised, the reward then, the failure, what
    finish returned or None when it raised)."""
    ep = sync_episode.SyncEpisode(url)
    try:
        ep.reset("t", seed=0)
        raised: BaseException | None = None
        try:
            ep.act(COMMAND)
        except Exception as exc:
            raised = exc
        reward_after_act = ep.reward
        try:
            final: float | None = ep.finish()
        except Exception:
            final = None
        return raised, reward_after_act, ep.failure, final
    finally:
        ep.close()


@pytest.mark.usefixtures("fast_sync_episode")
async def test_sync_episode_masks_a_killed_server() -> None:
    async with FakeEnvServer("killed") as fake:
        raised, reward, failure, final = await asyncio.to_thread(_act_once, fake.url)
    assert fake.killed
    assert isinstance(raised, sync_episode.InfrastructureError), raised
    assert (reward, failure, final) == (None, "sandbox_lost", None)


@pytest.mark.usefixtures("fast_sync_episode")
async def test_sync_episode_scores_an_action_timeout_0() -> None:
    async with FakeEnvServer("action_timeout") as fake:
        raised, reward, failure, final = await asyncio.to_thread(_act_once, fake.url)
    assert isinstance(raised, EnvError) and raised.code == "action_timeout", raised
    assert (reward, failure, final) == (0.0, "action_timeout", 0.0)


@pytest.mark.usefixtures("fast_sync_episode")
async def test_sync_episode_finishes_with_the_servers_reward() -> None:
    async with FakeEnvServer("scored") as fake:
        raised, reward, failure, final = await asyncio.to_thread(_act_once, fake.url)
    assert (raised, reward, failure, final) == (None, None, None, 1.0)
    assert [a["kind"] for a in fake.steps()] == ["command", "submit"]


# -- the loop itself -----------------------------------------------------------------------------------
async def test_the_loop_raises_what_is_not_the_environments() -> None:
    """A bug in an agent is not an episode ending: it propagates (the runner decides)."""

    async def play(session: LoopSession) -> None:
        raise ZeroDivisionError("agent bug")

    async with FakeEnvServer("scored") as fake:
        client = AsyncEnvClient(fake.url)
        try:
            with pytest.raises(ZeroDivisionError):
                await play_episode(client, "t", play)
        finally:
            await client.close()


def test_classify_reads_the_table() -> None:
    assert classify(EnvError("verifier_error", "x")) == "agent_failure"
    assert classify(EnvError("sandbox_lost", "x")) == "masked"
    assert classify(ConnectionLostError("internal", "refused", True)) == "masked"
    assert classify(OSError("reset by peer")) == "masked"

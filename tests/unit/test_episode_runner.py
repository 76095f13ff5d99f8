"""sandgym/trainer/episode_runner.py: the one episode loop every agent plays through (reset, the agent's
steps, submit to the end, failures classified by code) on a scripted env client."""

from __future__ import annotations

from typing import Any

from sandgym.client.env_client import EnvError, StepResult
from sandgym.trainer.episode import Episode
from sandgym.trainer.episode_runner import EpisodeSession, run_episode


class ScriptedClient:
    """Answers each step with the next scripted reply (a StepResult or an exception)."""

    def __init__(self, replies: list[Any], reset_errors: list[Exception] | None = None) -> None:
        self.replies = list(replies)
        self.reset_errors = list(reset_errors or [])
        self.actions: list[dict[str, Any]] = []
        self.resets = 0
        self.url = "ws://scripted/v1/env"

    async def __aenter__(self) -> ScriptedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def reset(self, task_id: str, seed: int | None = None, options: Any = None) -> Any:
        self.resets += 1
        if self.reset_errors:
            raise self.reset_errors.pop(0)
        return {"output": "Do the thing.", "exit_code": None, "screen": ""}, {}

    async def step(self, action: dict[str, Any]) -> StepResult:
        self.actions.append(action)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def _res(reward: float = 0.0, *, terminated: bool = False, truncated: bool = False,
         info: dict[str, Any] | None = None) -> StepResult:  # fmt: skip
    return StepResult({"output": "", "exit_code": 0, "screen": ""}, reward, terminated, truncated,
                      info or {})  # fmt: skip


def _multi(k: int, n: int, reward: float) -> StepResult:
    rewards = [1.0] * (k + 1)
    info = {"step": {"name": f"s{k}", "index": k, "count": n, "reward": 1.0, "rewards": rewards}}
    return _res(reward, terminated=k == n - 1, info=info)


async def _noop(session: EpisodeSession) -> Any:
    return "submitted"


async def test_an_episode_left_open_is_submitted_to_the_end() -> None:
    """A multi-step task: the agent stops, the loop submits once per step left."""
    client = ScriptedClient([_multi(0, 3, 0.0), _multi(1, 3, 0.0), _multi(2, 3, 0.75)])
    ep = await run_episode(lambda: client, Episode("t", 0), _noop)
    assert [a["kind"] for a in client.actions] == ["submit"] * 3
    assert (ep.termination, ep.reward, ep.step_rewards) == ("submitted", 0.75, [1.0, 1.0, 1.0])
    assert ep.instruction == "Do the thing." and ep.server_url == client.url
    assert len(ep.trajectories[0].steps) == 3 and ep.error is None


async def test_the_agents_answer_names_an_ending_and_the_server_may_cut_it() -> None:
    async def turn_limit(session: EpisodeSession) -> Any:
        await session.step({"kind": "command", "command": "ls"})
        return "turn_limit"

    client = ScriptedClient([_res(), _res(1.0, terminated=True)])
    ep = await run_episode(lambda: client, Episode("t", 0), turn_limit)
    assert (ep.termination, ep.reward) == ("turn_limit", 1.0)

    async def until_cut(session: EpisodeSession) -> Any:
        while not session.ended:
            await session.step({"kind": "command", "command": "ls"})
        return "turn_limit"

    client = ScriptedClient([_res(), _res(truncated=True)])
    ep = await run_episode(lambda: client, Episode("t", 0), until_cut)
    assert [a["kind"] for a in client.actions] == ["command", "command"]  # no submit after
    assert ep.termination == "env_truncated"


async def test_failures_are_recorded_by_code_and_scores_zeroed() -> None:
    lying = EnvError("verifier_error", "sandbox_lost: connection to ws://x lost")
    client = ScriptedClient([_res(), lying])

    async def one(session: EpisodeSession) -> Any:
        await session.step({"kind": "command", "command": "mkfifo out"})
        return "submitted"

    ep = await run_episode(lambda: client, Episode("t", 0), one)
    assert ep.termination == "verifier_error" and not ep.is_infra_failure
    assert ep.reward == 0.0 and ep.error is not None and "sandbox_lost" in ep.error

    async def finish(episode: Episode) -> None:
        raise RuntimeError("the harness made no model call")

    client = ScriptedClient([_res(1.0, terminated=True)])
    ep = await run_episode(lambda: client, Episode("t", 0), _noop, finish=finish)
    assert ep.termination == "error" and ep.is_infra_failure and ep.reward == 0.0


async def test_a_retryable_reset_is_retried() -> None:
    client = ScriptedClient(
        [_res(1.0, terminated=True)], reset_errors=[EnvError("capacity", "full", True)]
    )
    ep = await run_episode(lambda: client, Episode("t", 0), _noop, reset_retries=1)
    assert client.resets == 2 and ep.termination == "submitted"
    client = ScriptedClient([], reset_errors=[EnvError("unknown_task", "no such task")])
    ep = await run_episode(lambda: client, Episode("t", 0), _noop, reset_retries=3)
    assert client.resets == 1 and ep.termination == "error"

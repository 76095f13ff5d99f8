"""Agents and the episode runner against a scripted engine and a fake env client."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sandgym.client.env_client import ConnectionLostError, EnvError, StepResult, http_base
from sandgym.trainer.agents import TerminalAgent, format_observation, parse_action
from sandgym.trainer.algorithms import episode_to_samples
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines.base import Generation, InferenceEngine, SamplingParams
from sandgym.trainer.episode import Episode, Trajectory
from sandgym.trainer.failures import classify_failure
from sandgym.trainer.models import load_tokenizer
from sandgym.trainer.rollout import EpisodeRunner


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    cfg = TrainConfig.model_validate({"env": {"task_ids": ["t"]}, "model": {"source": "tiny"}})
    return load_tokenizer(cfg.model)


def _config(**agent: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "env": {
                "task_ids": ["builtin/x"],
                "server_urls": ["ws://a:1/v1/env", "ws://b:2/v1/env"],
            },
            "model": {"source": "tiny"},
            "agent": {"max_turns": 4, **agent},
            "sampling": {"max_new_tokens": 32},
        }
    )


class ScriptedEngine(InferenceEngine):
    """Replies with fixed texts in order (tokenised, + end token), logprob -1 per token."""

    def __init__(self, tokenizer: Any, replies: list[str], stop: bool = True) -> None:
        super().__init__(batch_wait_s=0.0)
        self.tok, self.replies, self.stop = tokenizer, list(replies), stop
        self.prompts: list[list[int]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            self.prompts.append(p)
            text = self.replies.pop(0) if self.replies else "hmm"
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            if self.stop:
                ids = ids + [self.tok.eos_token_id]
            out.append(Generation(ids, [-1.0] * len(ids), "stop" if self.stop else "length"))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class FakeClient:
    """Rewards 1 if `echo hi > hello.txt` ran before submit; can fail on a given step."""

    def __init__(self, fail_on_step: int | None = None, error: Exception | None = None) -> None:
        self.actions: list[dict[str, Any]] = []
        self.fail_on_step, self.error = fail_on_step, error

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def reset(self, task_id: str, seed: int | None = None, options: Any = None) -> Any:
        self.reset_options = options
        return {"output": "Create hello.txt containing hi.", "exit_code": None, "screen": ""}, {}

    async def step(self, action: dict[str, Any]) -> StepResult:
        self.actions.append(action)
        if self.fail_on_step is not None and len(self.actions) == self.fail_on_step:
            assert self.error is not None
            raise self.error
        if action["kind"] == "submit":
            ok = any("hello.txt" in a.get("command", "") for a in self.actions)
            return StepResult(
                {"output": "", "exit_code": None, "screen": ""}, float(ok), True, False, {}
            )
        return StepResult(
            {"output": "OUTPUT-MARKER\n" * 3, "exit_code": 0, "screen": ""}, 0.0, False, False, {}
        )


def _runner(
    tokenizer: Any, replies: list[str], client: FakeClient, **agent: Any
) -> tuple[EpisodeRunner, ScriptedEngine]:
    cfg = _config(**agent)
    engine = ScriptedEngine(tokenizer, replies)
    agent_obj = TerminalAgent(tokenizer, cfg.agent, cfg.sampling.max_new_tokens)
    return EpisodeRunner(cfg, engine, agent_obj, client_factory=lambda url: client), engine


def test_parse_action_conventions() -> None:
    assert parse_action("```bash\nls -la\n```").action == {"kind": "command", "command": "ls -la"}
    assert parse_action("```\npwd\n```").action == {"kind": "command", "command": "pwd"}
    p = parse_action('<tool_call>{"name": "bash", "arguments": {"command": "id"}}</tool_call>')
    assert p.action == {"kind": "command", "command": "id"} and not p.submit
    assert parse_action('```json\n{"command": "whoami"}\n```').action["command"] == "whoami"
    assert parse_action("All done. <submit/>").submit
    assert parse_action("submit").submit
    both = parse_action("```bash\necho x > f\n```\n<submit/>")
    assert both.action is not None and both.submit
    nothing = parse_action("I think I should submit the form later")
    assert nothing.action is None and not nothing.submit


def test_observation_is_capped_keeping_head_and_tail() -> None:
    text = format_observation({"output": "A" * 500 + "Z" * 500, "exit_code": 1}, max_chars=100)
    assert text.startswith("A") and "Z\n[exit code 1]" in text and "elided" in text
    assert len(text) < 200


async def test_multi_turn_episode_one_sequence_and_mask_on_generated_tokens(tokenizer: Any) -> None:
    client = FakeClient()
    runner, engine = _runner(
        tokenizer, ["Let me write it.\n```bash\necho hi > hello.txt\n```", "Done <submit/>"], client
    )
    ep = await runner.run_episode("builtin/x", 7, "g0")
    assert ep.termination == "submitted" and ep.reward == 1.0 and not ep.is_infra_failure
    assert [a["kind"] for a in client.actions] == ["command", "submit"]
    assert client.actions[0]["timeout_s"] == 30.0
    steps = ep.trajectories[0].steps
    # turn 2's prompt is turn 1's prompt + generated ids + the observation turn (a strict prefix)
    assert steps[1].prompt_ids[: len(steps[0].prompt_ids) + len(steps[0].response_ids)] == (
        steps[0].prompt_ids + steps[0].response_ids
    )
    samples = episode_to_samples(ep, 1.0)
    assert len(samples) == 1
    s = samples[0]
    generated = steps[0].response_ids + steps[1].response_ids
    assert [t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m] == generated
    masked_out = tokenizer.decode(
        [t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if not m]
    )
    assert "OUTPUT-MARKER" in masked_out and "Create hello.txt" in masked_out
    assert "OUTPUT-MARKER" not in tokenizer.decode(generated)
    # the merged sequence is exactly what the chat template renders for the whole chat
    assert s.input_ids == engine.prompts[1] + steps[1].response_ids


async def test_turn_limit_submits_and_hints_when_no_action(tokenizer: Any) -> None:
    client = FakeClient()
    runner, engine = _runner(tokenizer, ["no idea", "still nothing"], client, max_turns=2)
    ep = await runner.run_episode("builtin/x", 0)
    assert ep.termination == "turn_limit" and ep.reward == 0.0
    assert [a["kind"] for a in client.actions] == ["submit"]
    assert "No command found" in tokenizer.decode(engine.prompts[1])


async def test_context_budget_drops_oldest_turns(tokenizer: Any) -> None:
    client = FakeClient()
    replies = [f"```bash\necho step{i}\n```" for i in range(6)]
    runner, engine = _runner(tokenizer, replies, client, max_turns=6, max_context_tokens=200)
    ep = await runner.run_episode("builtin/x", 0)
    assert ep.termination == "turn_limit"
    budget = 200 - 32
    assert len(engine.prompts) == 6, "one prompt per turn, six turns"
    assert all(len(p) <= budget for p in engine.prompts[1:])
    last = tokenizer.decode(engine.prompts[-1])
    assert "Create hello.txt" in last and "step0" not in last  # task kept, oldest turn dropped
    assert len(episode_to_samples(ep, 1.0)) > 1  # dropping context starts a new sequence


@pytest.mark.parametrize(
    ("error", "reason", "masked"),
    [
        # failures the agent cannot cause: masked out of the group
        (EnvError("sandbox_lost", "container vanished"), "sandbox_lost", True),
        (
            ConnectionLostError("sandbox_lost", "connection to ws://x lost: EOF", True),
            "connection",
            True,
        ),
        (ConnectionResetError("reset by peer"), "connection", True),
        (EnvError("unknown_task", "no such task"), "error", True),
        (EnvError("internal", "internal error: KeyError"), "error", True),
        # failures the agent can cause: a failed episode, scored 0, recorded under their name
        (EnvError("action_timeout", "too slow"), "action_timeout", False),
        (
            EnvError("verifier_error", "[timeout] the verifier did not finish within 5 s"),
            "verifier_error",
            False,
        ),
        (EnvError("verifier_error", "[no_reward] test.sh exited 1"), "verifier_error", False),
    ],
)
async def test_failures_are_recorded_not_raised_and_masked_per_cause(
    tokenizer: Any, error: Exception, reason: str, masked: bool
) -> None:
    client = FakeClient(fail_on_step=1, error=error)
    runner, _ = _runner(tokenizer, ["```bash\nls\n```"], client)
    ep = await runner.run_episode("builtin/x", 0)
    assert ep.termination == reason and ep.error and ep.reward == 0.0
    assert ep.is_infra_failure is masked
    assert classify_failure(error) == reason
    if reason == "verifier_error":  # the verifier's cause stays in the record
        assert "[timeout]" in ep.error or "[no_reward]" in ep.error


async def test_a_verifier_error_at_submit_scores_zero_in_its_group(
    tokenizer: Any, tmp_path: Any
) -> None:
    """The FIFO case as the trainer sees it: the agent leaves something that makes the verifier
    time out; submit answers `verifier_error`. The episode must count as a 0 in its group (so the
    advantage of what it did is negative), not be dropped as if nothing happened."""
    from sandgym.trainer.algorithms import group_advantages
    from sandgym.trainer.train import Trainer

    fifo = EnvError("verifier_error", "[timeout] task t: the verifier did not finish within 3 s")
    client = FakeClient(fail_on_step=2, error=fifo)  # step 1: the command, step 2: submit
    runner, _ = _runner(tokenizer, ["```bash\nmkfifo /app/out.txt\n```\n<submit/>"], client)
    bad = await runner.run_episode("builtin/x", 0)
    assert [a["kind"] for a in client.actions] == ["command", "submit"]
    assert bad.termination == "verifier_error" and not bad.is_infra_failure
    good = Episode("builtin/x", 0, [Trajectory(reward=1.0)], termination="submitted")
    trainer = Trainer(_config(), tmp_path / "run")
    counts: Counter[str] = Counter()
    kept = trainer._admit_group([good, bad], counts)
    assert kept == [good, bad] and counts["__kept_groups"] == 1
    adv = group_advantages([e.reward for e in kept], "grpo")
    assert adv[1] < 0 < adv[0]


def test_admit_group_masks_infra_failures(tmp_path: Any) -> None:
    from sandgym.trainer.train import Trainer

    cfg = _config()
    trainer = Trainer(cfg, tmp_path / "run")
    ok = [Episode("t", 0, [Trajectory(reward=r)], termination="submitted") for r in (1.0, 0.0, 1.0)]
    lost = Episode("t", 0, [Trajectory(reward=0.0)], termination="sandbox_lost")
    counts: Counter[str] = Counter()
    kept = trainer._admit_group([*ok, lost], counts)
    assert kept == ok and counts["__kept_groups"] == 1
    assert trainer._admit_group([ok[0], lost, lost], counts) is None
    assert counts["__dropped_groups_infra"] == 1
    # agent-causable failures stay in the group as zeros
    for reason in ("verifier_error", "action_timeout"):
        failed = Episode("t", 0, [Trajectory(reward=0.0)], termination=reason)  # type: ignore[arg-type]
        assert trainer._admit_group([ok[0], failed, lost], counts) == [ok[0], failed]


def test_load_balancing_and_http_base(tokenizer: Any) -> None:
    runner, _ = _runner(tokenizer, [], FakeClient())
    first = runner.pick_url()
    runner._in_flight[first] += 1
    assert runner.pick_url() != first
    assert http_base("ws://h:9/v1/env") == "http://h:9"
    assert http_base("wss://h/v1/env") == "https://h"


async def test_a_group_member_resets_into_its_group_on_one_server(tokenizer: Any) -> None:
    client = FakeClient()
    runner, _ = _runner(tokenizer, ["```bash\necho hi > hello.txt\n```\n<submit/>"] * 4, client)
    runner.urls = ["ws://a/v1/env", "ws://b/v1/env", "ws://c/v1/env"]
    runner._in_flight = {u: 0 for u in runner.urls}
    await runner.run_episode("builtin/x", 7, "run1-g5", group_size=4)
    assert client.reset_options["group"] == {"id": "run1-g5", "size": 4}
    # every member of a group picks the same server, whatever the load
    picks = set()
    for busy in runner.urls:
        runner._in_flight = {u: (9 if u == busy else 0) for u in runner.urls}
        picks.add(runner.pick_url("run1-g5"))
    assert len(picks) == 1
    # a lone episode (eval) or fork_groups off: no group
    await runner.run_episode("builtin/x", 7, "eval-x", group_size=0)
    assert "group" not in client.reset_options
    runner.config.env.fork_groups = False
    await runner.run_episode("builtin/x", 7, "run1-g6", group_size=4)
    assert "group" not in client.reset_options

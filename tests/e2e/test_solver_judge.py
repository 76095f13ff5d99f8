"""A solver-judge episode on a real local-backend server: two roles, per-role advantages.

The model is a scripted test double (fixed replies by role and seed) so that the outcome is
known: the sandbox, the verifier, the workflow and the advantage code are all real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sandgym.server.runner import BackgroundServer
from sandgym.trainer.agents import TerminalAgent
from sandgym.trainer.algorithms import Sample
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines.base import Generation, InferenceEngine, SamplingParams
from sandgym.trainer.models import load_tokenizer
from sandgym.trainer.roles import SolverJudgeWorkflow, role_advantages, role_samples
from sandgym.trainer.rollout import EpisodeRunner
from tests.e2e.conftest import local_available

pytestmark = pytest.mark.skipif(not local_available(), reason="bwrap missing")

GOOD = "```bash\nprintf 'Hello, world!\\n' > /app/hello.txt\n```\n<submit/>"
BAD = "```bash\necho nope > /app/hello.txt\n```\n<submit/>"


class RoleScriptedEngine(InferenceEngine):
    """Test double for the policy: a judge prompt gets "PASS"; a solver prompt gets the good
    command when its task text was reached by seed 0 (told apart by call order), else a bad one."""

    def __init__(self, tok: Any) -> None:
        super().__init__(batch_wait_s=0.0)
        self.tok = tok
        self.solver_replies = [GOOD, BAD]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            reply = "PASS" if "PASS or FAIL" in text else self.solver_replies.pop(0)
            ids = self.tok(reply, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


async def test_solver_judge_episode_has_two_roles_with_their_own_advantages(
    make_server: Callable[..., BackgroundServer],
) -> None:
    srv = make_server("local")
    cfg = TrainConfig.model_validate(
        {
            "env": {"server_urls": [srv.url], "task_ids": ["builtin/hello-file"]},
            "model": {"source": "tiny"},
            "agent": {"max_turns": 2, "workflow": "solver_judge"},
            "algorithm": {"roles": {"solver": "grpo", "judge": "reinforce"}},
        }
    )
    tok = load_tokenizer(cfg.model)
    engine = RoleScriptedEngine(tok)
    runner = EpisodeRunner(cfg, engine, TerminalAgent(tok, cfg.agent, 32))
    wf = SolverJudgeWorkflow(runner, engine, tok)
    try:
        good = await wf.run_episode("builtin/hello-file", 0, "g")
        bad = await wf.run_episode("builtin/hello-file", 1, "g")
    finally:
        await engine.aclose()
    for ep in (good, bad):
        assert [t.role for t in ep.trajectories] == ["solver", "judge"], ep.error
        assert ep.termination == "submitted"
    assert good.trajectories[0].reward == 1.0 and bad.trajectories[0].reward == 0.0
    # the judge said PASS both times: right about the good attempt, wrong about the bad one
    assert [ep.trajectories[1].reward for ep in (good, bad)] == [1.0, 0.0]
    assert good.trajectories[1].steps[0].action == {"kind": "verdict", "pass": True}
    assert "printf" in tok.decode(good.trajectories[1].steps[0].prompt_ids)  # saw the transcript

    group = [good, bad]
    (advs,) = role_advantages([group], cfg.algorithm.roles, cfg.algorithm.estimator)
    assert advs[0]["solver"] == pytest.approx(1.0, abs=1e-4)  # grpo: (1 - .5) / .5
    assert advs[1]["solver"] == pytest.approx(-1.0, abs=1e-4)
    assert advs[0]["judge"] == 1.0 and advs[1]["judge"] == 0.0  # reinforce: the reward
    samples = role_samples([group], cfg.algorithm.roles, cfg.algorithm.estimator)
    judge_prompt = good.trajectories[1].steps[0].prompt_ids
    by_kind: dict[str, list[Sample]] = {"judge": [], "solver": []}
    for s in samples:
        by_kind["judge" if s.input_ids[: len(judge_prompt)] == judge_prompt else "solver"].append(s)
    # two solver sequences (+1, -1), one judge sequence (+1); the wrong judge has advantage 0
    assert sorted(round(s.advantage, 3) for s in by_kind["solver"]) == [-1.0, 1.0]
    assert [s.advantage for s in by_kind["judge"]] == [1.0]
    assert all(sum(s.loss_mask) > 0 for s in samples)

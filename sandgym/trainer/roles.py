"""Multi-role episodes: per-role advantages, and the solver-judge workflow.

An `Episode` may hold several named trajectories (roles). Each role is its own learning problem:
its advantages are computed over *that role's* trajectories in the group, with the estimator the
config maps it to (`algorithm.roles: {solver: grpo, judge: reinforce}`); a role the map does not
name uses `algorithm.estimator`. A trajectory's tokens carry its role's advantage only.

`SolverJudgeWorkflow` plays one such episode: a solver (the terminal agent, through the usual
`EpisodeRunner`) attempts the task and the verifier scores it; then a judge (the same policy, a
different prompt) reads the solver's transcript and predicts PASS or FAIL. The judge's reward is
1 when its verdict matches the verifier (reward >= `success_threshold`), else 0, so the judge is
trained to verify, and the solver keeps the verifier's reward. `Episode.reward` (the sum of the
trajectories) is therefore not a task score for such episodes: read each trajectory's reward.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sandgym.trainer.algorithms import (
    AlgorithmError,
    Sample,
    episode_to_samples,
    group_advantages,
    normalize_batch,
)
from sandgym.trainer.engines.base import InferenceEngine, SamplingParams
from sandgym.trainer.episode import Episode, Step, Trajectory
from sandgym.trainer.selection import transcript

JUDGE_PROMPT = (
    "You review Linux terminal work. Below is a task and what an agent did. Did the agent "
    "complete the task correctly? Answer with one word: PASS or FAIL."
)
_VERDICT = re.compile(r"\b(PASS|FAIL)\b", re.IGNORECASE)


def roles_of(group: list[Episode]) -> list[str]:
    """Role names in first-seen order across a group."""
    seen: dict[str, None] = {}
    for ep in group:
        for t in ep.trajectories:
            seen.setdefault(t.role, None)
    return list(seen)


def role_advantages(
    groups: list[list[Episode]],
    roles: Mapping[str, str],
    default_estimator: str,
    *,
    std_normalize: bool = True,
) -> list[list[dict[str, float]]]:
    """`out[g][i][role]`: the advantage of episode i's `role` trajectory in group g.

    Each role's advantages come from its own trajectories in the group and its own estimator;
    an episode lacking a role gets no entry for it. A role that appears twice in one episode is
    an error (it would be ambiguous which trajectory the group compares).
    """
    out: list[list[dict[str, float]]] = [[{} for _ in g] for g in groups]
    pp_roles: set[str] = set()
    for gi, group in enumerate(groups):
        for role in roles_of(group):
            estimator = roles.get(role, default_estimator)
            members: list[tuple[int, float]] = []
            for i, ep in enumerate(group):
                trajs = [t for t in ep.trajectories if t.role == role]
                if len(trajs) > 1:
                    raise AlgorithmError(
                        f"episode {ep.task_id}/{ep.seed} has {len(trajs)} trajectories of role "
                        f"{role!r}; expected at most one per role"
                    )
                if trajs:
                    members.append((i, trajs[0].reward))
            advs = group_advantages([r for _, r in members], estimator, std_normalize=std_normalize)
            for (i, _), a in zip(members, advs, strict=True):
                out[gi][i][role] = a
            if estimator == "reinforce_pp":
                pp_roles.add(role)
    for role in pp_roles:  # REINFORCE++ whitens over the batch, per role
        cells = [(gi, i) for gi, g in enumerate(out) for i, d in enumerate(g) if role in d]
        whitened = normalize_batch([out[gi][i][role] for gi, i in cells])
        for (gi, i), a in zip(cells, whitened, strict=True):
            out[gi][i][role] = a
    return out


def role_samples(
    groups: list[list[Episode]],
    roles: Mapping[str, str],
    default_estimator: str,
    *,
    std_normalize: bool = True,
    keep_zero: bool = False,
) -> list[Sample]:
    """Training sequences of every role of every episode, each with its role's advantage."""
    advs = role_advantages(groups, roles, default_estimator, std_normalize=std_normalize)
    samples: list[Sample] = []
    for group, gadv in zip(groups, advs, strict=True):
        for ep, by_role in zip(group, gadv, strict=True):
            for traj in ep.trajectories:
                a = by_role.get(traj.role, 0.0)
                if a == 0.0 and not keep_zero:
                    continue  # a zero advantage has a zero policy gradient
                samples += episode_to_samples(replace(ep, trajectories=[traj]), a)
    return samples


def role_metrics(groups: list[list[Episode]]) -> dict[str, float]:
    """Per-role training metrics of a batch: `role/<role>/reward_mean` (the mean reward of that
    role's trajectories) and `role/<role>/trajectories` (how many there were)."""
    rewards: dict[str, list[float]] = {}
    for group in groups:
        for ep in group:
            for t in ep.trajectories:
                rewards.setdefault(t.role, []).append(t.reward)
    out: dict[str, float] = {}
    for role, rs in rewards.items():
        out[f"role/{role}/reward_mean"] = sum(rs) / len(rs)
        out[f"role/{role}/trajectories"] = float(len(rs))
    return out


def parse_judgement(text: str) -> bool | None:
    """True for PASS, False for FAIL, None when the reply says neither (first word found wins)."""
    m = _VERDICT.search(text)
    return None if m is None else m.group(1).upper() == "PASS"


class SolverJudgeWorkflow:
    """Solver episode, then a judge turn over its transcript (see the module docstring)."""

    def __init__(
        self,
        runner: Any,
        engine: InferenceEngine,
        tokenizer: Any,
        *,
        success_threshold: float = 1.0,
        judge_max_new_tokens: int = 8,
    ) -> None:
        self.runner = runner
        self.engine = engine
        self.tokenizer = tokenizer
        self.success_threshold = success_threshold
        self.judge_max_new_tokens = judge_max_new_tokens

    def judge_prompt_ids(self, instruction: str, solver: Episode) -> list[int]:
        user = f"Task:\n{instruction.strip()}\n\nWhat the agent did:\n{transcript(solver)}"
        msgs = [
            {"role": "system", "content": JUDGE_PROMPT},
            {"role": "user", "content": user},
        ]
        text = self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def run_episode(
        self,
        task_id: str,
        seed: int | None,
        group_id: str = "",
        params: SamplingParams | None = None,
    ) -> Episode:
        ep = await self.runner.run_episode(task_id, seed, group_id, params)
        for t in ep.trajectories:
            if t.role == "agent":
                t.role = "solver"
        if ep.is_infra_failure:
            return ep  # the verifier never scored it: nothing for a judge to be right about
        solver = next(t for t in ep.trajectories if t.role == "solver")
        passed = solver.reward >= self.success_threshold
        prompt = self.judge_prompt_ids(ep.instruction or task_id, ep)
        base = params or self.runner.params
        jparams = SamplingParams(
            base.temperature, base.top_p, self.judge_max_new_tokens, base.top_k
        )
        t0 = time.monotonic()
        gen = await self.engine.agenerate(prompt, jparams)
        text = str(self.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
        verdict = parse_judgement(text)
        reward = 1.0 if verdict is not None and verdict == passed else 0.0
        step = Step(
            prompt_ids=prompt,
            response_ids=list(gen.token_ids),
            response_logprobs=list(gen.logprobs),
            loss_mask=[1] * len(gen.token_ids),
            response_text=text,
            action={"kind": "verdict", "pass": verdict},
            reward=reward,
            done=True,
            policy_version=gen.version,
            generate_s=time.monotonic() - t0,
        )
        ep.trajectories.append(Trajectory(role="judge", steps=[step], reward=reward))
        ep.metrics["judge_correct"] = reward
        ep.metrics["solver_reward"] = solver.reward
        return ep

"""Episode data model: what one rollout produced, token by token, and its JSONL record.

A `Step` is one model turn: the prompt token ids the model saw, the response ids it generated
(with their sampling logprobs and a loss mask saying which of them are trained on), the action
parsed from the response, and what the environment answered. A `Trajectory` is one role's ordered
steps (single-agent episodes have one, role "agent"); an `Episode` groups trajectories with the
task, the seed, why it ended, and timings.

Infrastructure failures are recorded as such and are *masked out* of their advantage group by the
trainer: an episode that died because a sandbox vanished says nothing about the policy, so scoring
it 0 would push the policy away from whatever it did. Which failures those are, and why
`verifier_error` and `action_timeout` are not among them, is decided in one place:
sandgym/trainer/failures.py (its table).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandgym.trainer.failures import (
    AGENT_CAUSABLE_FAILURES,
    INFRA_FAILURES,
    TerminationReason,
    drops_group,
    is_masked,
)


@dataclass
class Step:
    """One model turn and the environment's answer to it."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    #: 1 for tokens the model generated and that are trained on, 0 otherwise (same length as
    #: response_ids; a truncated-away tail or an appended end-of-turn token carries 0)
    loss_mask: list[int]
    response_text: str = ""
    action: dict[str, Any] | None = None
    observation: dict[str, Any] | None = None
    reward: float = 0.0
    done: bool = False
    #: policy version (learner update count) of the weights that generated this step
    policy_version: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0


@dataclass
class Trajectory:
    """One role's steps in order, and the reward credited to that role."""

    role: str = "agent"
    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(s.response_ids) for s in self.steps)


@dataclass
class Episode:
    """A finished rollout of one task with one seed."""

    task_id: str
    seed: int | None
    trajectories: list[Trajectory] = field(default_factory=list)
    termination: TerminationReason = "submitted"
    error: str | None = None
    #: which advantage group this episode belongs to (same task, seed and prompt)
    group_id: str = ""
    server_url: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    #: the task's instruction as the server sent it at reset (judges and harnesses read it)
    instruction: str = ""
    #: a multi-step task's reward per step scored, in order (the server's `info.step.rewards`)
    step_rewards: list[float] = field(default_factory=list)
    #: the last submit's tamper report (the server's `info.tamper`; docs/verification.md)
    tamper: dict[str, Any] | None = None
    #: the server's cost ledger of the episode (`info.cost`: sandbox seconds by phase, CPU,
    #: memory, bytes, commands); the record adds the tokens (`sandgym runs cost` sums them)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def reward(self) -> float:
        return sum(t.reward for t in self.trajectories)

    @property
    def is_infra_failure(self) -> bool:
        return is_masked(self.termination)

    @property
    def drops_group(self) -> bool:
        """A failure the policy can cause that looks like infrastructure: its group is dropped
        and the cause counted (sandgym/trainer/failures.py)."""
        return drops_group(self.termination)

    @property
    def min_policy_version(self) -> int:
        # only model turns carry a version: an automatic submit generated nothing
        versions = [s.policy_version for t in self.trajectories for s in t.steps if s.response_ids]
        return min(versions) if versions else 0

    def to_dict(self, with_tokens: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data["reward"] = self.reward
        steps = [s for t in self.trajectories for s in t.steps]
        data["cost"] = {
            **self.cost,
            "tokens_generated": sum(len(s.response_ids) for s in steps),
            "tokens_trained": sum(sum(s.loss_mask) for s in steps),
        }
        if not with_tokens:
            for traj in data["trajectories"]:
                for step in traj["steps"]:
                    for key in ("prompt_ids", "response_ids", "response_logprobs", "loss_mask"):
                        step.pop(key, None)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        data = dict(data)
        data.pop("reward", None)
        trajs = [
            Trajectory(
                role=t["role"],
                reward=t["reward"],
                steps=[Step(**s) for s in t["steps"]],
            )
            for t in data.pop("trajectories", [])
        ]
        return cls(trajectories=trajs, **data)


class EpisodeWriter:
    """Appends episodes as JSON lines to `<run_dir>/episodes.jsonl` (token ids optional)."""

    def __init__(self, path: Path, with_tokens: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.with_tokens = with_tokens
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, episode: Episode, **extra: Any) -> None:
        record = episode.to_dict(with_tokens=self.with_tokens)
        record.update(extra)
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def apply_tamper_policy(episode: Episode, policy: str) -> None:
    """An episode whose tamper report names a path is flagged (`metrics["tampered"]`) and, with
    policy `zero` (`env.tampered`), scored 0 in every trajectory. It stays a scored episode of
    its group, never an infrastructure failure: masking it would let a policy escape a bad
    score by tampering."""
    if not (episode.tamper or {}).get("tampered"):
        return
    episode.metrics["tampered"] = 1.0
    if policy == "zero":
        for t in episode.trajectories:
            t.reward = 0.0


__all__ = [
    "AGENT_CAUSABLE_FAILURES",
    "INFRA_FAILURES",
    "Episode",
    "EpisodeWriter",
    "Step",
    "apply_tamper_policy",
    "TerminationReason",
    "Trajectory",
    "read_episodes",
]


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """Every record of an episodes JSONL file."""
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]

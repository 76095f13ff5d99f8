"""The models the runtime's calls hand back and pass on: `EpisodeSetup` (what `prepare_episode`
returns and every later call reads), `VerifierResult` (one verifier run) and `StepOutcome`
(what scoring a step means for the episode). A module of their own, so that each part of the
runtime (episode, steps, verifier, oracle) imports them without importing the others."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandgym.sandboxes.network import NetworkPolicy
from sandgym.tasks.models import NetworkPlan
from sandgym.tasks.paths import DEFAULT_WORKDIR
from sandgym.tasks.tamper import ChangeBaseline, TamperReport

#: how an episode is verified (docs/verification.md): in the agent's own sandbox (`shared`, Harbor's
#: default), in a fresh sandbox of the task's image holding only the agent's outputs (`pristine`),
#: or in the agent's sandbox unless the tamper report names a path (`refuse-tampered`: scored 0)
VerifyMode = Literal["shared", "pristine", "refuse-tampered"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("shared", "pristine", "refuse-tampered")


class EpisodeSetup(BaseModel):
    """What `prepare_episode` hands back: the prompt, and what only the verifier may see."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    instruction: str = Field(description="the prompt shown to the agent")
    seed: int = Field(description="the seed this instance was generated from")
    secret: dict[str, bytes] = Field(
        default_factory=dict, description="files copied to /tests/secret/ for the verifier only"
    )
    workdir: str = DEFAULT_WORKDIR
    warnings: list[str] = Field(default_factory=list, description="e.g. RUN lines skipped")
    duration_s: float = 0.0
    desktop: Any = Field(
        None,
        description="sandgym.sandboxes.desktop.Desktop of a desktop task (display started, app up)",
    )
    network: NetworkPlan | None = Field(
        None, description="each phase's network (after the server's clamp); info.network"
    )
    network_ceiling: NetworkPolicy | None = Field(None, description="the server's clamp")
    step_index: int = Field(0, description="multi-step tasks: the step being played")
    step_rewards: list[float] = Field(
        default_factory=list, description="multi-step tasks: the rewards of the steps scored"
    )
    change_baseline: ChangeBaseline | None = Field(
        None, description="the sandbox's changed paths when the set-up was done (tamper report)"
    )
    verify: VerifyMode = Field("shared", description="how the episode is verified")


#: why a verifier run's reward is not the tests' own verdict, each scored as Terminal-Bench 1's
#: harness scores the trial (unresolved, so the episode scores 0: sandgym.tasks.verifier.run):
#: `test_timeout` (the tests ran past `max_test_timeout_sec`) and `parse_error` (they reported
#: no result at all)
VerifierReason = Literal["test_timeout", "parse_error"]


class VerifierResult(BaseModel):
    """The outcome of one verifier run."""

    reward: float
    output: str = Field("", description="the verifier's stdout+stderr")
    duration_s: float = 0.0
    details: dict[str, Any] = Field(default_factory=dict)
    reason: VerifierReason | None = Field(
        None, description="why the reward is not the tests' own verdict (None: it is)"
    )
    tamper: TamperReport | None = Field(None, description="the episode's tamper report")
    verify: VerifyMode | None = Field(None, description="how it was verified")


class StepOutcome(BaseModel):
    """What scoring one step means for the episode (`finish_step`)."""

    done: bool = Field(description="the episode is over (last step, or a failed gate)")
    reward: float = Field(description="done: the episode's reward; else 0.0")
    instruction: str | None = Field(None, description="not done: the next step's instruction")
    step: dict[str, Any] | None = Field(
        None, description="multi-step: info.step (name, index, count, reward, rewards, ...)"
    )

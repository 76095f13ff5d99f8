"""What a `submit` does: `score_step` runs the verifier as the episode's mode says, then moves
the episode on. An episode's start (`prepare_episode`, `mark_episode`) is
`sandgym.tasks.episode_start`."""

from __future__ import annotations

from typing import Any

from sandgym.sandboxes import Sandbox
from sandgym.tasks.episode_models import EpisodeSetup, StepOutcome, VerifierResult
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.steps import finish_step
from sandgym.tasks.verifier.modes import verify_episode

__all__ = ["score_step"]


async def score_step(
    task: TaskSpec, sandbox: Sandbox, setup: EpisodeSetup, **verifier_kw: Any
) -> tuple[VerifierResult, StepOutcome]:
    """`verify_episode` (tamper report, then the verifier as `setup.verify` says) then
    `finish_step`: what a `submit` does."""
    result = await verify_episode(task, sandbox, setup, **verifier_kw)
    return result, await finish_step(task, sandbox, setup, result)

"""The task runtime: the API the env server and the trainer call, gathered from the modules
that do each job.

    spec  = sandbox_spec_for(task, image_map)          # what sandbox to create
    setup = await prepare_episode(task, sandbox, seed)  # files, generator -> instruction, secret
    ...the agent acts...
    result = await run_verifier(task, sandbox, setup)   # tests copied in only now -> reward
    await run_oracle(task, sandbox, setup)              # the reference solution (checks)

| job | module |
|---|---|
| the sandbox spec (image mapping, rewritten build contexts, env templates) | `sandgym.tasks.sandbox_spec` |
| a task's Dockerfile: parse, heredocs, image mapping, applying it without an image | `sandgym.tasks.dockerfile` |
| an episode's start (`prepare_episode`, `mark_episode`) | `sandgym.tasks.episode_start` |
| what a `submit` does (`score_step`) | `sandgym.tasks.episode` |
| multi-step tasks: the current step's view, its set-up, moving on | `sandgym.tasks.steps` |
| scoring: running the verifier (shared, private, separate) and parsing rewards | `sandgym.tasks.verifier` |
| which verify mode an episode gets, and running each (shared, pristine, refuse-tampered) | `sandgym.tasks.verifier.choice`, `sandgym.tasks.verifier.modes` |
| the reference solution | `sandgym.tasks.oracle` |
| the models passed between them (`EpisodeSetup`, `VerifierResult`, `StepOutcome`) | `sandgym.tasks.episode_models` |

On backends that build no image (local, null), `prepare_episode` applies the task's
Dockerfile as far as it can: WORKDIR, ENV (through the SandboxSpec), COPY/ADD of build-context
files; RUN lines are skipped with a warning unless the spec opts in (`allow_run`).
"""

from sandgym.tasks.dockerfile import task_dockerfile
from sandgym.tasks.episode import score_step
from sandgym.tasks.episode_models import EpisodeSetup, StepOutcome, VerifierResult
from sandgym.tasks.episode_start import INSTRUCTION_FILE_ENV, mark_episode, prepare_episode
from sandgym.tasks.oracle import INSTRUCTION_ENV, run_oracle
from sandgym.tasks.paths import (
    ARTIFACTS_DIR,
    DEFAULT_WORKDIR,
    SECRET_DIR,
    SOLUTION_DIR,
    TESTS_DIR,
    VERIFIER_LOGS,
)
from sandgym.tasks.sandbox_spec import parse_image_map, resolve_env_templates, sandbox_spec_for
from sandgym.tasks.steps import current_step, finish_step, step_view
from sandgym.tasks.verifier import reward_range, run_verifier, verifier_sandbox_spec

__all__ = [
    "ARTIFACTS_DIR",
    "DEFAULT_WORKDIR",
    "INSTRUCTION_ENV",
    "INSTRUCTION_FILE_ENV",
    "SECRET_DIR",
    "SOLUTION_DIR",
    "TESTS_DIR",
    "VERIFIER_LOGS",
    "EpisodeSetup",
    "StepOutcome",
    "VerifierResult",
    "current_step",
    "finish_step",
    "mark_episode",
    "parse_image_map",
    "prepare_episode",
    "reward_range",
    "resolve_env_templates",
    "run_oracle",
    "run_verifier",
    "sandbox_spec_for",
    "score_step",
    "step_view",
    "task_dockerfile",
    "verifier_sandbox_spec",
]

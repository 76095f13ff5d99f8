"""tasks: task models, loaders, the verifier and the built-in catalog.

Imports `sandboxes` only. The runtime API (`sandbox_spec_for`, `prepare_episode`,
`run_verifier`, `run_oracle`) is what the env server and the trainer call:

    spec  = sandbox_spec_for(task, image_map)          # what sandbox to create
    setup = await prepare_episode(task, sandbox, seed)  # files, generator -> instruction, secret
    ...the agent acts...
    result, outcome = await score_step(task, sandbox, setup)  # tests copied in only now -> reward
    await run_oracle(task, sandbox, setup)              # the reference solution (checks)

Each job has one module; import a name from the module that defines it:

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
| the fixed paths inside a sandbox (`/tests`, `/logs/verifier`, ...) | `sandgym.tasks.paths` |

On backends that build no image (local, null), `prepare_episode` applies the task's
Dockerfile as far as it can: WORKDIR, ENV (through the SandboxSpec), COPY/ADD of build-context
files; RUN lines are skipped with a warning unless the spec opts in (`allow_run`).
"""

from sandgym.tasks.episode_models import EpisodeSetup, VerifierResult
from sandgym.tasks.episode_start import prepare_episode
from sandgym.tasks.errors import (
    TaskError,
    TaskLoadError,
    TaskUnsupportedError,
    UnknownTaskError,
    VerifierError,
)
from sandgym.tasks.loaders import load_dataset, load_task_dir
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.oracle import run_oracle
from sandgym.tasks.registry import TaskRegistry
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from sandgym.tasks.verifier.run import run_verifier

__all__ = [
    "EpisodeSetup",
    "TaskError",
    "TaskLoadError",
    "TaskRegistry",
    "TaskSpec",
    "TaskUnsupportedError",
    "UnknownTaskError",
    "VerifierError",
    "VerifierResult",
    "load_dataset",
    "load_task_dir",
    "prepare_episode",
    "run_oracle",
    "run_verifier",
    "sandbox_spec_for",
]

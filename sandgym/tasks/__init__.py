"""tasks: task models, loaders, the verifier and the built-in catalog.

Imports `sandboxes` only. The runtime API (`sandbox_spec_for`, `prepare_episode`,
`run_verifier`, `run_oracle`) is what the env server and the trainer call.
"""

from sandgym.tasks.errors import (
    TaskError,
    TaskLoadError,
    TaskUnsupportedError,
    UnknownTaskError,
    VerifierError,
)
from sandgym.tasks.loaders import load_dataset, load_task_dir
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.registry import TaskRegistry
from sandgym.tasks.runtime import (
    EpisodeSetup,
    VerifierResult,
    prepare_episode,
    run_oracle,
    run_verifier,
    sandbox_spec_for,
)

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

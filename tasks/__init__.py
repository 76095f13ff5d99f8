"""tasks: task models, loaders, the verifier and the built-in catalog.

Imports `sandboxes` only. The runtime API (`sandbox_spec_for`, `prepare_episode`,
`run_verifier`, `run_oracle`) is what the env server and the trainer call.
"""

from tasks.errors import (
    TaskError,
    TaskLoadError,
    TaskUnsupportedError,
    UnknownTaskError,
    VerifierError,
)
from tasks.loaders import load_dataset, load_task_dir
from tasks.models import TaskSpec
from tasks.registry import TaskRegistry
from tasks.runtime import (
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

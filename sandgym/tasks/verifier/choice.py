"""Which verify mode an episode gets (`resolve_verify_mode`) and whether a task can be verified
pristine (`pristine_unsupported`): pure rules on the task, read at an episode's start
(`sandgym.tasks.episode_start`) before any verifier runs. The modes themselves are
`sandgym.tasks.verifier.modes`."""

from __future__ import annotations

from sandgym.tasks.desktop import is_desktop_task
from sandgym.tasks.episode_models import VERIFY_MODES, VerifyMode
from sandgym.tasks.errors import TaskError, TaskUnsupportedError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.tamper import declared_outputs


def pristine_unsupported(task: TaskSpec) -> str | None:
    """Why `task` cannot be verified pristine, or None."""
    if task.steps:
        return "a multi-step task's state between steps is more than the agent's outputs"
    if is_desktop_task(task.metadata):
        return "a desktop task's state is its running programs"
    return None


def pristine_needs_outputs(task: TaskSpec) -> str | None:
    """Why `task` cannot be verified pristine on a backend that lists no changed paths (e2b), or
    None: without `metadata.outputs` its outputs are derived from the change set
    (sandgym.tasks.verifier.pristine.output_plan), which such a backend cannot give."""
    if declared_outputs(task):
        return None
    return (
        "it declares no metadata.outputs, and its outputs (what the agent created under its "
        "working directory) can only be derived on a backend that lists a sandbox's changed "
        "paths (local, docker); declare outputs in task.toml to verify it pristine here"
    )


def resolve_verify_mode(task: TaskSpec, *requested: str | None) -> VerifyMode:
    """The first mode given among `requested` (the reset's, the server's), else the task's
    `metadata.verify`, else `shared`; a mode the task cannot use is a TaskUnsupportedError."""
    declared = task.metadata.get("verify")
    if declared is not None and declared not in VERIFY_MODES:
        raise TaskError(
            f"task {task.id}: metadata.verify must be one of {', '.join(VERIFY_MODES)}, "
            f"found {declared!r}"
        )
    mode = next((m for m in requested if m is not None), declared or "shared")
    if mode not in VERIFY_MODES:
        raise TaskError(f"verify must be one of {', '.join(VERIFY_MODES)}, found {mode!r}")
    if mode == "pristine":
        why = pristine_unsupported(task)
        if why is not None:
            raise TaskUnsupportedError(f"task {task.id} cannot be verified pristine: {why}")
    return mode  # type: ignore[return-value]

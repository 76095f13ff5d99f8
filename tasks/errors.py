"""The task error tree: every failure of the `tasks` package is one of these named types.

Like the sandbox errors, each inherits `TaskError` and the builtin it resembles, so callers can
catch either (`except KeyError` works for an unknown task id).
"""

from __future__ import annotations


class TaskError(Exception):
    """Base class of every error raised by the tasks layer."""


class TaskLoadError(TaskError, ValueError):
    """A task directory or dataset file could not be read into a `TaskSpec`."""


class UnknownTaskError(TaskError, KeyError):
    """No task is registered under the requested id (the message lists close matches)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown task"


class VerifierError(TaskError, RuntimeError):
    """The verifier produced no usable reward (missing, empty or unparseable reward file).

    `output` carries the verifier's own output so the cause can be read, never a silent 0.
    """

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output

    def __str__(self) -> str:
        base = super().__str__()
        if not self.output:
            return base
        tail = self.output[-2000:]
        return f"{base}\n--- verifier output (last {len(tail)} chars) ---\n{tail}"


class TaskUnsupportedError(TaskError, RuntimeError):
    """The task cannot run on the chosen backend (e.g. a multi-stage Dockerfile on `local`)."""

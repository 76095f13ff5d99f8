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
    `cause` names what went wrong (`VERIFIER_CAUSES`); it leads the message, so the wire's
    `verifier_error` message and the trainer's episode record keep it. The trainer scores every
    verifier error 0 and never masks it: the verifier runs on the file system the agent left,
    so the agent can cause any of them (sandgym/trainer/episode.py).
    """

    def __init__(self, message: str, output: str = "", cause: str = "failed") -> None:
        super().__init__(message)
        self.output = output
        self.cause = cause
        #: the episode's tamper report, when it names paths (sandgym/tasks/tamper.py): said in the message
        self.tamper: str | None = None

    def __str__(self) -> str:
        base = f"[{self.cause}] {super().__str__()}"
        if self.tamper:
            base += f" [tampered: {self.tamper}]"
        if not self.output:
            return base
        tail = self.output[-2000:]
        return f"{base}\n--- verifier output (last {len(tail)} chars) ---\n{tail}"


#: `VerifierError.cause` values: `timeout` (past the verifier timeout: a FIFO, a hung service),
#: `no_reward` (the test script ended without a reward: it crashed, or a checker could not run),
#: `bad_reward` (a reward file that is not one finite number), `reward_out_of_range`,
#: `no_results` / `bad_report` (no pytest results; an unreadable pytest report),
#: `weights_mismatch` (SETA weights and tests that do not match), `setup` (the private verifier
#: could not start or report), `task` (the task's own scoring data is unusable), `failed`.
VERIFIER_CAUSES = (
    "timeout",
    "no_reward",
    "bad_reward",
    "reward_out_of_range",
    "no_results",
    "bad_report",
    "weights_mismatch",
    "setup",
    "task",
    "outputs",
    "failed",
)


class RewardOutOfRangeError(VerifierError):
    """A reward outside the task's declared range ([0, 1] unless `metadata.reward_range`)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message, output, cause="reward_out_of_range")


class TaskUnsupportedError(TaskError, RuntimeError):
    """The task cannot run on the chosen backend (e.g. a multi-stage Dockerfile on `local`).

    `cause` names what is missing (`UNSUPPORTED_CAUSES`), set where it is raised, so a report
    reads it instead of matching the message.
    """

    def __init__(self, message: str, cause: str = "unsupported") -> None:
        super().__init__(message)
        self.cause = cause


#: `TaskUnsupportedError.cause` values: `no_oracle` (the task ships no solution, so no oracle
#: run is possible), `unsupported` (anything else this backend or configuration cannot run)
UNSUPPORTED_CAUSES = ("no_oracle", "unsupported")


class ComposeUnsupportedError(TaskLoadError):
    """A task's docker-compose file uses something sandgym does not run (a key, a volume, a
    network mode); the message names the file, the service and the key."""

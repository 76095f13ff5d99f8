"""Failure classification: the one place an exception becomes an episode's termination reason.

`classify_failure(exc)` reads the exception's type and, for an `EnvError`, its wire `code`; it
never reads message text. `is_masked(reason)` says whether the trainer masks an episode that ended
so out of its advantage group instead of scoring it 0.

Scores are sacred: only a failure the agent cannot cause is masked, or a policy learns to escape a
bad score by causing it. Per cause:

| raised | reason | who can cause it | trainer |
|---|---|---|---|
| `ConnectionLostError` (whatever its code), `ConnectionError`/`OSError`/`EOFError`, a websockets or httpx error | `connection` | the network between trainer and server | masked |
| `EnvError` `sandbox_lost` | `sandbox_lost` | the engine (container or VM gone) | masked |
| `EnvError` any other server code (`internal`, `unknown_task`, `capacity`, ...) | `error` | the server or the trainer | masked |
| anything else (a bug, the harness made no model call, a Ray actor lost) | `error` | the trainer | masked |
| `EnvError` `verifier_error` | `verifier_error` | the agent too: the verifier runs on what it left (a FIFO where the tests read) | **scored 0** |
| `EnvError` `action_timeout` | `action_timeout` | the agent: an action it chose blocked past its limit | **scored 0** |

A `verifier_error` whose message mentions a lost sandbox is still `verifier_error`: the code
decides (issue 19; tests/e2e/test_verifier_gaming.py).
"""

from __future__ import annotations

from typing import Literal

#: Why an episode ended. The first three are normal ends; the rest are failures, of which only
#: `INFRA_FAILURES` are masked (see the table above).
TerminationReason = Literal[
    "submitted",  # the agent submitted and the verifier scored it
    "turn_limit",  # the agent ran out of turns (the trainer submits for it: see agents.py)
    "env_truncated",  # the server's step or time limit
    "sandbox_lost",
    "action_timeout",  # scored 0: the agent can cause it
    "verifier_error",  # scored 0: the agent can cause it
    "connection",
    "error",  # anything else (a bug, an unknown_task): masked, counted
]
FailureReason = Literal["sandbox_lost", "action_timeout", "verifier_error", "connection", "error"]

#: failures the agent cannot cause: masked out of their group instead of scored
INFRA_FAILURES: frozenset[str] = frozenset({"sandbox_lost", "connection", "error"})
#: failures the agent can cause: scored 0 like any failed episode, but recorded under their name
AGENT_CAUSABLE_FAILURES: frozenset[str] = frozenset({"verifier_error", "action_timeout"})


def classify_failure(exc: BaseException) -> FailureReason:
    """The termination reason of an episode that raised `exc` (see the module's table)."""
    # lazy: the episode records import this module and need not load the client
    from envserver.client import ConnectionLostError, EnvError

    if isinstance(exc, ConnectionLostError):
        return "connection"
    if isinstance(exc, EnvError):
        code = exc.code
        if code == "sandbox_lost":
            return "sandbox_lost"
        if code == "action_timeout":
            return "action_timeout"
        if code == "verifier_error":
            return "verifier_error"
        return "error"
    if isinstance(exc, ConnectionError | OSError | EOFError) or type(exc).__module__.startswith(
        ("websockets", "httpx")
    ):
        return "connection"
    return "error"


def is_masked(reason: str) -> bool:
    """True when an episode ended for `reason` is masked out of its group (not scored)."""
    return reason in INFRA_FAILURES


__all__ = [
    "AGENT_CAUSABLE_FAILURES",
    "INFRA_FAILURES",
    "FailureReason",
    "TerminationReason",
    "classify_failure",
    "is_masked",
]

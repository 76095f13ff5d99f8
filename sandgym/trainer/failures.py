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
| `PolicyOutputError` (engines), `TokenAlignmentError` (gateway) | `policy_output` | the policy: a reply that does not survive the trip through text, ids that do not line up | **group dropped**, counted |
| `PromptTooLongError` (a `PolicyOutputError`) | `policy_output` | the policy: a prompt its replies made longer than the context (the model's, vLLM's `max_model_len`, the server's reported limit or 400, `agent.max_context_tokens`), refused for that request alone | **group dropped**, counted |
| `RequestFailedError` (a `PolicyOutputError`) | `policy_output` | the request: `generate` failed on it alone while others of its batch got replies (found by bisection), or an HTTP 400/422 it caused (a one-token request with the same settings passes) | **group dropped**, counted |
| `EnvError` `no_episode` | `idle_timeout` | the policy too: the server ended an episode left idle (a long generation) | **group dropped**, counted |
| `TimeoutError` | `timeout` | the policy too: something it started outlived a client's limit | **group dropped**, counted |
| `EngineError` (any other: unreachable, a 5xx, 401/403/404/429, a 400 a one-token request meets too, a failure every request of a batch meets alone, a reply without ids) | `engine` | the inference server | masked |

The last three kinds cannot be told apart from infrastructure by their type, and the policy can
cause them: an episode that ended so is neither masked (a policy would learn to escape a bad score
by causing it) nor scored 0 (the server may be to blame), its whole group is dropped and the
cause counted. Every update reports the fraction of its episodes left unscored, by cause
(`unscored_fractions`: `masked/<reason>`, `masked/total`), and the trainer stops the run past
`algorithm.max_masked_frac`.

Engines class their failures by cause before they reach this table
(`sandgym/trainer/engines/base.py`): a failure one request caused is that request's
`PolicyOutputError` subclass while the others of its batch get their replies; only a failure
every request meets alone is the engine's `EngineError` (so one over-long prompt no longer masks
every episode batched with it).
Behind the model gateway (harness agents) the same classes hold: the gateway answers the harness
as OpenAI's API does (400 `context_length_exceeded`, 503 for the engine's own failure), keeps the
session's first failure, and the harness episode ends by it before any submit
(`sandgym.trainer.harness.runner`), so the verifier never scores what an agent left after a model
call failed.

A `verifier_error` whose message mentions a lost sandbox is still `verifier_error`: the code
decides (issue 19; tests/e2e/test_verifier_gaming.py).

Which wire codes the agent can cause is not decided here: it is the `caused_by` column of the
one error-code table, `sandgym.wire.codes` (`AGENT_CAUSABLE_CODES`); an agent-causable code is its
own failure reason, scored 0. The episode loop every runner shares
(`sandgym.client.episode_loop`) reads the same table, so the trainer and the other runners mask
and score the same codes.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, cast

from sandgym.wire.codes import AGENT_CAUSABLE_CODES

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
    "engine",  # the inference server failed (unreachable, 5xx): masked, counted
    "policy_output",  # the engine could not use the policy's output: group dropped, counted
    "idle_timeout",  # the server ended the idle episode: group dropped, counted
    "timeout",  # a TimeoutError: group dropped, counted
    "error",  # anything else (a bug, an unknown_task): masked, counted
]
FailureReason = Literal[
    "sandbox_lost",
    "action_timeout",
    "verifier_error",
    "connection",
    "engine",
    "policy_output",
    "idle_timeout",
    "timeout",
    "error",
]

#: failures the agent cannot cause: masked out of their group instead of scored
INFRA_FAILURES: frozenset[str] = frozenset({"sandbox_lost", "connection", "engine", "error"})
#: failures the agent can cause: scored 0 like any failed episode, but recorded under their name
#: (the wire codes the table sandgym.wire.codes says the agent can cause, each its own reason)
AGENT_CAUSABLE_FAILURES: frozenset[str] = frozenset(AGENT_CAUSABLE_CODES)
#: failures the policy can cause that look like infrastructure: the group is dropped, counted
GROUP_DROPPING_FAILURES: frozenset[str] = frozenset({"policy_output", "idle_timeout", "timeout"})


def classify_failure(exc: BaseException) -> FailureReason:
    """The termination reason of an episode that raised `exc` (see the module's table)."""
    # lazy: the episode records import this module and need not load the client
    from sandgym.client.env_client import ConnectionLostError, EnvError
    from sandgym.trainer.engines.base import EngineError, PolicyOutputError
    from sandgym.trainer.gateway.errors import TokenAlignmentError

    if isinstance(exc, ConnectionLostError):
        return "connection"
    if isinstance(exc, EnvError):
        code = exc.code
        if code in AGENT_CAUSABLE_CODES:  # the table's agent-causable codes: scored 0
            return cast(FailureReason, code)
        if code == "sandbox_lost":
            return "sandbox_lost"
        if code == "no_episode":
            return "idle_timeout"
        return "error"
    if isinstance(exc, PolicyOutputError | TokenAlignmentError):
        return "policy_output"
    if isinstance(exc, EngineError):
        return "engine"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionError | OSError | EOFError) or type(exc).__module__.startswith(
        ("websockets", "httpx")
    ):
        return "connection"
    return "error"


def is_masked(reason: str) -> bool:
    """True when an episode ended for `reason` is masked out of its group (not scored)."""
    return reason in INFRA_FAILURES


def drops_group(reason: str) -> bool:
    """True when an episode ended for `reason` drops its whole group (a failure the policy can
    cause that cannot be told from infrastructure: neither masked nor scored)."""
    return reason in GROUP_DROPPING_FAILURES


def unscored_fractions(terminations: Counter[str]) -> dict[str, float]:
    """Of the episodes counted in `terminations` (termination reason -> episodes, e.g. those
    received since the last update), the fraction left unscored by each cause (masked or
    dropping its group), as metrics `masked/<reason>`, and in all `masked/total`."""
    total = sum(terminations.values())
    out: dict[str, float] = {}
    unscored = 0
    for reason in sorted(INFRA_FAILURES | GROUP_DROPPING_FAILURES):
        n = terminations.get(reason, 0)
        if n:
            out[f"masked/{reason}"] = n / total
            unscored += n
    out["masked/total"] = unscored / total if total else 0.0
    return out


__all__ = [
    "AGENT_CAUSABLE_FAILURES",
    "GROUP_DROPPING_FAILURES",
    "INFRA_FAILURES",
    "FailureReason",
    "TerminationReason",
    "classify_failure",
    "drops_group",
    "is_masked",
    "unscored_fractions",
]

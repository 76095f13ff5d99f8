"""The one table of error codes: for every code of the episode API (`sandgym.wire.protocol`,
`ErrorCode`) and of the sandbox API (`sandgym.wire.sandbox_protocol`, `SandboxErrorCode`), whether
it is retryable, who can cause it, and why, one row each.

Nothing else chooses these answers: the servers' mappings (`sandgym.server.errors.to_wire_error`,
`sandgym.server.sandbox_api.to_sandbox_error`) take each code's `retryable` flag from here, and the
runners (`sandgym.client.episode_loop`, the trainer's failure table, the doors' `SyncEpisode`)
take "the agent can cause it" from here (`AGENT_CAUSABLE_CODES`).

`retryable` means: the same request, sent again (after a pause; for the episode API, a reset
starts the episode again), may succeed. Where one code's answer depends on what caused it, the
row names each such condition (`conditions`) with its own answer and reason; a server passes the
condition's name, never a flag of its own. Where a code of both APIs answers differently
(`sandbox_lost`), both rows say why (`api_note`).

`caused_by` says who can cause the code, which decides how a runner ends an episode that met it:
- `agent`: the policy's own actions can cause it, so it is scored (0), never masked: a policy
  must not escape a bad score by causing it;
- `infrastructure`: the server, the sandbox or the network failed: the episode is masked (no
  reward), never scored;
- `caller`: the program driving the client (its frames, its task id, its token), not the policy:
  the episode is not scored either (a runner reports it with its code).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from sandgym.wire.protocol import ERROR_CODES, ErrorCode
from sandgym.wire.sandbox_protocol import SANDBOX_ERROR_CODES

Api = Literal["episode", "sandbox"]
Cause = Literal["agent", "infrastructure", "caller"]
CAUSES: tuple[Cause, ...] = get_args(Cause)


@dataclass(frozen=True)
class Condition:
    """A named cause of a code whose retryable answer differs from the code's own."""

    retryable: bool
    reason: str


@dataclass(frozen=True)
class CodeRule:
    """One row of the table: a code of one API."""

    api: Api
    code: str
    retryable: bool
    caused_by: Cause
    reason: str
    #: named causes whose retryable answer differs from `retryable` (a server names the one it
    #: met: `retryable_for(api, code, condition)`)
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    #: why this code answers differently in the other API, where it does
    api_note: str | None = None
    #: the server refused the request before anything ran: the session and its episode stay as
    #: they were, so a runner tells the policy and goes on (episode API only)
    goes_on: bool = False


EPISODE_RULES: tuple[CodeRule, ...] = (
    CodeRule(
        "episode", "invalid_message", False, "caller",
        "a frame or action the server refuses (bad JSON, an unknown field, a path outside the "
        "sandbox, a desktop action without a desktop); sent again it is refused again",
        conditions={
            "busy": Condition(
                True,
                "a second request arrived while one was in flight on the session; send it again "
                "after the first one's reply",
            )
        },
        goes_on=True,
    ),
    CodeRule(
        "episode", "unknown_task", False, "caller",
        "the task id is not served here, or the task cannot run on this server's backend",
    ),
    CodeRule(
        "episode", "no_episode", False, "caller",
        "no episode runs on this connection (never reset, already ended, or ended by the server "
        "after an idle timeout); a new reset is a new episode, not a retry",
    ),
    CodeRule(
        "episode", "capacity", True, "infrastructure",
        "the server runs its most episodes, or its pool had no sandbox in time; a later reset "
        "may find room",
    ),
    CodeRule(
        "episode", "sandbox_lost", True, "infrastructure",
        "the episode's sandbox died (or the client lost its connection mid-episode); a reset "
        "gets a fresh sandbox",
        api_note="the episode API retries by episode (a reset makes a new sandbox); the sandbox "
        "API's requests name the lost sandbox itself, so they cannot succeed again",
    ),
    CodeRule(
        "episode", "action_timeout", False, "agent",
        "an action the agent chose ran past its time limit; the same action is expected to time "
        "out again (the episode stays usable for another one)",
    ),
    CodeRule(
        "episode", "verifier_error", False, "agent",
        "the verifier gave no reward on the state the agent left (the agent can break what the "
        "tests read); scoring the same state again fails again",
    ),
    CodeRule(
        "episode", "unauthorized", False, "caller",
        "the bearer token was missing or wrong",
    ),
    CodeRule(
        "episode", "internal", False, "infrastructure",
        "a fault of the server or its backend (a bug, the engine unavailable); the same request "
        "is not expected to succeed",
        conditions={
            "pool_closed": Condition(
                True, "the server is shutting down; a restarted (or another) server may serve it"
            ),
            "sandbox_create": Condition(
                True, "the episode's sandbox could not be created; a fresh reset may well succeed"
            ),
            "desktop": Condition(
                True, "the desktop did not start (no X server, the app failed); a reset may"
            ),
            "connection_lost": Condition(
                True,
                "the client could not reach the server (refused, handshake refused), set by the "
                "client itself; a later try may",
            ),
        },
    ),
)  # fmt: skip

SANDBOX_RULES: tuple[CodeRule, ...] = (
    CodeRule(
        "sandbox", "invalid_request", False, "caller",
        "a body or path the API refuses (a validation error, a path outside the sandbox)",
    ),
    CodeRule("sandbox", "unauthorized", False, "caller", "the bearer token was missing or wrong"),
    CodeRule(
        "sandbox", "unknown_sandbox", False, "caller",
        "no sandbox of that id (never created, closed, or closed after its idle timeout)",
    ),
    CodeRule(
        "sandbox", "capacity", True, "infrastructure",
        "the server runs its most sandboxes, or its pool had none in time; a later create may "
        "find room",
    ),
    CodeRule(
        "sandbox", "environment_invalid", False, "caller",
        "the environment definition is invalid, or cannot run on this backend (services, users)",
    ),
    CodeRule(
        "sandbox", "build_failed", False, "caller",
        "the environment's image did not build or its sandbox did not start; the same definition "
        "is expected to fail again",
    ),
    CodeRule(
        "sandbox", "network_unsupported", False, "caller",
        "the network policy asked for cannot be enforced on this backend",
    ),
    CodeRule(
        "sandbox", "sandbox_lost", False, "infrastructure",
        "the sandbox died (its container or VM is gone); create a new one",
        api_note="the sandbox API's requests name the lost sandbox itself, so they cannot "
        "succeed again; the episode API retries by episode (a reset makes a new sandbox)",
    ),
    CodeRule(
        "sandbox", "exec_timeout", False, "agent",
        "the command (the caller's agent chose it) ran past its timeout_s and its process tree "
        "was killed; the same command is expected to time out again",
    ),
    CodeRule(
        "sandbox", "file_not_found", False, "caller",
        "a download of a path that does not exist in the sandbox",
    ),
    CodeRule(
        "sandbox", "internal", False, "infrastructure",
        "a fault of the server or its backend; the same request is not expected to succeed",
        conditions={
            "pool_closed": Condition(
                True, "the server is shutting down; a restarted (or another) server may serve it"
            ),
        },
    ),
)  # fmt: skip

RULES: dict[tuple[Api, str], CodeRule] = {(r.api, r.code): r for r in EPISODE_RULES + SANDBOX_RULES}

#: the episode API's codes the agent can cause: an episode they end is scored 0, never masked
AGENT_CAUSABLE_CODES: frozenset[ErrorCode] = frozenset(
    c for c in ERROR_CODES if RULES[("episode", c)].caused_by == "agent"
)
#: the episode API's codes after which the episode goes on (a refused request; nothing ran)
GOES_ON_CODES: frozenset[ErrorCode] = frozenset(
    c for c in ERROR_CODES if RULES[("episode", c)].goes_on
)


class UnknownCodeError(KeyError):
    """A code, or a condition of a code, that the table has no row for."""


def rule(api: Api, code: str) -> CodeRule:
    """The row of `code` in `api`; `UnknownCodeError` names the codes there are."""
    found = RULES.get((api, code))
    if found is None:
        known = sorted(c for a, c in RULES if a == api)
        raise UnknownCodeError(f"expected a {api} API error code in {known}, got {code!r}")
    return found


def retryable_for(api: Api, code: str, condition: str | None = None) -> bool:
    """Whether `code` (met for `condition`, where its row names one) is retryable."""
    row = rule(api, code)
    if condition is None:
        return row.retryable
    if condition not in row.conditions:
        raise UnknownCodeError(
            f"expected a condition of {api} code {code!r} in {sorted(row.conditions)}, "
            f"got {condition!r}"
        )
    return row.conditions[condition].retryable


def caused_by(code: str, api: Api = "episode") -> Cause:
    """Who can cause `code` (see the module docstring)."""
    return rule(api, code).caused_by


def agent_can_cause(code: str) -> bool:
    """True when the agent can cause the episode API's `code` (an ending it gives is scored 0)."""
    return code in AGENT_CAUSABLE_CODES


def _check_covers() -> None:
    """Import-time guard: one row for every code of each API, none for a code that is not one."""
    for api, codes in (("episode", ERROR_CODES), ("sandbox", SANDBOX_ERROR_CODES)):
        rows = [r.code for r in EPISODE_RULES + SANDBOX_RULES if r.api == api]
        if sorted(rows) != sorted(codes):
            raise AssertionError(f"the {api} table's codes {sorted(rows)} != {sorted(codes)}")


_check_covers()

__all__ = [
    "AGENT_CAUSABLE_CODES",
    "CAUSES",
    "EPISODE_RULES",
    "GOES_ON_CODES",
    "RULES",
    "SANDBOX_RULES",
    "Api",
    "Cause",
    "CodeRule",
    "Condition",
    "UnknownCodeError",
    "agent_can_cause",
    "caused_by",
    "retryable_for",
    "rule",
]

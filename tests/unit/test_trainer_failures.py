"""trainer/failures.py: an episode's failure is classified by exception type and wire code, never
by message text, and only the failures the agent cannot cause are masked."""

from __future__ import annotations

import pytest

from envserver.client import ConnectionLostError, EnvError
from trainer.failures import (
    AGENT_CAUSABLE_FAILURES,
    INFRA_FAILURES,
    classify_failure,
    is_masked,
)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (EnvError("sandbox_lost", "container vanished", True), "sandbox_lost"),
        (ConnectionLostError("sandbox_lost", "connection to ws://x lost: EOF", True), "connection"),
        (ConnectionLostError("internal", "websocket handshake refused: 503", True), "connection"),
        (ConnectionResetError("reset by peer"), "connection"),
        (EOFError(), "connection"),
        (EnvError("unknown_task", "no such task"), "error"),
        (EnvError("internal", "internal error: KeyError"), "error"),
        (EnvError("capacity", "full", True), "error"),
        (RuntimeError("a bug"), "error"),
        (EnvError("action_timeout", "too slow", True), "action_timeout"),
        (EnvError("verifier_error", "[timeout] the verifier did not finish"), "verifier_error"),
    ],
)
def test_classified_by_type_and_code(error: BaseException, reason: str) -> None:
    assert classify_failure(error) == reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        # the message names an infrastructure failure; the code says the agent's: not masked
        (EnvError("verifier_error", "sandbox_lost: connection to ws://x lost"), "verifier_error"),
        (
            EnvError("action_timeout", "connection to ws://x lost; handshake refused"),
            "action_timeout",
        ),
        # the message reads like a dropped connection; the code says the sandbox
        (EnvError("sandbox_lost", "connection to ws://x lost: EOF", True), "sandbox_lost"),
        # and a server error whose text mentions a verifier is still the server's
        (EnvError("internal", "verifier_error in the pool"), "error"),
    ],
)
def test_message_text_never_decides(error: BaseException, reason: str) -> None:
    assert classify_failure(error) == reason


def test_only_failures_the_agent_cannot_cause_are_masked() -> None:
    assert INFRA_FAILURES == {"sandbox_lost", "connection", "error"}
    assert AGENT_CAUSABLE_FAILURES == {"verifier_error", "action_timeout"}
    assert [r for r in ("sandbox_lost", "connection", "error") if not is_masked(r)] == []
    for reason in ("verifier_error", "action_timeout", "submitted", "turn_limit", "env_truncated"):
        assert not is_masked(reason)

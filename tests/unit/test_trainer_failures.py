"""sandgym/trainer/failures.py: an episode's failure is classified by exception type and wire code, never
by message text, and only the failures the agent cannot cause are masked."""

from __future__ import annotations

from typing import Any

import pytest

from sandgym.client.env_client import ConnectionLostError, EnvError
from sandgym.trainer.failures import (
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
    assert INFRA_FAILURES == {"sandbox_lost", "connection", "engine", "error"}
    assert AGENT_CAUSABLE_FAILURES == {"verifier_error", "action_timeout"}
    assert [r for r in ("sandbox_lost", "connection", "engine", "error") if not is_masked(r)] == []
    for reason in ("verifier_error", "action_timeout", "submitted", "turn_limit", "env_truncated"):
        assert not is_masked(reason)


# -- failures the policy's output can cause (issue 31, item 3) --------------------------------


@pytest.mark.parametrize(
    ("make_error", "reason"),
    [
        # the engine could not turn the policy's reply into the ids it sampled, or the prompt
        # its replies built does not survive text, or the server refuses it as too long
        (lambda: _engine_errors().PolicyOutputError("does not survive the trip"), "policy_output"),
        (
            lambda: _gateway_errors().TokenAlignmentError("the harness edited a reply"),
            "policy_output",
        ),
        # the server ended the episode while the agent was silent (its idle timeout): a slow,
        # long generation causes it as surely as a dead engine does
        (lambda: EnvError("no_episode", "no episode: it ended (idle)"), "idle_timeout"),
        (lambda: TimeoutError(), "timeout"),
        # the engine itself (unreachable, a 5xx): the policy cannot cause it; masked, counted
        (lambda: _engine_errors().EngineError("http://x unreachable"), "engine"),
    ],
)
def test_failures_the_policy_can_cause_are_never_masked(make_error: Any, reason: str) -> None:
    from sandgym.trainer.failures import GROUP_DROPPING_FAILURES, drops_group

    error = make_error()
    assert classify_failure(error) == reason
    if reason == "engine":
        assert is_masked(reason) and not drops_group(reason)
    else:
        # not masked as infrastructure: the whole group is dropped and its cause counted
        assert not is_masked(reason) and drops_group(reason) and reason in GROUP_DROPPING_FAILURES


def _config() -> Any:
    from sandgym.trainer.config import TrainConfig

    return TrainConfig.model_validate({"env": {"task_ids": ["t"]}, "run": {"progress": False}})


def _engine_errors() -> Any:
    import sandgym.trainer.engines.base as base

    return base


def _gateway_errors() -> Any:
    import sandgym.trainer.gateway.errors as errors

    return errors


def test_a_group_with_a_policy_caused_failure_is_dropped_and_counted(tmp_path: Any) -> None:
    from collections import Counter

    from sandgym.trainer.episode import Episode, Trajectory
    from sandgym.trainer.train import Trainer

    trainer = Trainer(_config(), tmp_path / "run")
    ok = [Episode("t", 0, [Trajectory(reward=r)], termination="submitted") for r in (1.0, 0.0)]
    for reason in ("policy_output", "idle_timeout", "timeout"):
        failed = Episode("t", 0, [Trajectory(reward=0.0)], termination=reason)  # type: ignore[arg-type]
        counts: Counter[str] = Counter()
        # two members left would make a valid group if the failure were masked: it is not
        assert trainer._admit_group([*ok, failed], counts) is None
        assert counts[f"__dropped_groups_{reason}"] == 1 and counts["__kept_groups"] == 0


def test_unscored_fraction_by_cause_and_the_ceiling() -> None:
    from collections import Counter

    from sandgym.trainer.failures import unscored_fractions
    from sandgym.trainer.train import TrainError, check_unscored_ceiling

    window = Counter({"submitted": 6, "connection": 1, "policy_output": 2, "verifier_error": 1})
    m = unscored_fractions(window)
    assert m == {
        "masked/connection": 0.1,
        "masked/policy_output": 0.2,
        "masked/total": pytest.approx(0.3),
    }
    check_unscored_ceiling(m, 0.5, version=3)
    with pytest.raises(
        TrainError, match=r"0\.30 of the episodes.*algorithm\.max_masked_frac 0\.25"
    ):
        check_unscored_ceiling(m, 0.25, version=3)
    assert unscored_fractions(Counter({"submitted": 4}))["masked/total"] == 0.0

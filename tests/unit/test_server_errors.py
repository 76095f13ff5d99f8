"""`to_wire_error`: every kind of failure maps to exactly one contract code."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandgym.sandboxes import errors as sbx
from sandgym.sandboxes.desktop import DesktopActionError, DesktopStartError
from sandgym.sandboxes.pool import PoolClosedError, PoolKeyFailingError, PoolTimeoutError
from sandgym.server import errors as e
from sandgym.tasks import errors as terr
from sandgym.wire.protocol import ERROR_CODES, parse_client_message


def _validation_error() -> ValidationError:
    try:
        parse_client_message('{"type":"reset","request_id":"1","task_id":"t","bogus":true}')
    except ValidationError as exc:
        return exc
    raise AssertionError("expected a ValidationError")


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (_validation_error(), "invalid_message", False),
        (e.InvalidMessageError("bad"), "invalid_message", False),
        (e.MessageTooLargeError("big"), "invalid_message", False),
        (e.BusyError("busy"), "invalid_message", True),
        (e.UnsupportedActionError("no x"), "invalid_message", False),
        (e.NoEpisodeError("none"), "no_episode", False),
        (e.CapacityError("full"), "capacity", True),
        (e.UnauthorizedError("who"), "unauthorized", False),
        (terr.UnknownTaskError("no task x"), "unknown_task", False),
        (terr.TaskUnsupportedError("not on local"), "unknown_task", False),
        (terr.VerifierError("no reward", output="log"), "verifier_error", False),
        (PoolTimeoutError("waited"), "capacity", True),
        (PoolClosedError("closed"), "internal", True),
        (PoolKeyFailingError("failing", "k", None), "internal", True),
        (sbx.CommandTimeoutError("slow"), "action_timeout", False),  # one answer: exec_timeout too
        (sbx.SandboxLostError("dead"), "sandbox_lost", True),
        (sbx.SandboxClosedError("closed"), "sandbox_lost", True),
        (sbx.SandboxPathError("../.."), "invalid_message", False),
        (sbx.SandboxCreateError("no image"), "internal", True),
        (sbx.BackendUnavailableError("no docker"), "internal", False),
        (terr.TaskError("generator failed"), "internal", False),
        (DesktopActionError("x must be an int"), "invalid_message", False),
        (DesktopStartError("no window"), "internal", True),
        (RuntimeError("boom"), "internal", False),
    ],
)
def test_mapping(exc, code, retryable):
    err = e.to_wire_error(exc)
    assert (err.code, err.retryable) == (code, retryable)
    assert err.code in ERROR_CODES and err.message


def test_validation_message_names_the_field():
    msg = e.to_wire_error(_validation_error()).message
    assert "bogus" in msg and msg.startswith("invalid message")


def test_unknown_task_message_is_readable():
    assert e.to_wire_error(terr.UnknownTaskError("no task 'x'")).message == "no task 'x'"

"""The server's own named errors, and `to_wire_error`: the ONE place an exception becomes a code.

Every failure the websocket handler meets (a sandbox error, a task error, a pool error, a
validation error, or one of the errors below) goes through `to_wire_error`, which returns the
wire `(code, message, retryable)`. Nothing else in the server chooses error codes; the retryable
flag is not chosen here either: it is the code's row of `sandgym.wire.codes` (with the row's
named condition where the code's answer depends on its cause, e.g. `busy`).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from pydantic import ValidationError

from sandgym.sandboxes import errors as sbx
from sandgym.sandboxes.desktop import DesktopActionError, DesktopError
from sandgym.sandboxes.pool import PoolClosedError, PoolTimeoutError
from sandgym.tasks import errors as terr
from sandgym.wire.codes import retryable_for
from sandgym.wire.protocol import ErrorCode

log = logging.getLogger(__name__)


class EnvServerError(Exception):
    """Base class of the errors the server raises itself."""


class InvalidMessageError(EnvServerError, ValueError):
    """A frame was not a valid client message (bad JSON, unknown field, wrong type)."""


class MessageTooLargeError(InvalidMessageError):
    """A frame exceeded `max_message_bytes`."""


class BusyError(EnvServerError, RuntimeError):
    """A request arrived while another one of the same session was still being handled."""


class NoEpisodeError(EnvServerError, RuntimeError):
    """A step arrived with no episode running on this connection (or a resume found none)."""


class CapacityError(EnvServerError, RuntimeError):
    """The server already runs `max_sessions` episodes, or the pool cannot supply a sandbox."""


class UnauthorizedError(EnvServerError, PermissionError):
    """The bearer token was missing or wrong."""


class UnsupportedActionError(InvalidMessageError):
    """A valid action this episode's sandbox cannot perform (desktop action without a desktop)."""


class WireError(NamedTuple):
    code: ErrorCode
    message: str
    retryable: bool


def _wire(code: ErrorCode, message: str, condition: str | None = None) -> WireError:
    """The error `code` with its retryable flag from the one table (sandgym.wire.codes)."""
    return WireError(code, message, retryable_for("episode", code, condition))


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "message"
        parts.append(f"{loc}: {err.get('msg')}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "invalid message: " + "; ".join(parts) + more


def _task_error_code(exc: BaseException) -> ErrorCode | None:
    """Codes for `sandgym.tasks.errors` types."""
    if isinstance(exc, terr.UnknownTaskError):
        return "unknown_task"
    if isinstance(exc, terr.VerifierError):
        return "verifier_error"
    unsupported = getattr(terr, "TaskUnsupportedError", None)
    if unsupported is not None and isinstance(exc, unsupported):
        # This server cannot serve the task on its backend: as final as an unknown id.
        return "unknown_task"
    return None


def to_wire_error(exc: BaseException) -> WireError:
    """Map any exception to the one wire error code that describes it."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, ValidationError):
        return _wire("invalid_message", _validation_message(exc))
    if isinstance(exc, BusyError):
        return _wire("invalid_message", msg, "busy")
    if isinstance(exc, InvalidMessageError):
        return _wire("invalid_message", msg)
    if isinstance(exc, NoEpisodeError):
        return _wire("no_episode", msg)
    if isinstance(exc, CapacityError):
        return _wire("capacity", msg)
    if isinstance(exc, UnauthorizedError):
        return _wire("unauthorized", msg)
    task_code = _task_error_code(exc)
    if task_code is not None:
        return _wire(task_code, msg)
    if isinstance(
        exc,
        sbx.NetworkPolicyUnsupportedError
        | sbx.SandboxGroupUnsupportedError
        | sbx.UserUnsupportedError,
    ):
        # The task's network (or its services, or its users) cannot run on this backend: as
        # final as an unknown id.
        return _wire("unknown_task", msg)
    if isinstance(exc, PoolTimeoutError):
        return _wire("capacity", f"no sandbox available: {msg}")
    if isinstance(exc, PoolClosedError):
        return _wire("internal", f"server shutting down: {msg}", "pool_closed")
    if isinstance(exc, DesktopActionError):
        return _wire("invalid_message", msg)
    if isinstance(exc, DesktopError):  # no X server, app failed to start: not the agent's doing
        return _wire("internal", f"desktop: {msg}", "desktop")
    if isinstance(exc, sbx.CommandTimeoutError):
        return _wire("action_timeout", msg)
    if isinstance(exc, sbx.SandboxLostError | sbx.SandboxClosedError):
        return _wire("sandbox_lost", msg)
    if isinstance(exc, sbx.SandboxPathError | sbx.SandboxFileNotFoundError):
        return _wire("invalid_message", msg)
    if isinstance(exc, sbx.SandboxCreateError):
        # The episode never started; a fresh reset may well succeed.
        return _wire("internal", f"could not create a sandbox: {msg}", "sandbox_create")
    if isinstance(exc, sbx.BackendUnavailableError):
        return _wire("internal", f"sandbox backend unavailable: {msg}")
    if isinstance(exc, TimeoutError):
        return _wire("action_timeout", msg)
    log.exception("internal error", exc_info=exc)
    return _wire("internal", f"internal error: {type(exc).__name__}: {msg}")

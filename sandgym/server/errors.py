"""The server's own named errors, and `to_wire_error`: the ONE place an exception becomes a code.

Every failure the websocket handler meets (a sandbox error, a task error, a pool error, a
validation error, or one of the errors below) goes through `to_wire_error`, which returns the
wire `(code, message, retryable)`. Nothing else in the server chooses error codes.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from pydantic import ValidationError

from sandgym.sandboxes import errors as sbx
from sandgym.sandboxes.desktop import DesktopActionError, DesktopError
from sandgym.sandboxes.pool import PoolClosedError, PoolTimeoutError
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


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "message"
        parts.append(f"{loc}: {err.get('msg')}")
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "invalid message: " + "; ".join(parts) + more


def _task_error_code(exc: BaseException) -> ErrorCode | None:
    """Codes for `sandgym.tasks.errors` types; imported lazily so this module loads without `tasks`."""
    try:
        from sandgym.tasks import errors as terr
    except ImportError:  # sandgym/tasks/ not installed in a client-only environment
        return None
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
        return WireError("invalid_message", _validation_message(exc), False)
    if isinstance(exc, BusyError):
        return WireError("invalid_message", msg, True)
    if isinstance(exc, InvalidMessageError):
        return WireError("invalid_message", msg, False)
    if isinstance(exc, NoEpisodeError):
        return WireError("no_episode", msg, False)
    if isinstance(exc, CapacityError):
        return WireError("capacity", msg, True)
    if isinstance(exc, UnauthorizedError):
        return WireError("unauthorized", msg, False)
    task_code = _task_error_code(exc)
    if task_code is not None:
        return WireError(task_code, msg, False)
    if isinstance(
        exc,
        sbx.NetworkPolicyUnsupportedError
        | sbx.SandboxGroupUnsupportedError
        | sbx.UserUnsupportedError,
    ):
        # The task's network (or its services, or its users) cannot run on this backend: as
        # final as an unknown id.
        return WireError("unknown_task", msg, False)
    if isinstance(exc, PoolTimeoutError):
        return WireError("capacity", f"no sandbox available: {msg}", True)
    if isinstance(exc, PoolClosedError):
        return WireError("internal", f"server shutting down: {msg}", True)
    if isinstance(exc, DesktopActionError):
        return WireError("invalid_message", msg, False)
    if isinstance(exc, DesktopError):  # no X server, app failed to start: not the agent's doing
        return WireError("internal", f"desktop: {msg}", True)
    if isinstance(exc, sbx.CommandTimeoutError):
        return WireError("action_timeout", msg, True)
    if isinstance(exc, sbx.SandboxLostError | sbx.SandboxClosedError):
        return WireError("sandbox_lost", msg, True)
    if isinstance(exc, sbx.SandboxPathError | sbx.SandboxFileNotFoundError):
        return WireError("invalid_message", msg, False)
    if isinstance(exc, sbx.SandboxCreateError):
        # The episode never started; a fresh reset may well succeed.
        return WireError("internal", f"could not create a sandbox: {msg}", True)
    if isinstance(exc, sbx.BackendUnavailableError):
        return WireError("internal", f"sandbox backend unavailable: {msg}", False)
    if isinstance(exc, TimeoutError):
        return WireError("action_timeout", msg, True)
    log.exception("internal error", exc_info=exc)
    return WireError("internal", f"internal error: {type(exc).__name__}: {msg}", False)

"""The pool's named errors: no sandbox in time, too little host memory, a key whose creations
keep failing, a closed pool."""

from __future__ import annotations

from sandgym.sandboxes.errors import SandboxCreateError, SandboxError


class PoolTimeoutError(SandboxError, TimeoutError):
    """No sandbox became available within the acquire timeout."""


class HostMemoryError(PoolTimeoutError):
    """The host has less memory available than the pool's floor (`min_available_memory_mb`):
    no sandbox is created until some are closed. A capacity refusal, answered like a pool
    timeout (`capacity`, retryable), so it subclasses PoolTimeoutError."""

    def __init__(self, message: str, *, available_mib: float, floor_mib: float) -> None:
        super().__init__(message)
        self.available_mib = available_mib
        self.floor_mib = floor_mib


class PoolKeyFailingError(SandboxCreateError):
    """Creations for this key kept failing; acquires fail fast until the cooldown ends.

    `last_error` holds the most recent creation error (also chained as `__cause__`).
    """

    def __init__(self, message: str, key: str, last_error: BaseException | None) -> None:
        super().__init__(message)
        self.key = key
        self.last_error = last_error


class PoolClosedError(SandboxError, RuntimeError):
    """The pool was closed (or is closing); it hands out no more sandboxes."""


def describe(exc: BaseException | None) -> str | None:
    """`Type: message` of an error for logs and snapshots; None for no error."""
    if exc is None:
        return None
    return f"{type(exc).__name__}: {exc}"

"""`E2BApi`: the E2B account a backend and its sandboxes talk to: the SDK (imported on first
use), the API key, the request timeout, what an SDK failure amounts to (`unavailable`), and
killing one VM (`kill`). The backend creates, lists and reaps through it; each sandbox holds
it, never the backend (as a docker sandbox holds its engine connection)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.errors import BackendUnavailableError

log = logging.getLogger(__name__)

#: E2B's longest sandbox lifetime (Pro tier); Hobby accounts are capped at 1 h by E2B itself.
MAX_SANDBOX_TIMEOUT_S = 24 * 3600


def e2b_timeout_s(life_s: float) -> int:
    """E2B's `timeout` (whole seconds, 60 s to MAX_SANDBOX_TIMEOUT_S) for a sandbox that is to
    live `life_s` more seconds."""
    return int(max(60, min(-(-life_s // 1), MAX_SANDBOX_TIMEOUT_S)))


class E2BApi:
    """One E2B account's API (see the module docstring). `sdk` is the module-like object
    providing `AsyncSandbox`, `SandboxQuery`, `PtySize` and the exception classes; None imports
    the real `e2b` package on first use."""

    def __init__(
        self, api_key: str | None = None, request_timeout_s: float = 30.0, sdk: Any = None
    ) -> None:
        self._api_key = api_key
        self.request_timeout_s = request_timeout_s
        self._sdk = sdk

    @property
    def sdk(self) -> Any:
        if self._sdk is None:
            try:
                import e2b
            except ImportError as exc:
                raise BackendUnavailableError(
                    "the e2b backend needs the E2B SDK: pip install 'sandgym[e2b]'"
                ) from exc
            self._sdk = e2b
        return self._sdk

    @property
    def api_key(self) -> str:
        key = self._api_key or os.environ.get("E2B_API_KEY", "")
        if not key:
            raise BackendUnavailableError(
                "the e2b backend needs an E2B API key: expected E2B_API_KEY in the environment "
                "(or api_key=...), found none; get one at https://e2b.dev/dashboard"
            )
        return key

    def auth(self) -> dict[str, Any]:
        """The key and request timeout every SDK call by class (create, list, kill) takes."""
        return {"api_key": self.api_key, "request_timeout": self.request_timeout_s}

    def unavailable(self, exc: Exception) -> BackendUnavailableError | None:
        """The BackendUnavailableError an SDK failure amounts to (refused key, E2B unreachable),
        or None when the failure is about the request itself."""
        import httpx

        if isinstance(exc, self.sdk.AuthenticationException):
            return BackendUnavailableError(f"e2b: the API key was refused: {exc}")
        if isinstance(exc, httpx.TransportError):
            return BackendUnavailableError(
                f"e2b: the E2B API cannot be reached from here (expected a connection to "
                f"{os.environ.get('E2B_DOMAIN', 'e2b.app')}): {exc}"
            )
        return None

    async def kill(self, e2b_id: str, sbx: Any = None) -> bool:
        """Kill one E2B sandbox by id (through its handle `sbx` when there is one); False when
        it was already gone. Never raises."""
        try:
            if sbx is not None:
                coro = sbx.kill(request_timeout=self.request_timeout_s)
            else:
                coro = self.sdk.AsyncSandbox.kill(e2b_id, **self.auth())
            return bool(await asyncio.wait_for(coro, self.request_timeout_s + 5))
        except Exception as exc:  # E2B ends it at its timeout; the reaper retries before
            tolerate("e2b.kill", exc, log, logging.WARNING)
            return False

"""Healthchecks: a sandbox is handed to an episode (or counted ready by the pool) only after its
healthcheck passed.

`run_healthcheck(sandbox, spec)` runs a `HealthcheckSpec` inside a sandbox with Harbor's (and
Docker's) semantics: during the start period failures do not count; after it, `retries`
consecutive failures raise `SandboxHealthcheckError` carrying the last attempt's output. A
backend calls `ensure_healthy` at the end of `create`, so every path to a sandbox (the pool, a
direct create) waits for it. A per-step healthcheck (Harbor `[[steps]] healthcheck`) is the
same call with the step's spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.errors import SandboxError, SandboxHealthcheckError
from sandgym.sandboxes.services import HealthcheckSpec

log = logging.getLogger(__name__)

#: how much of the last attempt's output the error carries
OUTPUT_TAIL = 2000


def _tail(text: str, limit: int = OUTPUT_TAIL) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


async def run_healthcheck(
    sandbox: Sandbox,
    spec: HealthcheckSpec,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Run `spec` in `sandbox` (as root) until it passes; SandboxHealthcheckError when it
    fails `retries` times in a row after the start period. An attempt fails on a non-zero
    exit, on its timeout, or when the sandbox cannot run it (the error's text is its output)."""
    command = spec.shell_command() if isinstance(spec.command, tuple) else spec.command
    start_period_end = clock() + spec.start_period_s
    failures = 0
    attempts = 0
    while True:
        in_start_period = clock() < start_period_end
        attempts += 1
        try:
            res = await sandbox.exec(command, timeout_s=spec.timeout_s, user="root")
        except SandboxError as exc:
            ok, output, how = False, f"{type(exc).__name__}: {exc}", "could not run"
        else:
            ok = res.exit_code == 0 and not res.timed_out
            output = (res.stdout + res.stderr) or ""
            how = (
                f"timed out after {spec.timeout_s:g} s"
                if res.timed_out
                else f"exit code {res.exit_code}"
            )
        if ok:
            log.debug("healthcheck of %s passed after %d attempts", sandbox.id, attempts)
            return
        if in_start_period:
            await sleep(spec.start_interval_s)
            continue
        failures += 1
        if failures >= spec.retries:
            raise SandboxHealthcheckError(
                f"healthcheck of sandbox {sandbox.id} failed {failures} times in a row "
                f"({attempts} attempts in all): `{command}`; last attempt: {how}, output: "
                f"{_tail(output) or '(none)'}",
                output=_tail(output),
            )
        await sleep(spec.interval_s)


async def ensure_healthy(sandbox: Sandbox) -> None:
    """Wait for the sandbox's own healthcheck (`spec.healthcheck`), if any; on failure the
    sandbox is closed and the error raised (a creation that failed leaves nothing behind)."""
    spec = sandbox.spec.healthcheck
    if spec is None:
        return
    try:
        await run_healthcheck(sandbox, spec)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(sandbox.close())
        raise

"""`run_checked`: a root command in a sandbox that must succeed, else a `TaskError` with its
output. What the task layer runs for its own book-keeping (WORKDIR, COPY --chmod, resetting the
tests), as opposed to the task's scripts, whose exit codes are data."""

from __future__ import annotations

from typing import Any

from sandgym.sandboxes import ExecResult, Sandbox
from sandgym.tasks.errors import TaskError


async def run_checked(sandbox: Sandbox, cmd: str, what: str, **kw: Any) -> ExecResult:
    """Run `cmd` as root; a non-zero exit is a `TaskError` naming `what` and the output's tail."""
    res = await sandbox.exec(cmd, user="root", **kw)
    if res.exit_code != 0:
        raise TaskError(
            f"{what} failed in sandbox {sandbox.id} (exit {res.exit_code}, "
            f"timed_out={res.timed_out}): {(res.stderr or res.stdout)[-1500:]}"
        )
    return res

"""Apply one non-terminal ACTION to a sandbox and turn what happened into an `Observation`.

Agent mistakes are data, not errors: a failing command, a missing file or a refused path come
back as an observation (with a non-zero `exit_code`) so the policy can learn from them. Only
infrastructure failures (a dead sandbox, a shell that does not come back) raise, and
`envserver.errors.to_wire_error` turns those into a code.

Desktop actions (`click`, ..., `screenshot`) go to the episode's `sandboxes.desktop.Desktop`
(started at reset for tasks whose metadata says `sandgym_desktop = true`); on a task without a
desktop they raise `UnsupportedActionError` (wire code `invalid_message`).
"""

from __future__ import annotations

from typing import Any

from envserver.errors import UnsupportedActionError
from envserver.protocol import (
    CommandAction,
    KeysAction,
    Observation,
    ReadFileAction,
    WriteFileAction,
)
from sandboxes import Sandbox
from sandboxes.errors import SandboxFileNotFoundError, SandboxPathError
from sandboxes.spec import truncate_output

TIMEOUT_MARKER = "\n[sandgym: command timed out after {timeout_s:g}s and was killed]\n"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:  # characters <= bytes, so this skips the encode in the common case
        return text
    return truncate_output(text.encode(), limit)[0]


async def apply_action(
    sandbox: Sandbox,
    action: Any,
    *,
    timeout_s: float,
    max_output_bytes: int,
) -> tuple[Observation, dict[str, Any]]:
    """Run `action` (anything but `submit`) and return (observation, extra info)."""
    if isinstance(action, CommandAction):
        res = await sandbox.run(action.command, timeout_s=timeout_s)
        output = _cut(res.output, max_output_bytes)
        info: dict[str, Any] = {}
        if res.timed_out:
            # A command that outlives its timeout is the agent's doing: report it as data.
            output += TIMEOUT_MARKER.format(timeout_s=timeout_s)
            info["timed_out"] = True
        if res.truncated:
            info["output_truncated"] = True
        return Observation(output=output, exit_code=res.exit_code), info
    if isinstance(action, KeysAction):
        await sandbox.send_keys(action.keys)
        screen = await sandbox.screen()
        return Observation(output="", exit_code=None, screen=screen), {}
    if isinstance(action, WriteFileAction):
        try:
            await sandbox.write_file(action.path, action.content, mode=action.mode)
        except SandboxPathError as exc:
            return Observation(output=f"write_file: {exc}\n", exit_code=1), {}
        return Observation(output="", exit_code=0), {}
    if isinstance(action, ReadFileAction):
        limit = min(action.max_bytes or max_output_bytes, max_output_bytes)
        try:
            data = await sandbox.read_file(action.path, max_bytes=limit + 1)
        except (SandboxPathError, SandboxFileNotFoundError) as exc:
            return Observation(output=f"read_file: {exc}\n", exit_code=1), {}
        text, cut = truncate_output(data, limit)
        return Observation(output=text, exit_code=0), ({"output_truncated": True} if cut else {})
    raise UnsupportedActionError(f"unsupported action kind {getattr(action, 'kind', action)!r}")


async def apply_desktop(desktop: Any, action: Any) -> Observation:
    """Apply a desktop action (`click` ... `screenshot`) on the episode's desktop."""
    if desktop is None:
        raise UnsupportedActionError(
            f"action {action.kind!r} needs a desktop task (metadata sandgym_desktop = true); "
            "this episode's task has no desktop"
        )
    from sandboxes.desktop import apply_desktop_action

    fields = await apply_desktop_action(desktop, action.model_dump(exclude_none=True))
    return Observation(
        output=fields.get("output", ""), exit_code=fields.get("exit_code"), image=fields["image"]
    )

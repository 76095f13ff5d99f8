"""Apply one non-terminal ACTION to a sandbox and turn what happened into an `Observation`.

Agent mistakes are data, not errors: a failing command, a missing file or a refused path come
back as an observation (with a non-zero `exit_code`) so the policy can learn from them. Only
infrastructure failures (a dead sandbox, a shell that does not come back) raise, and
`sandgym.server.errors.to_wire_error` turns those into a code.

Desktop actions (`click`, ..., `screenshot`; the kinds `sandgym.wire.protocol.DESKTOP_ACTION_KINDS`
reads off the models) are mapped here onto the methods of the episode's
`sandgym.sandboxes.desktop.Desktop` (started at reset for tasks whose metadata says
`sandgym_desktop = true`) by `apply_desktop_action`; on a task without a desktop they raise
`UnsupportedActionError` (wire code `invalid_message`).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from typing import Any

from sandgym.sandboxes import Sandbox
from sandgym.sandboxes.desktop import Desktop, DesktopActionError
from sandgym.sandboxes.errors import SandboxFileNotFoundError, SandboxPathError
from sandgym.sandboxes.spec import ExecResult, truncate_output
from sandgym.server.errors import UnsupportedActionError
from sandgym.wire.protocol import (
    DESKTOP_ACTION_KINDS,
    CommandAction,
    KeysAction,
    Observation,
    ReadFileAction,
    WriteFileAction,
)

TIMEOUT_MARKER = "\n[sandgym: command timed out after {timeout_s:g}s and was killed]\n"
#: after the (cut) output of a command that ended the persistent shell
SHELL_EXITED_MARKER = (
    "\n[sandgym: this command ended the shell; the next command runs in a new shell (the working "
    "directory, variables and background jobs of this one are gone)]\n"
)


def _cut(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to `limit` bytes (with the marker that says how much went), and whether it was."""
    if len(text) <= limit:  # characters <= bytes, so this skips the encode in the common case
        return text, False
    return truncate_output(text.encode(), limit)


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
        output, cut = _cut(res.output, max_output_bytes)
        info: dict[str, Any] = {}
        if res.timed_out:
            # A command that outlives its timeout is the agent's doing: report it as data.
            output += TIMEOUT_MARKER.format(timeout_s=timeout_s)
            info["timed_out"] = True
        if res.shell_exited:
            output += SHELL_EXITED_MARKER
            info["shell_exited"] = True
        if res.truncated or cut:
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
    fields = await apply_desktop_action(desktop, action.model_dump(exclude_none=True))
    return Observation(
        output=fields.get("output", ""), exit_code=fields.get("exit_code"), image=fields["image"]
    )


def _desktop_int(action: Mapping[str, Any], name: str, default: Any = ...) -> Any:
    if name not in action or action[name] is None:
        if default is ...:
            raise DesktopActionError(
                f"desktop action {action.get('kind')!r} needs an integer {name!r}; "
                f"got fields {sorted(action)}"
            )
        return default
    value = action[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise DesktopActionError(
            f"desktop action {action.get('kind')!r}: expected an integer {name!r}, got {value!r}"
        )
    return value


async def apply_desktop_action(desktop: Desktop, action: Mapping[str, Any] | Any) -> dict[str, Any]:
    """Apply one contract-2 desktop action and return observation fields.

    `action` is a dict (or a pydantic model of `sandgym.wire.protocol`) with `kind` one of
    `DESKTOP_ACTION_KINDS` and the protocol's field names: click/double_click {x, y, button},
    move {x, y}, drag {x, y, to_x, to_y, button}, scroll {dy, dx, x?, y?}, type {text},
    key {key}, screenshot {scale?}. Returns `{"output", "exit_code", "image"}` where `image` is
    a base64 PNG taken after the action.

    The agent's mistakes are data it can learn from: a point outside the screen, an unknown
    key chord or a failing xdotool come back with a non-zero `exit_code` and the reason in
    `output` (and the unchanged screen). A malformed action (unknown kind, a missing or
    mistyped field, a bad `scale`) raises `DesktopActionError`.
    """
    if hasattr(action, "model_dump"):
        action = action.model_dump()
    if not isinstance(action, Mapping):
        raise DesktopActionError(f"expected a desktop action dict, got {type(action).__name__}")
    kind = action.get("kind")
    if kind not in DESKTOP_ACTION_KINDS:
        raise DesktopActionError(
            f"expected a desktop action kind in {sorted(DESKTOP_ACTION_KINDS)}, got {kind!r}"
        )
    scale = action.get("scale")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float) or not 0.05 <= scale <= 4
    ):
        raise DesktopActionError(f"expected a number 'scale' in 0.05..4, got {scale!r}")
    button = action.get("button", 1)
    if not isinstance(button, int | str):
        raise DesktopActionError(f"expected 'button' as a number or a name, got {button!r}")
    # Read every field first: a malformed action must raise before anything happens.
    call: Any = None
    if kind in ("click", "double_click"):
        method = desktop.click if kind == "click" else desktop.double_click
        x, y = _desktop_int(action, "x"), _desktop_int(action, "y")
        call = lambda: method(x, y, button)  # noqa: E731
    elif kind == "move":
        x, y = _desktop_int(action, "x"), _desktop_int(action, "y")
        call = lambda: desktop.move(x, y)  # noqa: E731
    elif kind == "drag":
        x, y, tx, ty = (_desktop_int(action, k) for k in ("x", "y", "to_x", "to_y"))
        call = lambda: desktop.drag(x, y, tx, ty, button)  # noqa: E731
    elif kind == "scroll":
        sx, sy = _desktop_int(action, "x", None), _desktop_int(action, "y", None)
        dy, dx = _desktop_int(action, "dy", 0), _desktop_int(action, "dx", 0)
        call = lambda: desktop.scroll(sx, sy, dy, dx)  # noqa: E731
    elif kind in ("type", "key"):
        field = "text" if kind == "type" else "key"
        value = action.get(field)
        if not isinstance(value, str):
            raise DesktopActionError(
                f"desktop action {kind!r} needs a string {field!r}, got {value!r}"
            )
        call = (lambda: desktop.type(value)) if kind == "type" else (lambda: desktop.key(value))
    output, exit_code = "", 0
    if call is not None:
        try:
            res: ExecResult = await call()
            output, exit_code = res.stdout + res.stderr, res.exit_code or 0
            if res.exit_code is None:
                output, exit_code = output + f"{kind}: timed out\n", 124
        except DesktopActionError as exc:
            output, exit_code = f"{kind}: {exc}\n", 2
        if exit_code == 0:
            await asyncio.sleep(0.05)  # let the app redraw after the input before we look
    png = await desktop.screenshot(scale=float(scale) if scale is not None else None)
    return {"output": output, "exit_code": exit_code, "image": base64.b64encode(png).decode()}

"""Apply one non-terminal ACTION to a sandbox and turn what happened into an `Observation`.

Agent mistakes are data, not errors: a failing command, a missing file or a refused path come
back as an observation (with a non-zero `exit_code`) so the policy can learn from them. Only
infrastructure failures (a dead sandbox, a shell that does not come back) raise, and
`envserver.errors.to_wire_error` turns those into a code.

Desktop actions (`click`, ..., `screenshot`) drive the sandbox's X display with `xdotool` and
take screenshots with `scrot` or ImageMagick's `import`; a sandbox without them answers with
`UnsupportedActionError` (wire code `invalid_message`).
"""

from __future__ import annotations

import shlex
from typing import Any

from envserver.errors import UnsupportedActionError
from envserver.protocol import (
    ClickAction,
    CommandAction,
    DoubleClickAction,
    DragAction,
    KeyAction,
    KeysAction,
    MoveAction,
    Observation,
    ReadFileAction,
    ScreenshotAction,
    ScrollAction,
    TypeAction,
    WriteFileAction,
)
from sandboxes import Sandbox
from sandboxes.errors import SandboxFileNotFoundError, SandboxPathError
from sandboxes.spec import truncate_output

TIMEOUT_MARKER = "\n[sandgym: command timed out after {timeout_s:g}s and was killed]\n"
_BUTTONS = {"left": 1, "middle": 2, "right": 3}
_SCREENSHOT = (
    'f=$(mktemp --suffix=.png) && { scrot -o "$f" || import -window root "$f"; } '
    '>/dev/null 2>&1 && base64 -w0 "$f"; rc=$?; rm -f "$f"; exit $rc'
)


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
    return await _desktop(sandbox, action, timeout_s=timeout_s)


def _xdotool_args(action: Any) -> list[str]:
    if isinstance(action, ClickAction):
        return ["mousemove", str(action.x), str(action.y), "click", str(_BUTTONS[action.button])]
    if isinstance(action, DoubleClickAction):
        button = str(_BUTTONS[action.button])
        return ["mousemove", str(action.x), str(action.y), "click", "--repeat", "2", button]
    if isinstance(action, MoveAction):
        return ["mousemove", str(action.x), str(action.y)]
    if isinstance(action, DragAction):
        button = str(_BUTTONS[action.button])
        return ["mousemove", str(action.x), str(action.y), "mousedown", button,
                "mousemove", str(action.to_x), str(action.to_y), "mouseup", button]  # fmt: skip
    if isinstance(action, ScrollAction):
        args: list[str] = []
        if action.x is not None and action.y is not None:
            args += ["mousemove", str(action.x), str(action.y)]
        # X buttons 4/5 scroll up/down, 6/7 left/right; one click per notch.
        for count, neg, pos in ((action.dy, "4", "5"), (action.dx, "6", "7")):
            if count:
                args += ["click", "--repeat", str(abs(count)), pos if count > 0 else neg]
        return args
    if isinstance(action, TypeAction):
        return ["type", "--", action.text]
    if isinstance(action, KeyAction):
        return ["key", "--", action.key]
    raise UnsupportedActionError(f"unsupported action kind {getattr(action, 'kind', action)!r}")


async def _desktop(
    sandbox: Sandbox, action: Any, *, timeout_s: float
) -> tuple[Observation, dict[str, Any]]:
    # The desktop image sets DISPLAY itself; only a spec that names one overrides it.
    display = sandbox.spec.env.get("DISPLAY")
    env = {"DISPLAY": display} if display else None
    if not isinstance(action, ScreenshotAction):
        args = _xdotool_args(action)
        if args:
            res = await sandbox.exec(["xdotool", *args], timeout_s=timeout_s, env=env)
            if res.exit_code == 127:
                raise UnsupportedActionError(
                    f"desktop action {action.kind!r} needs xdotool and an X display in the "
                    f"sandbox; found none ({res.stderr.strip()[:200]})"
                )
            if res.exit_code != 0:
                return Observation(output=res.stdout + res.stderr, exit_code=res.exit_code), {}
    shot = await sandbox.exec(_SCREENSHOT, timeout_s=timeout_s, env=env)
    if shot.exit_code != 0 or not shot.stdout:
        raise UnsupportedActionError(
            f"screenshot needs scrot or ImageMagick and an X display in the sandbox; "
            f"got exit code {shot.exit_code} ({shot.stderr.strip()[:200]})"
        )
    return Observation(output="", exit_code=0, image=shot.stdout.strip()), {}


def describe(action: Any) -> str:
    """A short, log-safe description of an action."""
    if isinstance(action, CommandAction):
        return "command " + shlex.quote(action.command[:80])
    return str(getattr(action, "kind", "?"))

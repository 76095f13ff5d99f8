"""A desktop task's screen and app, brought up at the start of its episode.

Desktop tasks declare themselves in their metadata (Harbor `task.toml`, `[metadata]`):

    sandgym_desktop = true
    desktop_width = 1024                         # optional, default 1024
    desktop_height = 768                         # optional, default 768
    desktop_start = "/opt/desktop-app/start.sh"  # optional: the task's app, started at reset
    desktop_window = "Sandgym Form"              # optional: wait for this window title

and `start_task_desktop(sandbox, task.metadata)` brings such an episode's desktop up on the
`sandgym.sandboxes.desktop.Desktop` primitive.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.desktop import (
    DEFAULT_HEIGHT,
    DEFAULT_WIDTH,
    STATE_DIR,
    Desktop,
    DesktopStartError,
)

#: Metadata keys of a desktop task (see the module docstring).
META_FLAG = "sandgym_desktop"


def is_desktop_task(metadata: Mapping[str, Any]) -> bool:
    """True when a task's metadata marks it as a desktop task (`sandgym_desktop = true`)."""
    return metadata.get(META_FLAG) is True


async def start_task_desktop(
    sandbox: Sandbox,
    metadata: Mapping[str, Any],
    user: str | None = None,
    timeout_s: float = 30.0,
) -> Desktop | None:
    """Bring up a desktop task's screen and app: None for a task that is not a desktop task.

    Call after the episode's files are in place (`sandgym.tasks.episode_start.prepare_episode`) and before
    the agent's first observation or the oracle. Starts the display (size from
    `desktop_width`/`desktop_height`), runs `desktop_start` in the background as `user`, and
    waits for the window titled `desktop_window` when one is named.
    """
    if not is_desktop_task(metadata):
        return None
    width = metadata.get("desktop_width", DEFAULT_WIDTH)
    height = metadata.get("desktop_height", DEFAULT_HEIGHT)
    if not (isinstance(width, int) and isinstance(height, int)):
        raise DesktopStartError(
            f"expected integer desktop_width/desktop_height in metadata, got {width!r}x{height!r}"
        )
    desktop = await Desktop.start(sandbox, width=width, height=height, timeout_s=timeout_s)
    start = metadata.get("desktop_start")
    if start:
        if not isinstance(start, str) or not start.startswith("/"):
            raise DesktopStartError(
                f"expected desktop_start to be an absolute path inside the sandbox, got {start!r}"
            )
        num = desktop.display[1:]
        # The marker (created atomically with noclobber) makes a second call a no-op: the
        # env server and a CLI may both prepare the same episode, and two copies of the app
        # would put two windows on the screen.
        res = await sandbox.exec(
            f"test -f {shlex.quote(start)} || "
            f"{{ echo 'desktop_start {start} not found in the sandbox' >&2; exit 2; }}; "
            f"( set -C; : >{STATE_DIR}/app-{num}.started ) 2>/dev/null || exit 0; "
            f"setsid bash {shlex.quote(start)} >{STATE_DIR}/app-{num}.log 2>&1 </dev/null &",
            timeout_s=timeout_s,
            env=desktop.env,
            user=user,
        )
        if res.exit_code != 0:
            raise DesktopStartError(
                f"sandbox {sandbox.id}: could not launch the task app: {res.stderr.strip()}"
            )
    window = metadata.get("desktop_window")
    if window:
        try:
            await desktop.wait_for_window(str(window), timeout_s=timeout_s)
        except DesktopStartError as exc:
            log = await sandbox.exec(
                f"tail -n 30 {STATE_DIR}/app-{desktop.display[1:]}.log 2>/dev/null", timeout_s=10
            )
            raise DesktopStartError(f"{exc}; app log: {log.stdout.strip()[-1500:]}") from None
        # The first frame after mapping can still be blank: let the toolkit draw once.
        await desktop.exec("xdotool sleep 0.2", timeout_s=10)
    return desktop

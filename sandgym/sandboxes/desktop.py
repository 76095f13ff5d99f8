"""A virtual desktop inside any `Sandbox`: an X server, a window manager, input and screenshots.

`Desktop.start(sandbox)` launches Xvfb (an X server that draws into memory) and a window manager
inside the sandbox through `sandbox.exec`, as background processes that outlive the exec (the
local backend keeps them in the sandbox's cgroup, docker in the container), and waits until the
display answers. Input goes through `xdotool`, screenshots through `scrot` (ImageMagick's
`import` when scaled), all run by `sandbox.exec` with `DISPLAY` set, so the same code drives
the local, docker and E2B backends. Nothing here imports the rest of sandgym, and nothing here
knows the wire protocol: `sandgym.server.actions.apply_desktop_action` maps a wire action onto these
methods.

Example:
    >>> async def demo(sandbox):                       # doctest: +SKIP
    ...     desktop = await Desktop.start(sandbox, width=800, height=600)
    ...     await desktop.click(100, 200)
    ...     await desktop.type("hello")
    ...     await desktop.key("ctrl+s")
    ...     png = await desktop.screenshot(scale=0.5)  # bytes of a PNG

Which tasks run a desktop, and their app's start-up, are the task layer's business, not this
module's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import shlex
from pathlib import Path

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.errors import SandboxError
from sandgym.sandboxes.spec import ExecResult

DEFAULT_DISPLAY = ":99"
DEFAULT_WIDTH = 1024
DEFAULT_HEIGHT = 768
#: Where logs and screenshots of the desktop live inside the sandbox.
STATE_DIR = "/tmp/.sandgym-desktop"
#: Window managers tried in order when `window_manager="auto"` (the first one installed wins).
WINDOW_MANAGERS = ("openbox", "matchbox-window-manager", "twm")
BUTTONS = {"left": 1, "middle": 2, "right": 3}
#: Screenshots up to this size come back inline as base64 (well under exec's output cap).
_INLINE_SHOT_BYTES = 512 * 1024
_DISPLAY_RE = re.compile(r"^:(\d{1,4})$")
_KEY_RE = re.compile(r"^[A-Za-z0-9_+\-]+$")


class DesktopError(SandboxError):
    """Base class of the desktop layer's errors."""


class DesktopUnavailableError(DesktopError, RuntimeError):
    """The sandbox lacks a program the desktop needs (Xvfb, xdotool, a screenshot tool)."""


class DesktopStartError(DesktopError, RuntimeError):
    """The X server or the task's app did not come up in time."""


class DesktopActionError(DesktopError, ValueError):
    """A desktop action dict is malformed (unknown kind, missing or out-of-range field)."""


class Desktop:
    """A running X display inside `sandbox`. Create with `await Desktop.start(sandbox)`.

    Every call serialises on one lock: interleaving two agents' pointer moves on one screen
    means nothing, and the screenshot file is shared.
    """

    def __init__(self, sandbox: Sandbox, display: str, width: int, height: int) -> None:
        if not _DISPLAY_RE.match(display):
            raise DesktopActionError(f"expected a display like ':99', got {display!r}")
        self.sandbox = sandbox
        self.display = display
        self.width = width
        self.height = height
        self.window_manager: str | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"Desktop(sandbox={self.sandbox.id}, display={self.display}, {self.width}x{self.height})"

    @property
    def env(self) -> dict[str, str]:
        """Environment for commands that talk to this display."""
        return {"DISPLAY": self.display}

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    async def start(
        cls,
        sandbox: Sandbox,
        width: int = DEFAULT_WIDTH,
        height: int = DEFAULT_HEIGHT,
        display: str | None = None,
        window_manager: str | None = "auto",
        timeout_s: float = 30.0,
    ) -> Desktop:
        """Start Xvfb (and a window manager) in `sandbox` and wait until the display answers.

        The display is `display`, else the sandbox's `DISPLAY` variable (a task image sets it,
        and every command of the episode must agree on it), else the first free one from :99.
        A display that already answers is reused (calling `start` twice is harmless).
        `window_manager`: "auto" (the first of `WINDOW_MANAGERS` found), a program name, or None.
        """
        if not (16 <= width <= 8192 and 16 <= height <= 8192):
            raise DesktopActionError(f"expected 16..8192 pixels a side, got {width}x{height}")
        fixed = display or sandbox.spec.env.get("DISPLAY")
        if fixed is not None and not _DISPLAY_RE.match(fixed):
            raise DesktopStartError(
                f"sandbox {sandbox.id}: expected DISPLAY like ':99' (a local display), got {fixed!r}"
            )
        await _require(sandbox, ["Xvfb", "xdotool", "xdpyinfo"])
        await _warm_font_cache(sandbox)
        candidates = [fixed] if fixed else [f":{n}" for n in range(99, 109)]
        errors: list[str] = []
        for disp in candidates:
            desktop = cls(sandbox, disp, width, height)
            status, detail = await desktop._start_xvfb(timeout_s)
            if status == "up" or status == "running":
                if status == "up" and window_manager is not None:
                    await desktop._start_window_manager(window_manager, timeout_s)
                if status == "running":
                    await desktop._read_geometry()
                return desktop
            errors.append(f"{disp}: {detail}")
            if "already" not in detail and "listening sockets" not in detail:
                break  # not a display-number clash: another number would fail the same way
        raise DesktopStartError(
            f"sandbox {sandbox.id}: no X display came up (tried {', '.join(candidates)}): "
            + "; ".join(errors)
        )

    async def _start_xvfb(self, timeout_s: float) -> tuple[str, str]:
        """'up' (started), 'running' (was already there), or ('failed', why)."""
        num = self.display[1:]
        log = f"{STATE_DIR}/xvfb-{num}.log"
        # `-nolisten local` drops the abstract socket, which lives in the network namespace:
        # sandboxes that share the host's network would otherwise fight over display numbers.
        # setsid + redirected stdio: the server must outlive this exec and hold none of its pipes.
        script = f"""
set -u
if xdpyinfo -display {self.display} >/dev/null 2>&1; then echo running; exit 0; fi
mkdir -p {STATE_DIR} /tmp/.X11-unix && chmod 1777 {STATE_DIR} /tmp/.X11-unix 2>/dev/null
rm -f /tmp/.X{num}-lock /tmp/.X11-unix/X{num}
setsid Xvfb {self.display} -screen 0 {self.width}x{self.height}x24 -nolisten tcp \
  -nolisten local -noreset >{log} 2>&1 </dev/null &
pid=$!
echo $pid >{STATE_DIR}/xvfb-{num}.pid
end=$(( $(date +%s) + {int(timeout_s)} ))
while [ "$(date +%s)" -le "$end" ]; do
  if xdpyinfo -display {self.display} >/dev/null 2>&1; then echo up; exit 0; fi
  if ! kill -0 $pid 2>/dev/null; then echo died; tail -n 20 {log}; exit 3; fi
  sleep 0.05
done
echo timeout; tail -n 20 {log}; kill $pid 2>/dev/null; exit 4
"""
        res = await self.sandbox.exec(script, timeout_s=timeout_s + 10)
        first, _, rest = res.stdout.strip().partition("\n")
        if res.exit_code == 0 and first in ("up", "running"):
            return first, ""
        return "failed", f"Xvfb {first or 'gave no answer'} (exit {res.exit_code}): " + (
            rest or res.stderr
        ).strip()[-800:]

    async def _start_window_manager(self, choice: str, timeout_s: float) -> None:
        names = WINDOW_MANAGERS if choice == "auto" else (choice,)
        found = await self.sandbox.exec(
            "for w in " + " ".join(shlex.quote(n) for n in names) + "; do "
            'command -v "$w" >/dev/null 2>&1 && { echo "$w"; exit 0; }; done; exit 1',
            timeout_s=10,
        )
        if found.exit_code != 0:
            if choice != "auto":
                raise DesktopUnavailableError(
                    f"sandbox {self.sandbox.id}: window manager {choice!r} is not installed"
                )
            return  # no WM: windows still map, undecorated at their requested positions
        wm = found.stdout.strip()
        num = self.display[1:]
        # openbox and matchbox set _NET_SUPPORTING_WM_CHECK on the root window once they manage
        # it; twm never does, so for it a short settle is all we can wait for.
        script = f"""
mkdir -p {STATE_DIR}
setsid {shlex.quote(wm)} >{STATE_DIR}/wm-{num}.log 2>&1 </dev/null &
pid=$!
for i in $(seq {int(timeout_s * 20)}); do
  if xprop -root _NET_SUPPORTING_WM_CHECK 2>/dev/null | grep -q 'window id'; then exit 0; fi
  if ! kill -0 $pid 2>/dev/null; then tail -n 20 {STATE_DIR}/wm-{num}.log; exit 3; fi
  [ {shlex.quote(wm)} = twm ] && [ "$i" -ge 10 ] && exit 0
  sleep 0.05
done
exit 4
"""
        res = await self.sandbox.exec(script, timeout_s=timeout_s + 10, env=self.env)
        if res.exit_code != 0:
            raise DesktopStartError(
                f"sandbox {self.sandbox.id}: window manager {wm} did not take the display "
                f"{self.display} (exit {res.exit_code}): {(res.stdout + res.stderr)[-800:]}"
            )
        self.window_manager = wm

    async def _read_geometry(self) -> None:
        res = await self.xdotool("getdisplaygeometry")
        parts = res.stdout.split()
        if res.exit_code == 0 and len(parts) == 2 and all(p.isdigit() for p in parts):
            self.width, self.height = int(parts[0]), int(parts[1])

    async def is_running(self) -> bool:
        """True while the X server answers."""
        res = await self.sandbox.exec(
            f"xdpyinfo -display {self.display} >/dev/null 2>&1", timeout_s=10
        )
        return res.exit_code == 0

    async def stop(self) -> None:
        """Stop the X server (every app on it dies with it). Closing the sandbox also does."""
        num = self.display[1:]
        await self.sandbox.exec(
            f"kill $(cat {STATE_DIR}/xvfb-{num}.pid 2>/dev/null) 2>/dev/null; true", timeout_s=10
        )

    # -- commands ----------------------------------------------------------------------------
    async def exec(self, cmd: str | list[str], timeout_s: float = 30.0) -> ExecResult:
        """Run a command in the sandbox with this display's `DISPLAY`."""
        return await self.sandbox.exec(cmd, timeout_s=timeout_s, env=self.env)

    async def xdotool(self, *args: str, timeout_s: float = 30.0) -> ExecResult:
        """Run `xdotool ARGS...` on this display (a non-zero exit code is data)."""
        return await self.exec(["xdotool", *args], timeout_s=timeout_s)

    async def _input(self, *args: str, timeout_s: float = 30.0) -> ExecResult:
        async with self._lock:
            return await self.xdotool(*args, timeout_s=timeout_s)

    def _xy(self, x: int, y: int) -> tuple[str, str]:
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise DesktopActionError(
                f"expected a point inside the {self.width}x{self.height} screen, got ({x}, {y})"
            )
        return str(int(x)), str(int(y))

    async def click(self, x: int, y: int, button: int | str = 1) -> ExecResult:
        """Move the pointer to (x, y) and click `button` (1/left, 2/middle, 3/right)."""
        return await self._input("mousemove", *self._xy(x, y), "click", _button(button))

    async def double_click(self, x: int, y: int, button: int | str = 1) -> ExecResult:
        """Two clicks at (x, y), close enough together to count as a double click."""
        return await self._input(
            "mousemove", *self._xy(x, y), "click", "--repeat", "2", "--delay", "80", _button(button)
        )

    async def move(self, x: int, y: int) -> ExecResult:
        """Move the pointer to (x, y)."""
        return await self._input("mousemove", *self._xy(x, y))

    async def drag(
        self, x1: int, y1: int, x2: int, y2: int, button: int | str = 1, steps: int = 8
    ) -> ExecResult:
        """Press at (x1, y1), move to (x2, y2) through `steps` intermediate points, release.

        Intermediate motion events matter: widgets such as Tk's scale and canvas track the
        pointer through <Motion>, and a single jump can be missed as a drag.
        """
        b = _button(button)
        a, c = self._xy(x1, y1), self._xy(x2, y2)
        path: list[str] = []
        for i in range(1, steps + 1):
            px = x1 + (x2 - x1) * i // steps
            py = y1 + (y2 - y1) * i // steps
            path += ["mousemove", str(px), str(py), "sleep", "0.02"]
        return await self._input("mousemove", *a, "mousedown", b, "sleep", "0.05", *path,
                                 "mousemove", *c, "sleep", "0.05", "mouseup", b)  # fmt: skip

    async def scroll(self, x: int | None, y: int | None, dy: int, dx: int = 0) -> ExecResult:
        """Scroll `dy` notches down (negative: up) and `dx` right, at (x, y) when given."""
        args: list[str] = []
        if x is not None and y is not None:
            args += ["mousemove", *self._xy(x, y)]
        # X buttons 4/5 scroll up/down and 6/7 left/right, one click per notch.
        for count, neg, pos in ((dy, "4", "5"), (dx, "6", "7")):
            if count:
                args += ["click", "--repeat", str(abs(count)), "--delay", "30",
                         pos if count > 0 else neg]  # fmt: skip
        if not args:
            return ExecResult(exit_code=0)
        return await self._input(*args)

    async def type(self, text: str, delay_ms: int = 12) -> ExecResult:
        """Type `text` into the focused window as keystrokes (newlines press Return).

        Known limit: a character the keymap lacks (é, ß, emoji...) makes xdotool bind it to a
        spare key for one stroke; now and then (about 1 in 8 first strokes here) the client
        reads the keymap too late and drops it. ASCII text is exact.
        """
        if not text:
            return ExecResult(exit_code=0)
        return await self._input(
            "type", "--delay", str(delay_ms), "--", text,
            timeout_s=30.0 + len(text) * delay_ms / 1000 * 2,
        )  # fmt: skip

    async def key(self, combo: str) -> ExecResult:
        """Press key chords in X keysym names: "ctrl+s", "Return", "ctrl+a BackSpace"."""
        chords = combo.split()
        if not chords or not all(_KEY_RE.match(c) for c in chords):
            raise DesktopActionError(
                f"expected key chords like 'ctrl+s' or 'Return' (keysyms joined by '+', chords "
                f"separated by spaces), got {combo!r}"
            )
        res = await self._input("key", "--delay", "30", "--", *chords)
        if res.exit_code == 0 and "No such key name" in res.stderr:
            # xdotool skips an unknown keysym and still exits 0; the caller must hear of it.
            return res.model_copy(update={"exit_code": 1})
        return res

    async def screenshot(self, scale: float | None = None) -> bytes:
        """A PNG (8-bit RGB) of the whole screen, resized by `scale` (0.05..4) when given."""
        if scale is not None and not (0.05 <= scale <= 4.0):
            raise DesktopActionError(f"expected a screenshot scale in 0.05..4, got {scale}")
        path = f"{STATE_DIR}/shot-{self.display[1:]}.png"
        resize = f"-resize {scale * 100:.2f}%" if scale is not None and scale != 1.0 else ""
        # scrot is the fastest here (~0.1 s against ~0.3 s for ImageMagick's start-up), but
        # only ImageMagick resizes; both write 8-bit RGB. `import -silent` skips the bell.
        # PNG bytes cannot travel through exec's text stdout, so a small shot comes back as
        # base64 in the same exec (one round trip) and a large one is read back as a file.
        shoot = f"import -silent -window root {resize} png24:{path}"
        if not resize:
            shoot = f"{{ scrot -o {path} 2>/dev/null || {shoot}; }}"
        cmd = (
            f"mkdir -p {STATE_DIR} && rm -f {path} || exit 1; "
            f"command -v import >/dev/null 2>&1 || {{ [ -z '{resize}' ] && command -v scrot "
            f">/dev/null 2>&1; }} || {{ echo 'no screenshot tool: install imagemagick (or "
            f"scrot)' >&2; exit 127; }}; "
            f"{shoot} || exit $?; "
            f'if [ "$(stat -c %s {path})" -le {_INLINE_SHOT_BYTES} ]; then base64 -w0 {path}; '
            f"else echo @file; fi"
        )
        async with self._lock:
            res = await self.exec(cmd, timeout_s=30)
            if res.exit_code == 127:
                raise DesktopUnavailableError(
                    f"sandbox {self.sandbox.id}: {res.stderr.strip() or 'import not found'}"
                )
            if res.exit_code != 0:
                raise DesktopError(
                    f"screenshot of {self.display} in sandbox {self.sandbox.id} failed "
                    f"(exit {res.exit_code}): {res.stderr.strip()[-500:]}"
                )
            out = res.stdout.strip()
            if out == "@file" or res.truncated:
                data = await self.sandbox.read_file(path)
            else:
                try:
                    data = base64.b64decode(out, validate=True)
                except ValueError:
                    raise DesktopError(
                        f"screenshot of {self.display}: expected base64 PNG, got {out[:60]!r}"
                    ) from None
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            raise DesktopError(
                f"screenshot of {self.display}: expected PNG bytes, got {data[:16]!r}"
            )
        return data

    # -- windows -----------------------------------------------------------------------------
    async def wait_for_window(self, name: str, timeout_s: float = 30.0) -> str:
        """Wait until a visible window whose title matches the regex `name` exists; its id."""
        script = (
            f"for i in $(seq {max(1, int(timeout_s * 10))}); do "
            f"w=$(xdotool search --onlyvisible --name {shlex.quote(name)} 2>/dev/null | head -n1); "
            '[ -n "$w" ] && { echo "$w"; exit 0; }; sleep 0.1; done; exit 1'
        )
        res = await self.exec(script, timeout_s=timeout_s + 10)
        if res.exit_code != 0 or not res.stdout.strip():
            titles = await self.exec(
                "xdotool search --onlyvisible --name . getwindowname %@ 2>/dev/null", timeout_s=10
            )
            raise DesktopStartError(
                f"no visible window titled {name!r} on {self.display} after {timeout_s:g} s; "
                f"visible windows: {titles.stdout.split(chr(10))[:10]}"
            )
        return res.stdout.strip()

    async def window_geometry(self, window_id: str) -> tuple[int, int, int, int]:
        """(x, y, width, height) of a window's inside, in screen pixels.

        `xwininfo`, not `xdotool getwindowgeometry`: the latter counts a reparenting window
        manager's frame offset twice and reports a point below the real client area.
        """
        res = await self.exec(["xwininfo", "-id", window_id], timeout_s=10)
        vals: dict[str, int] = {}
        for line in res.stdout.splitlines():
            key, _, value = line.strip().partition(":")
            if value.strip().lstrip("-").isdigit():
                vals[key] = int(value)
        try:
            return (
                vals["Absolute upper-left X"],
                vals["Absolute upper-left Y"],
                vals["Width"],
                vals["Height"],
            )
        except KeyError:
            raise DesktopError(
                f"window {window_id}: expected its geometry from xwininfo, got "
                f"{res.stdout.strip()[-300:]!r} {res.stderr.strip()[-300:]!r}"
            ) from None


def _button(button: int | str) -> str:
    if isinstance(button, str) and button in BUTTONS:
        return str(BUTTONS[button])
    if isinstance(button, int) and not isinstance(button, bool) and 1 <= button <= 9:
        return str(button)
    raise DesktopActionError(
        f"expected a mouse button 1..9 or one of {sorted(BUTTONS)}, got {button!r}"
    )


async def _warm_font_cache(sandbox: Sandbox) -> None:
    """Make sure fontconfig's cache is built once, before the window manager and the app.

    Without a cache every X client (openbox, each Tk app) rescans all fonts at start-up: about
    3 s each on a small machine, long enough for a first screenshot to show an unmapped app.
    A local sandbox shares the host's /usr (so its fonts) but not /var, so the host's cache is
    valid there and copying it in (~0.5 MB) is nearly free; elsewhere `fc-cache` builds it.
    """
    host_cache = Path("/var/cache/fontconfig")
    if sandbox.backend_name == "local" and await asyncio.to_thread(host_cache.is_dir):
        with contextlib.suppress(SandboxError, OSError):
            await sandbox.upload(host_cache, str(host_cache))
    await sandbox.exec("command -v fc-cache >/dev/null 2>&1 && fc-cache; true", timeout_s=120)


async def _require(sandbox: Sandbox, programs: list[str]) -> None:
    # `command -v` prints the path of each program it finds; anything else is missing
    # (including a sandbox whose shell cannot even run it).
    res = await sandbox.exec(["bash", "-c", 'command -v "$@"; true', "_", *programs], timeout_s=15)
    found = {line.rsplit("/", 1)[-1] for line in res.stdout.split()}
    missing = [p for p in programs if p not in found]
    if missing:
        raise DesktopUnavailableError(
            f"sandbox {sandbox.id} ({sandbox.backend_name}) lacks {', '.join(missing)}: a desktop "
            f"needs Xvfb, xdotool and x11-utils (use the sandgym/desktop image, or on the local "
            f"backend `apt-get install xvfb xdotool x11-utils imagemagick`)"
        )

"""Integration tests of `sandgym.sandboxes.desktop`, the wire actions `sandgym.server.actions` maps onto it
and the desktop tasks, on real X servers.

Runs on the local backend (skipped, with the reason, when bwrap, Xvfb, xdotool or python3-tk is
missing here) and on docker (marked `docker`; skipped when no engine answers or the
`sandgym/desktop:latest` image is missing: build it with `images/bootstrap-base.sh --desktop`).

The probe app below draws a colour block at known coordinates, reacts to a button, an entry,
pointer drags, double clicks and the wheel, and writes what it saw to /app/events.log; the
tests read pixels back out of the screenshots and events out of the log. Every catalog task
named `desktop-*` is then run twice: oracle (reward 1.0) and no-op (reward 0.0).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sandgym.sandboxes import Sandbox, SandboxSpec, get_backend
from sandgym.sandboxes.desktop import (
    Desktop,
    DesktopActionError,
    DesktopUnavailableError,
)
from sandgym.server.actions import apply_desktop_action
from sandgym.tasks.desktop import is_desktop_task, start_task_desktop

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "sandgym" / "tasks" / "catalog"
DESKTOP_TASKS = sorted(p.name for p in CATALOG.glob("desktop-*") if (p / "task.toml").is_file())
DESKTOP_IMAGE = "sandgym/desktop:latest"


# -- what this machine can run ------------------------------------------------------------------
def _local_missing() -> str | None:
    for prog in ("bwrap", "nsenter", "Xvfb", "xdotool", "xdpyinfo", "xwininfo", "import"):
        if shutil.which(prog) is None:
            return f"{prog} is not installed (apt-get install xvfb xdotool x11-utils imagemagick)"
    probe = subprocess.run(["python3", "-c", "import tkinter"], capture_output=True)
    if probe.returncode != 0:
        return "python3-tk is not installed"
    return None


def _docker_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI"
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no engine answers
        return f"no Docker engine answers ({type(exc).__name__})"
    try:
        client.images.get(DESKTOP_IMAGE)
    except Exception:
        return f"{DESKTOP_IMAGE} is missing: build it with images/bootstrap-base.sh --desktop"
    return None


BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    name = request.param
    missing = _local_missing() if name == "local" else _docker_missing()
    if missing:
        pytest.skip(f"{name} desktop: {missing}")
    b = get_backend(name)
    yield b
    await b.reap(only_expired=False)
    await b.aclose()


def _spec(backend: Any, **kw: Any) -> SandboxSpec:
    image = DESKTOP_IMAGE if backend.name == "docker" else None
    return SandboxSpec(image=image, memory_mb=1024, **kw)


# -- a PNG reader (RGB, 8 bits: what Desktop.screenshot produces) -------------------------------
def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@functools.lru_cache(maxsize=8)
def decode_png(data: bytes) -> tuple[int, int, tuple[bytes, ...]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB, non-interlaced PNG.

    None/Sub/Up rows are undone with numpy; Average and Paeth rows, which depend on the byte
    to their left, byte by byte (they are rare in screenshots of flat widgets).
    """
    width, height = png_size(data)
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bit_depth, colour_type, interlace = header[8], header[9], header[12]
    assert (bit_depth, colour_type, interlace) == (8, 2, 0), (bit_depth, colour_type, interlace)
    raw, bpp, stride = zlib.decompress(idat), 3, width * 3
    rows: list[bytes] = []
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        filt = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).copy()
        if filt == 1:
            line = (np.cumsum(line.reshape(width, bpp), axis=0) % 256).astype(np.uint8).ravel()
        elif filt == 2:
            line = line + prev  # uint8 arithmetic wraps modulo 256, as PNG wants
        elif filt in (3, 4):
            out = bytearray(line.tobytes())
            up = prev.tobytes()
            for i in range(stride):
                a = out[i - bpp] if i >= bpp else 0
                b, c = up[i], (up[i - bpp] if i >= bpp else 0)
                if filt == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                out[i] = (out[i] + pred) & 0xFF
            line = np.frombuffer(bytes(out), np.uint8)
        rows.append(line.tobytes())
        prev = line
    return width, height, tuple(rows)


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    _, _, rows = decode_png(png)
    r, g, b = rows[y][3 * x : 3 * x + 3]
    return r, g, b


# -- the probe app ------------------------------------------------------------------------------
PROBE_APP = r"""
import json, tkinter as tk
LOG = "/app/events.log"
def log(**event):
    with open(LOG, "a") as f:
        f.write(json.dumps(event) + "\n")
root = tk.Tk()
root.title("Probe")
root.geometry("400x300+100+100")
block = tk.Canvas(root, bg="#1e90ff", highlightthickness=0)
block.place(x=20, y=20, width=100, height=60)
reaction = tk.Canvas(root, bg="#000000", highlightthickness=0)
reaction.place(x=140, y=20, width=100, height=60)
def pressed():
    reaction.configure(bg="#00c000")
    log(kind="button")
tk.Button(root, text="Go", command=pressed).place(x=260, y=30, width=100, height=40)
entry = tk.Entry(root)
entry.place(x=20, y=100, width=360, height=28)
entry.bind("<Return>", lambda e: log(kind="entry", text=entry.get()))
pad = tk.Canvas(root, bg="#ffffff", highlightthickness=0)
pad.place(x=20, y=150, width=360, height=130)
pad.bind("<ButtonPress-1>", lambda e: log(kind="press", x=e.x, y=e.y))
pad.bind("<ButtonRelease-1>", lambda e: log(kind="release", x=e.x, y=e.y))
pad.bind("<Double-Button-1>", lambda e: log(kind="double", x=e.x, y=e.y))
pad.bind("<Button-4>", lambda e: log(kind="wheel", dy=-1))
pad.bind("<Button-5>", lambda e: log(kind="wheel", dy=1))
root.mainloop()
"""


async def _events(sb: Sandbox) -> list[dict[str, Any]]:
    res = await sb.exec("cat /app/events.log 2>/dev/null")
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


async def _start_probe(sb: Sandbox, desktop: Desktop) -> tuple[int, int]:
    """Launch the probe app; the screen origin of its client area."""
    await sb.write_file("/app/probe.py", PROBE_APP)
    await desktop.exec("setsid python3 /app/probe.py >/tmp/probe.log 2>&1 </dev/null &")
    win = await desktop.wait_for_window("^Probe$")
    x, y, w, h = await desktop.window_geometry(win)
    assert (w, h) == (400, 300)
    await desktop.exec("xdotool sleep 0.3")  # the first frame after mapping
    return x, y


# -- tests: the desktop itself ------------------------------------------------------------------
async def test_pixels_click_type_drag_scroll(backend: Any) -> None:
    sb = await backend.create(_spec(backend))
    try:
        desktop = await Desktop.start(sb, width=800, height=600)
        assert desktop.display == ":99"  # no DISPLAY in the spec: the first free one
        ox, oy = await _start_probe(sb, desktop)

        shot = await desktop.screenshot()
        assert png_size(shot) == (800, 600)
        # The colour block, and the still-black reaction area, at their known coordinates.
        assert pixel(shot, ox + 70, oy + 50) == (0x1E, 0x90, 0xFF)
        assert pixel(shot, ox + 190, oy + 50) == (0, 0, 0)
        half = await desktop.screenshot(scale=0.5)
        assert png_size(half) == (400, 300)

        # A click on the button, through the wire-action helper: the app reacts, and the
        # observation's image already shows it.
        obs = await apply_desktop_action(
            desktop, {"kind": "click", "x": ox + 310, "y": oy + 50, "button": "left"}
        )
        assert obs["exit_code"] == 0 and obs["output"] == ""
        after = base64.b64decode(obs["image"])
        assert pixel(after, ox + 190, oy + 50) == (0, 0xC0, 0)
        assert pixel(after, ox + 70, oy + 50) == (0x1E, 0x90, 0xFF)

        await apply_desktop_action(desktop, {"kind": "click", "x": ox + 200, "y": oy + 114})
        await apply_desktop_action(desktop, {"kind": "type", "text": "Hello, World: 42 (ok)!"})
        await apply_desktop_action(desktop, {"kind": "key", "key": "Return"})
        await apply_desktop_action(
            desktop,
            {"kind": "drag", "x": ox + 40, "y": oy + 170, "to_x": ox + 300, "to_y": oy + 250},
        )
        await apply_desktop_action(desktop, {"kind": "double_click", "x": ox + 100, "y": oy + 200})
        await apply_desktop_action(
            desktop, {"kind": "scroll", "x": ox + 100, "y": oy + 200, "dy": 3}
        )
        await apply_desktop_action(desktop, {"kind": "scroll", "dy": -2})
        await apply_desktop_action(desktop, {"kind": "move", "x": 5, "y": 5})
        events = await _events(sb)
        kinds = [e["kind"] for e in events]
        assert kinds[0] == "button"
        assert {"kind": "entry", "text": "Hello, World: 42 (ok)!"} in events
        presses = [e for e in events if e["kind"] in ("press", "release")]
        assert presses[:2] == [
            {"kind": "press", "x": 20, "y": 20},
            {"kind": "release", "x": 280, "y": 100},
        ]
        assert {"kind": "double", "x": 80, "y": 50} in events
        wheel = [e["dy"] for e in events if e["kind"] == "wheel"]
        assert wheel == [1, 1, 1, -1, -1]

        # The agent's mistakes are data: a reason, a non-zero exit code, the screen as it is.
        for bad, reason in (
            ({"kind": "click", "x": 900, "y": 10}, "inside the 800x600 screen"),
            ({"kind": "key", "key": "ctrl+s; reboot"}, "key chords"),
            ({"kind": "double_click", "x": 10, "y": 10, "button": "thumb"}, "mouse button"),
            ({"kind": "key", "key": "NoSuchKeysym"}, ""),
        ):
            obs = await apply_desktop_action(desktop, bad)
            assert obs["exit_code"] != 0 and reason in obs["output"], (bad, obs["output"])
            assert png_size(base64.b64decode(obs["image"])) == (800, 600)

        # A screenshot action changes nothing and still returns an image.
        obs = await apply_desktop_action(desktop, {"kind": "screenshot", "scale": 0.25})
        assert png_size(base64.b64decode(obs["image"])) == (200, 150)
        assert await desktop.is_running()
        # Starting again on the same sandbox finds the running display.
        again = await Desktop.start(sb, width=800, height=600)
        assert again.display == desktop.display and (again.width, again.height) == (800, 600)
    finally:
        await sb.close()


async def test_display_follows_the_sandbox_env_and_xdotool_failures_are_data(backend: Any) -> None:
    sb = await backend.create(_spec(backend, env={"DISPLAY": ":7"}))
    try:
        desktop = await Desktop.start(sb, width=640, height=480, window_manager=None)
        assert desktop.display == ":7" and desktop.window_manager is None
        # A plain exec (no env) reaches the same display, as the agent's commands will.
        res = await sb.exec("xdpyinfo | grep dimensions")
        assert "640x480" in res.stdout, res
        res = await desktop.xdotool("windowfocus", "0xdeadbeef")
        assert res.exit_code != 0
        await desktop.stop()
        assert not await desktop.is_running()
    finally:
        await sb.close()


async def test_a_sandbox_without_x_is_refused_with_the_missing_programs() -> None:
    sb = await get_backend("null").create(SandboxSpec())
    try:
        with pytest.raises(DesktopUnavailableError, match="Xvfb"):
            await Desktop.start(sb)
    finally:
        await sb.close()


async def test_malformed_actions_are_named_errors() -> None:
    sb = await get_backend("null").create(SandboxSpec())
    try:
        desktop = Desktop(sb, ":99", 800, 600)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"kind": "fly"}, "kind"),
            ({"kind": "click", "x": 1}, "'y'"),
            ({"kind": "click", "x": 1, "y": "2"}, "integer 'y'"),
            ({"kind": "click", "x": 1, "y": 2, "button": [1]}, "'button'"),
            ({"kind": "drag", "x": 1, "y": 2, "to_x": 3}, "'to_y'"),
            ({"kind": "type"}, "string 'text'"),
            ({"kind": "key", "key": 5}, "string 'key'"),
            ({"kind": "screenshot", "scale": 9}, "scale"),
        ]
        for action, message in cases:
            with pytest.raises(DesktopActionError, match=message):
                await apply_desktop_action(desktop, action)
        with pytest.raises(DesktopActionError, match="display"):
            Desktop(sb, "host:0", 10, 10)
        # The Desktop methods themselves refuse what they cannot do, by name.
        with pytest.raises(DesktopActionError, match="inside the 800x600 screen"):
            await desktop.click(800, 2)
        with pytest.raises(DesktopActionError, match="mouse button"):
            await desktop.click(1, 2, "thumb")
        with pytest.raises(DesktopActionError, match="key chords"):
            await desktop.key("ctrl+s; rm -rf /")
    finally:
        await sb.close()


# -- tests: the desktop tasks -------------------------------------------------------------------
def test_the_catalog_has_desktop_tasks() -> None:
    from sandgym.tasks.loaders import load_task_dir

    assert len(DESKTOP_TASKS) >= 5, DESKTOP_TASKS
    for name in DESKTOP_TASKS:
        task = load_task_dir(CATALOG / name)
        assert is_desktop_task(task.metadata), name
        assert str(task.metadata["desktop_start"]).startswith("/"), name
        df = (CATALOG / name / "environment" / "Dockerfile").read_text()
        assert "FROM sandgym/desktop:latest" in df and "ENV DISPLAY=:99" in df, name


async def _episode(backend: Any, name: str, oracle: bool, shot: Path | None = None) -> float:
    from sandgym.tasks.episode_start import prepare_episode
    from sandgym.tasks.loaders import load_task_dir
    from sandgym.tasks.oracle import run_oracle
    from sandgym.tasks.sandbox_spec import sandbox_spec_for
    from sandgym.tasks.verifier.run import run_verifier

    task = load_task_dir(CATALOG / name)
    sb = await backend.create(sandbox_spec_for(task))
    try:
        setup = await prepare_episode(task, sb, seed=0)
        desktop = await start_task_desktop(sb, task.metadata, user=task.agent_user)
        assert desktop is not None
        if oracle:
            res = await run_oracle(task, sb, setup)
            assert res.exit_code == 0, (res.stdout[-1000:], res.stderr[-1000:])
        if shot is not None:
            png = await desktop.screenshot()
            await asyncio.to_thread(shot.write_bytes, png)
        result = await run_verifier(task, sb, setup)
        return result.reward
    finally:
        await sb.close()


async def test_starting_a_task_desktop_twice_starts_its_app_once(backend: Any) -> None:
    from sandgym.tasks.episode_start import prepare_episode
    from sandgym.tasks.loaders import load_task_dir
    from sandgym.tasks.sandbox_spec import sandbox_spec_for

    task = load_task_dir(CATALOG / "desktop-press-button")
    assert await start_task_desktop(await get_backend("null").create(SandboxSpec()), {}) is None
    sb = await backend.create(sandbox_spec_for(task))
    try:
        await prepare_episode(task, sb, seed=0)
        first = await start_task_desktop(sb, task.metadata)
        second = await start_task_desktop(sb, task.metadata)
        assert first is not None and second is not None and first.display == second.display
        res = await second.exec("xdotool search --onlyvisible --name '^Quiz$'")
        assert len(res.stdout.split()) == 1, res
    finally:
        await sb.close()


@pytest.mark.parametrize("name", DESKTOP_TASKS)
async def test_desktop_task_oracle_scores_one_and_noop_zero(backend: Any, name: str) -> None:
    # SANDGYM_DESKTOP_SAMPLE=DIR keeps the oracle's final screen of each task there.
    keep = os.environ.get("SANDGYM_DESKTOP_SAMPLE")
    shot = Path(keep) / f"{name}-{backend.name}.png" if keep else None
    assert await _episode(backend, name, oracle=True, shot=shot) == 1.0
    assert await _episode(backend, name, oracle=False) == 0.0

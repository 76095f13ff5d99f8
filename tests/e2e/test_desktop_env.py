"""`sandgym/Desktop-v0` through a real server on the local backend: check_env, and the pixels.

The screenshot must show the task's window (Tk's grey on the black root window), and a click on
the right button must change what the window shows, then score 1.0.
"""

from __future__ import annotations

import shutil

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import sandgym.client  # noqa: F401  (registers the envs)
from sandgym.client.desktop_env import RemoteDesktopEnv, to_wire_action

TASK = "builtin/desktop-press-button"
TK_GREY = np.array([217, 217, 217])

pytestmark = pytest.mark.skipif(
    not (shutil.which("Xvfb") and shutil.which("xdotool")),
    reason="Xvfb/xdotool not installed (scripts/setup.sh installs them)",
)


def _window_box(img: np.ndarray) -> tuple[int, int, int, int]:
    """Bounding box (x0, y0, x1, y1) of Tk's grey window background in a screenshot."""
    mask = np.all(np.abs(img.astype(int) - TK_GREY) <= 3, axis=-1)
    ys, xs = np.nonzero(mask)
    assert len(xs) > 10_000, "no Tk window visible in the screenshot"
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


def test_to_wire_action_maps_sampled_and_passes_protocol_actions() -> None:
    assert to_wire_action({"kind": 0, "x": 3, "y": 4}) == {"kind": "click", "x": 3, "y": 4}
    assert to_wire_action({"kind": 3, "x": 3, "y": 4}) == {"kind": "screenshot"}
    assert to_wire_action({"kind": "type", "text": "a"}) == {"kind": "type", "text": "a"}
    assert to_wire_action("ls") == "ls"
    with pytest.raises(ValueError, match="expected kind"):
        to_wire_action({"kind": 9, "x": 0, "y": 0})


def test_desktop_env_pixels_click_and_reward(make_server) -> None:
    srv = make_server(backend="local")
    env = gym.make("sandgym/Desktop-v0", server_url=srv.url, task_id=TASK)
    try:
        obs, _ = env.reset(seed=0)
        img = obs["image"]
        assert img.shape == (768, 1024, 3) and img.dtype == np.uint8
        x0, y0, x1, y1 = _window_box(img)
        # The Quiz window is 520x220 at +60+50 (client area), the rest of the screen is black.
        assert 500 <= x1 - x0 <= 540 and 200 <= y1 - y0 <= 240, (x0, y0, x1, y1)
        assert img[700, 900].tolist() == [0, 0, 0]
        status_before = img[y0 + 160 : y0 + 190, x0 + 20 : x0 + 500]
        assert not np.any(status_before.sum(axis=-1) < 200), "status line should start empty"
        # Button "42" is the fourth: client x = 20 + 80*3 .. +70, y = 100 .. 140.
        obs, reward, terminated, truncated, _ = env.step(
            {"kind": 0, "x": x0 + 20 + 80 * 3 + 35, "y": y0 + 120}
        )
        assert reward == 0.0 and not terminated and not truncated
        status_after = obs["image"][y0 + 160 : y0 + 190, x0 + 20 : x0 + 500]
        assert np.any(status_after.sum(axis=-1) < 200), "clicking should print the status text"
        obs, reward, terminated, _, _ = env.step({"kind": "submit"})
        assert terminated and reward == 1.0
    finally:
        env.close()


def test_desktop_env_passes_check_env(make_server) -> None:
    srv = make_server(backend="local")
    env = RemoteDesktopEnv(srv.url, TASK)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()

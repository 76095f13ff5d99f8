"""`RemoteDesktopEnv`: the Gymnasium env for desktop tasks, registered as `sandgym/Desktop-v0`.

    >>> import gymnasium, sandgym.client  # doctest: +SKIP
    >>> env = gymnasium.make("sandgym/Desktop-v0", server_url="ws://127.0.0.1:8765/v1/env",
    ...                      task_id="builtin/desktop-press-button")  # doctest: +SKIP
    >>> obs, info = env.reset(seed=0)  # doctest: +SKIP
    >>> obs["image"].shape  # doctest: +SKIP
    (768, 1024, 3)
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     {"kind": "click", "x": 355, "y": 190})  # doctest: +SKIP

Spaces:
- observation: `Dict(image=Box(0, 255, (height, width, 3), uint8), output=Text,
  exit_code=Discrete(257, start=-1))`: the latest screenshot as an RGB array (the server's PNG,
  decoded, resized to the space's size if the task's screen differs), the action's text output,
  and its exit code (-1 when there is none). An action that returns no screenshot (a shell
  `command`) keeps the previous image.
- action: `Dict(kind=Discrete(4), x=Discrete(width), y=Discrete(height))`, where kind indexes
  `POINTER_KINDS` (`click`, `double_click`, `move`, `screenshot`): so `sample()` is a random
  pointer action. Any contract-2 ACTION dict (`{"kind": "type", "text": "hi"}`,
  `{"kind": "key", "key": "ctrl+s"}`, `{"kind": "submit"}`, ...) and a command string are
  accepted too.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from gymnasium import spaces

from sandgym.client.gym_env import SAMPLE_CHARSET, AnyText, RemoteEnv

#: What the integer `kind` of a sampled action means: the desktop actions that need no more
#: than a point (a subset of the protocol's `DESKTOP_ACTION_KINDS`; a unit test checks it).
POINTER_KINDS = ("click", "double_click", "move", "screenshot")


def decode_png(data_b64: str, width: int, height: int) -> np.ndarray:
    """A base64 PNG as an (height, width, 3) uint8 RGB array, resized when its size differs."""
    from PIL import Image  # lazy: only desktop users pay for Pillow

    img = Image.open(io.BytesIO(base64.b64decode(data_b64))).convert("RGB")
    if img.size != (width, height):
        img = img.resize((width, height))
    return np.asarray(img, dtype=np.uint8)


class RemoteDesktopEnv(RemoteEnv):
    """A desktop episode on a sandgym server, with screenshots as image observations."""

    metadata = {"render_modes": ["rgb_array", "ansi"]}

    def __init__(
        self,
        server_url: str,
        task_id: str,
        width: int = 1024,
        height: int = 768,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(server_url, task_id, render_mode=render_mode, **kwargs)
        self.width, self.height = width, height
        self.action_space = spaces.Dict(  # type: ignore[assignment]
            {
                "kind": spaces.Discrete(len(POINTER_KINDS)),
                "x": spaces.Discrete(width),
                "y": spaces.Discrete(height),
            }
        )
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (height, width, 3), dtype=np.uint8),
                "output": AnyText(
                    max_length=self.max_output_chars, min_length=0, charset=SAMPLE_CHARSET
                ),
                "exit_code": spaces.Discrete(257, start=-1),
            }
        )
        self._image = np.zeros((height, width, 3), dtype=np.uint8)

    def _convert(self, obs: dict[str, Any]) -> dict[str, Any]:
        base = super()._convert(obs)
        if base["image"]:
            self._image = decode_png(base["image"], self.width, self.height)
        # A copy: observations must not share memory with later ones (callers keep them).
        return {
            "image": self._image.copy(),
            "output": base["output"],
            "exit_code": base["exit_code"],
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        self._image = np.zeros((self.height, self.width, 3), dtype=np.uint8)
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return super().step(to_wire_action(action))

    def render(self) -> Any:
        if self.render_mode == "rgb_array":
            return self._image
        return super().render()


def to_wire_action(action: Any) -> Any:
    """Map a sampled `{kind: int, x, y}` onto a contract-2 action; pass anything else through."""
    if isinstance(action, dict) and not isinstance(action.get("kind"), str):
        try:
            kind = POINTER_KINDS[int(action["kind"])]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ValueError(
                f"expected kind in 0..{len(POINTER_KINDS) - 1} or a contract-2 action kind, "
                f"got {action.get('kind')!r}"
            ) from None
        if kind == "screenshot":
            return {"kind": "screenshot"}
        return {"kind": kind, "x": int(action["x"]), "y": int(action["y"])}
    return action

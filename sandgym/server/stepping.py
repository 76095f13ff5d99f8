"""One step of an episode: the episode's time limit checked first, then a `submit` handed to the
scorer (sandgym/server/scoring.py) or an action run on the sandbox or the desktop
(sandgym/server/actions.py) within its timeout; the step counted, and the episode truncated at
`max_steps` or at its time limit."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandgym.sandboxes import SandboxBackend
from sandgym.server.actions import apply_action, apply_desktop
from sandgym.server.episode_table import Session
from sandgym.server.metrics import ServerMetrics
from sandgym.server.scoring import Scorer
from sandgym.server.settings import ServerSettings
from sandgym.wire.protocol import (
    DESKTOP_ACTION_KINDS,
    CommandAction,
    Observation,
    StepInfo,
    StepMsg,
    StepResultReply,
    SubmitAction,
)

#: how an episode is ended: the session and the reason (`EnvService._end`)
EndEpisode = Callable[[Session, str], Awaitable[None]]


class Stepper:
    """Plays the steps of the server's episodes."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics, scorer: Scorer) -> None:
        self.settings = settings
        self.metrics = metrics
        self.scorer = scorer

    async def step(
        self, s: Session, msg: StepMsg, backend: SandboxBackend | None, end: EndEpisode
    ) -> StepResultReply:
        """Play `msg.action` in episode `s`; `end(s, reason)` when that ends the episode."""
        settings = self.settings
        action = msg.action
        elapsed = time.monotonic() - s.started
        remaining = settings.episode_time_limit_s - elapsed
        if remaining <= 0:
            await end(s, "time_limit")
            return StepResultReply(
                request_id=msg.request_id,
                observation=Observation(output="[sandgym: episode time limit reached]\n"),
                truncated=True,
                info=StepInfo(step=s.steps, elapsed_s=elapsed, truncation="time_limit").wire(),
            )
        if isinstance(action, SubmitAction):
            return await self.scorer.submit(s, msg, backend, end)
        t0 = time.perf_counter()
        timeout_s = settings.default_action_timeout_s
        if isinstance(action, CommandAction) and action.timeout_s is not None:
            timeout_s = action.timeout_s
        # Never let one action outlive the episode's own time limit by much.
        timeout_s = max(0.001, min(timeout_s, settings.max_action_timeout_s, remaining))
        info: dict[str, Any]
        if action.kind in DESKTOP_ACTION_KINDS:
            obs, info = await apply_desktop(s.desktop, action), {}
        else:
            obs, info = await apply_action(
                s.sandbox, action, timeout_s=timeout_s, max_output_bytes=settings.max_output_bytes
            )
        action_s = time.perf_counter() - t0
        self.metrics.latency_by_kind[action.kind].observe(action_s)
        self.metrics.steps.inc()
        s.steps += 1
        s.commands += isinstance(action, CommandAction)
        s.last_observation = obs
        info["step"] = s.steps
        info["action_s"] = action_s
        truncated = False
        if s.steps >= settings.max_steps:
            truncated, info["truncation"] = True, "max_steps"
        elif time.monotonic() - s.started >= settings.episode_time_limit_s:
            truncated, info["truncation"] = True, "time_limit"
        if truncated:
            await end(s, str(info["truncation"]))
            if s.cost is not None:
                info["cost"] = s.cost
        return StepResultReply(
            request_id=msg.request_id,
            observation=obs,
            truncated=truncated,
            info=StepInfo(**info).wire(),
        )

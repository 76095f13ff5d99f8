"""Scoring a `submit`: the task's verifier on the episode (`sandgym.tasks.episode.score_step`), its time
and tamper report counted in the metrics, and the step reply. The reward is the verifier's and
nothing else's: the last step (or a failed gate) ends the episode with the task's reward and
`terminated`; while steps remain the reply carries the next step's instruction (protocol 1.1).
A verifier that fails ends the episode too (it cannot go on) and its error goes to the client."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sandgym.sandboxes import SandboxBackend
from sandgym.server.episode_table import Session
from sandgym.server.metrics import ServerMetrics
from sandgym.server.settings import ServerSettings
from sandgym.tasks.episode import score_step
from sandgym.wire.protocol import Observation, StepInfo, StepMsg, StepResultReply, TaskStepInfo

if TYPE_CHECKING:
    from sandgym.tasks.episode_models import VerifierResult

#: the most of the verifier's output an `info.verifier_output` carries (its tail)
VERIFIER_OUTPUT_CHARS = 16_000


class Scorer:
    """Runs the verifier of a `submit` and builds its reply."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics) -> None:
        self.settings = settings
        self.metrics = metrics

    async def submit(
        self,
        s: Session,
        msg: StepMsg,
        backend: SandboxBackend | None,
        end: Callable[[Session, str], Awaitable[None]],
    ) -> StepResultReply:
        """Score the current step of `s`; `end(s, "submit")` once the episode is over."""

        t0 = time.perf_counter()
        done = True
        try:
            result, outcome = await score_step(
                s.task,
                s.sandbox,
                s.setup,
                stop_agent_processes=self.settings.verifier_stop_agent_processes,
                backend=backend,  # a separate verifier's sandbox comes from it
                image_map=self.settings.image_map,
            )
            done = outcome.done
        finally:
            verifier_s = time.perf_counter() - t0
            s.verifier_s += verifier_s
            if done:  # (also when scoring failed: the episode cannot go on)
                await end(s, "submit")
        self.metrics.latency_by_kind["submit"].observe(verifier_s)
        self.metrics.steps.inc()
        info: dict[str, Any] = {
            "step": s.steps + 1,
            "elapsed_s": time.monotonic() - s.started,
            "verifier_s": verifier_s,
            "verifier_duration_s": result.duration_s,
            "verifier_output": tail(result.output or ""),
            "from_pool": s.sandbox.from_pool,
            **self._tamper_info(result),
        }
        if result.reason is not None:  # e.g. test_timeout: why the reward is not the tests'
            info["verifier_reason"] = result.reason
        if outcome.step is not None:
            # A multi-step task (protocol 1.1): info.step is the step just scored (name,
            # index, count, reward, rewards so far); the action count moves to `actions`.
            info["actions"] = info["step"]
            info["step"] = TaskStepInfo(**outcome.step).model_dump(exclude_none=True)
        if not done:  # the next step's instruction; the episode goes on
            s.steps += 1
            obs = Observation(output=outcome.instruction or "")
            s.last_observation = obs
            return StepResultReply(
                request_id=msg.request_id,
                observation=obs,
                reward=0.0,
                info=StepInfo(**info).wire(),
            )
        if s.cost is not None:
            info["cost"] = s.cost
        return StepResultReply(
            request_id=msg.request_id,
            observation=Observation(output=f"[sandgym: submitted; reward {outcome.reward:g}]\n"),
            reward=float(outcome.reward),
            terminated=True,
            info=StepInfo(**info).wire(),
        )

    def _tamper_info(self, result: VerifierResult) -> dict[str, Any]:
        """info.tamper and info.verify of a scored submit, counted in the metrics."""
        if result.tamper is None:
            return {}
        self.metrics.episode_verified(result.verify, result.tamper)
        return {"tamper": result.tamper.model_dump(), "verify": result.verify}


def tail(text: str, limit: int = VERIFIER_OUTPUT_CHARS) -> str:
    """The last `limit` characters of `text`, marked as cut when they are not all of it."""
    return text if len(text) <= limit else "...\n" + text[-limit:]

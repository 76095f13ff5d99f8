"""The trainer's episode runner, on the one episode loop every runner shares
(`sandgym.client.episode_loop.play_episode`: reset, the agent's actions, submit to the end, the
ending classified by the error-code table of sandgym.wire.codes); this module adds the trainer's
records on top: model turns and tokens (`EpisodeSession`, a `LoopSession`), step rewards, the
cost ledger, the in-flight book, the failure reasons of sandgym/trainer/failures.py.

Every agent plays its episodes through `run_episode`: the terminal agent and the no-op and oracle
agents (`sandgym.trainer.rollout.EpisodeRunner`), the harness agents (`sandgym.trainer.harness.runner`), and the
multi-role workflows, which play their solver through `EpisodeRunner` (`sandgym.trainer.roles`). An agent
is a `play(session)` coroutine: it takes actions with `session.step` until it is done or the
environment ends the episode, and returns how it stopped (`"submitted"` when it asked to submit,
`"turn_limit"` when it ran out of turns). Then:

- an episode the environment did not end is submitted until it ends: once, or once per step left
  of a multi-step task (each step is scored as the agent left it);
- the last reply's reward is the trajectory's; the termination is the agent's answer when the
  episode terminated, `env_truncated` when the server's step or time limit cut it;
- `finish(episode)`, when given, runs after the env client closed (a harness turns its recorded
  model calls into steps there), still inside the failure handling;
- any exception ends the episode with `sandgym.trainer.failures.classify_failure`'s reason, every
  trajectory scored 0, and the error recorded; it is never raised (one bad episode must not stop
  a run). Whether the trainer masks it (`Episode.is_infra_failure`), drops its group
  (`Episode.drops_group`) or scores it 0 is sandgym/trainer/failures.py's table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

from sandgym.client.episode_loop import LoopSession, as_dict, play_episode
from sandgym.trainer.episode import Episode, Step, Trajectory
from sandgym.trainer.failures import classify_failure

log = logging.getLogger(__name__)

#: how an agent's `play` stopped without the environment ending the episode
Ending = Literal["submitted", "turn_limit"]


class EpisodeSession(LoopSession):
    """One episode as an agent's `play` drives it: the env client, and the records kept."""

    def __init__(
        self,
        client: Any,
        episode: Episode,
        trajectory: Trajectory,
        observation: dict[str, Any],
        info: dict[str, Any],
    ) -> None:
        super().__init__(client, observation, info)
        self.episode = episode
        self.trajectory = trajectory
        #: where the episode in flight is kept for a trainer restart (sandgym/trainer/inflight.py)
        self.book: Any = None
        self.book_key: str | None = None

    async def step(  # type: ignore[override]
        self, action: dict[str, Any], turn: Step | None = None, *, record: bool = True
    ) -> Any:
        """Apply `action`. Its answer is written into `turn` (a model turn the agent recorded),
        or recorded as a step of its own without tokens; `record=False` keeps no step (set-up
        actions whose trajectory comes from elsewhere)."""
        t = time.monotonic()
        res = await super().step(action)
        env_s = time.monotonic() - t
        _record_step_rewards(self.episode, res)
        if turn is not None:
            turn.env_s = env_s
            turn.observation = as_dict(res.observation)
            turn.reward, turn.done = float(res.reward), bool(res.terminated or res.truncated)
        elif record:
            self.trajectory.steps.append(_env_step(action, res, env_s))
        if not self.ended and self.book is not None:
            await self.book.stepped(self.book_key, self.episode, self.client)
        return res


Play = Callable[[EpisodeSession], Awaitable[Ending]]


async def run_episode(
    open_client: Callable[[], AbstractAsyncContextManager[Any]],
    episode: Episode,
    play: Play,
    *,
    reset_options: dict[str, Any] | None = None,
    reset_retries: int = 0,
    finish: Callable[[Episode], Awaitable[None]] | None = None,
    max_error_chars: int = 500,
    book: Any = None,
) -> Episode:
    """Play `episode` (its task and seed) with `play` on a client from `open_client()`; see the
    module docstring. `reset_retries` retries a reset refused as retryable (`capacity`, a lost
    connection) with backoff. Returns the episode, filled in; never raises."""
    if not episode.trajectories:
        episode.trajectories.append(Trajectory(role="agent"))
    traj = episode.trajectories[0]
    t0 = time.monotonic()
    kept: list[str | None] = []  # the episode's key in `book`, once it has one

    def session_for(client: Any, obs: dict[str, Any], info: dict[str, Any]) -> EpisodeSession:
        episode.instruction = str(obs.get("output") or "")
        return EpisodeSession(client, episode, traj, obs, info)

    async def start(session: Any) -> None:
        if book is not None:  # kept in the run dir until it ends (sandgym/trainer/inflight.py)
            session.book, session.book_key = book, await book.opened(episode, session.client)
            kept.append(session.book_key)

    try:
        async with open_client() as client:
            if not episode.server_url:
                episode.server_url = str(getattr(client, "url", "") or "")
            if book is not None:  # before the reset: an orphan is found (trainer/inflight.py)
                kept.append(await book.intent(episode, episode.server_url))
            end = await play_episode(
                client,
                episode.task_id,
                play,
                seed=episode.seed,
                options=reset_options,
                reset_retries=reset_retries,
                session_factory=session_for,
                on_start=start,
            )
            if end.error is not None:  # the environment's failure: classified below
                raise end.error
            res = end.result
            assert res is not None
            # one of the agent's own steps ended it: it submitted, whatever `play` answered
            ending = "submitted" if end.ended_in_play else end.ending
            traj.reward = float(res.reward)
            episode.tamper = (getattr(res, "info", None) or {}).get("tamper")
            episode.termination = ending if res.terminated else "env_truncated"  # type: ignore[assignment]
        if finish is not None:
            await finish(episode)
    except Exception as exc:  # recorded, never raised: one bad episode must not stop a run
        episode.termination = classify_failure(exc)
        episode.error = f"{type(exc).__name__}: {exc}"[:max_error_chars]
        # every trajectory: a multi-role workflow must not keep a partial score either
        for t in episode.trajectories:
            t.reward = 0.0
        log.warning(
            "episode %s seed %s ended by %s (%s): %s",
            episode.task_id,
            episode.seed,
            episode.termination,
            "masked"
            if episode.is_infra_failure
            else "its group dropped"
            if episode.drops_group
            else "scored 0",
            exc,
        )
    episode.metrics.update(
        {
            "duration_s": time.monotonic() - t0,
            "turns": float(sum(1 for s in traj.steps if s.response_ids)),
            "generated_tokens": float(traj.num_generated_tokens),
            "generate_s": sum(s.generate_s for s in traj.steps),
            "env_s": sum(s.env_s for s in traj.steps),
        }
    )
    if book is not None and kept:  # ended (scored or failed): kept until the trainer records it
        await book.ended(kept[0], episode)
    return episode


def _record_step_rewards(episode: Episode, res: Any) -> None:
    info = getattr(res, "info", None) or {}
    step = info.get("step")
    if isinstance(step, dict) and isinstance(step.get("rewards"), list):
        episode.step_rewards = [float(r) for r in step["rewards"]]
    if isinstance(info.get("cost"), dict):  # the reply that ended it: the server's cost ledger
        episode.cost.update(info["cost"])


def _env_step(action: dict[str, Any], res: Any, env_s: float) -> Step:
    """A step the agent took without the model (a scripted action, an automatic submit): no
    tokens, no loss."""
    return Step(
        prompt_ids=[],
        response_ids=[],
        response_logprobs=[],
        loss_mask=[],
        action=action,
        observation=as_dict(res.observation),
        reward=float(res.reward),
        done=bool(res.terminated or res.truncated),
        env_s=env_s,
    )

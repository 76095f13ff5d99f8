"""Episodes and their lifecycle: `EnvService`, the facade the websocket loop dispatches to.

`EnvService` owns the backend, the pool, the tasks and the episode table, and answers the four
requests: `reset`, `step`, `close` and `resume` each return a reply model or raise, and
`sandgym.server.errors.to_wire_error` picks the code. Its parts, one job each:

- sandgym/server/startup.py: the task registry, the backend's check, the orphan reap, the pool;
- sandgym/server/specs.py: each task's `SandboxSpec`, built once;
- sandgym/server/episode_table.py: `Session`, the episodes by id, capacity, detach, resume, sweep;
- sandgym/server/preparing.py: a reset's sandbox acquired and set up;
- sandgym/server/groups.py: episode groups (`reset.options.group`), one preparation for N members;
- sandgym/server/stepping.py: one step (time limit, action, truncation), sandgym/server/actions.py the
  action itself, sandgym/server/scoring.py a `submit` scored by the task's verifier;
- sandgym/server/resend.py: a resent step answered from its cache;
- sandgym/server/release.py: an ended episode's sandbox handed back, its cost recorded.

Lifecycle rules:
- A reset on a connection that already has an episode ends the old one first.
- `submit` ends the episode with the verifier's reward (`terminated`); hitting `max_steps` or the
  episode's wall-time limit ends it with `truncated`. Ending releases the sandbox to the pool,
  which destroys it (no reuse).
- A dropped connection detaches its episode; `resume` with the session's token re-attaches it
  within `resume_grace_s`, after which a sweep destroys it. The sweep also ends episodes idle
  for `idle_timeout_s`.
- A step whose request_id equals the last one handled returns the cached reply (or waits for the
  in-flight one) instead of running again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from typing import TYPE_CHECKING

from sandgym.sandboxes import SandboxBackend, SandboxSpec, get_backend
from sandgym.sandboxes.pool import SandboxPool
from sandgym.server.actions import apply_desktop
from sandgym.server.cost import CostMetrics
from sandgym.server.episode_table import EpisodeConnection, Session, SessionTable
from sandgym.server.errors import NoEpisodeError
from sandgym.server.groups import GroupRegistry
from sandgym.server.metrics import ServerMetrics
from sandgym.server.preparing import Preparer
from sandgym.server.release import release_episode
from sandgym.server.resend import cached_reply, run_once
from sandgym.server.scoring import Scorer
from sandgym.server.settings import ServerSettings
from sandgym.server.specs import SpecCache
from sandgym.server.startup import ensure_usable, load_tasks, make_pool, reap_orphans
from sandgym.server.stepping import Stepper
from sandgym.wire.protocol import (
    ClosedReply,
    CloseMsg,
    Observation,
    ObservationReply,
    ResetMsg,
    ResumeInfo,
    ResumeMsg,
    ScreenshotAction,
    SessionEntry,
    StepMsg,
    StepResultReply,
)

if TYPE_CHECKING:
    from sandgym.tasks import TaskRegistry
    from sandgym.tasks.models import TaskSpec

__all__ = ["EnvService", "EpisodeConnection", "Session"]

log = logging.getLogger(__name__)


class EnvService:
    """The server's state: backend, pool, task registry, sessions, metrics."""

    def __init__(self, settings: ServerSettings, backend: SandboxBackend | None = None) -> None:
        self.settings = settings
        self._own_backend = backend is None
        self.backend: SandboxBackend | None = backend
        self.pool: SandboxPool | None = None
        self.tasks: TaskRegistry | None = None
        self.groups: GroupRegistry | None = None  # made with the pool, in start()
        self.metrics = ServerMetrics()
        self.cost_metrics = CostMetrics(self.metrics.registry)
        self.table = SessionTable(settings, self.metrics.episode_ended)
        self.specs = SpecCache(settings)
        self.preparer = Preparer(settings, self.metrics, self.specs)
        self.stepper = Stepper(settings, self.metrics, Scorer(settings, self.metrics))
        self.connections = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()
        self.metrics.sessions_active.set_function(lambda: len(self.sessions))
        self.metrics.sessions_detached.set_function(
            lambda: sum(1 for s in self.sessions.values() if s.conn is None)
        )
        self.metrics.connections.set_function(lambda: self.connections)

    @property
    def sessions(self) -> dict[str, Session]:
        """The live episodes by id."""
        return self.table.live

    @property
    def resetting(self) -> int:
        """Resets past the capacity check whose session does not exist yet (they hold a slot)."""
        return self.table.reserved

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.tasks = await load_tasks(s)
        if self.backend is None:
            self.backend = get_backend(s.backend, **s.backend_options)
        await ensure_usable(self.backend)
        if s.reap_on_start:
            await reap_orphans(self.backend)
        self.pool = make_pool(s, self.backend)
        await self.pool.start()
        self.groups = GroupRegistry(self.backend, self.pool, ttl_s=s.group_ttl_s)
        self.metrics.watch_pool(self.pool.snapshot)
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="sandgym-session-sweep")
        log.info(
            "env server ready: backend=%s tasks=%d max_sessions=%d",
            self.backend.name,
            len(self.task_ids()),
            s.max_sessions,
        )

    async def stop(self) -> None:
        """End every episode, close the pool and the backend; survives cancellation."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        sessions = list(self.sessions.values())
        await asyncio.gather(*(self._end(s, "shutdown") for s in sessions), return_exceptions=True)
        if self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)
        if self.groups is not None:
            await asyncio.shield(self.groups.close())
        if self.pool is not None:
            await asyncio.shield(self.pool.close())
        if self.backend is not None and self._own_backend:
            await self.backend.aclose()

    def task_ids(self) -> list[str]:
        return list(self.tasks.ids()) if self.tasks is not None else []

    def spec_for(self, task: TaskSpec) -> SandboxSpec:
        """The task's `SandboxSpec`, built once per task object (sandgym/server/specs.py)."""
        return self.specs.spec_for(task, self.backend)

    # -- the four requests ---------------------------------------------------------------------
    async def reset(self, conn: EpisodeConnection, msg: ResetMsg) -> ObservationReply:
        verify = msg.options.verify or self.settings.verify
        if conn.session is not None:
            await self._end(conn.session, "reset")
        assert self.pool is not None and self.tasks is not None and self.groups is not None
        task = self.tasks.get(msg.task_id)
        self.table.check_capacity()
        group, member = None, 0
        if msg.options.group is not None:
            group, member = self.groups.join(msg.options.group, msg.task_id, msg.seed)
        with self.table.reserve():
            try:
                ready = await self.preparer.prepare(
                    task,
                    msg,
                    verify,
                    pool=self.pool,
                    groups=self.groups,
                    backend=self.backend,
                    group=group,
                    member=member,
                )
            except BaseException as exc:
                if group is not None:
                    self.groups.abandon(group, member, exc)
                raise
        sandbox, setup, bridge = ready.sandbox, ready.setup, ready.bridge
        desktop = setup.desktop  # brought up by prepare_episode for a desktop task
        session = Session(
            id="ses-" + uuid.uuid4().hex[:16],
            resume_token=secrets.token_urlsafe(24),
            task_id=msg.task_id,
            task=task,
            sandbox=sandbox,
            setup=setup,
            seed=msg.seed,
            desktop=desktop,
            bridge=bridge,
            group=group,
            leased_at=time.time() - ready.prepare_s,
            prepare_s=ready.prepare_s,
        )
        self.table.add(session, conn)
        if not conn.open:  # the socket dropped while the sandbox was being prepared
            self.detach(conn)
        obs = Observation(output=setup.instruction or task.instruction)
        if desktop is not None:  # a desktop agent's first look at the screen
            obs = await apply_desktop(desktop, ScreenshotAction())
            obs.output = setup.instruction
        session.last_observation = obs
        return ObservationReply(
            request_id=msg.request_id,
            session_id=session.id,
            resume_token=session.resume_token,
            observation=obs,
            info=ready.info(
                msg, self.settings, self.backend.name if self.backend else None, group, member
            ).wire(),
        )

    async def step(self, conn: EpisodeConnection, msg: StepMsg) -> StepResultReply:
        s = conn.session
        cached = cached_reply(s, msg.request_id)
        if cached is not None:
            return cached  # a resend after a lost reply: never run the action twice
        if s is None or s.done:
            raise NoEpisodeError("no episode on this connection: send `reset` (or `resume`) first")
        return await run_once(
            s, msg.request_id, lambda: self.stepper.step(s, msg, self.backend, self._end)
        )

    async def close(self, conn: EpisodeConnection, msg: CloseMsg) -> ClosedReply:
        s = conn.session
        if s is None:
            return ClosedReply(request_id=msg.request_id, session_id=None)
        await self._end(s, "closed")
        return ClosedReply(request_id=msg.request_id, session_id=s.id)

    async def resume(self, conn: EpisodeConnection, msg: ResumeMsg) -> ObservationReply:
        s = self.table.resumable(msg.session_id, msg.resume_token)
        if conn.session is not None and conn.session is not s:
            await self._end(conn.session, "reset")
        if s.done:
            # It ended (submit, truncation) while the client was away: attach it read-only so
            # a resend of the final step gets its cached reply.
            conn.session = s
            info = ResumeInfo(resumed=True, ended=True, step=s.steps, last_request_id=s.last_id)
        else:
            self.table.attach(s, conn)
            if not conn.open:
                self.detach(conn)
            info = ResumeInfo(
                resumed=True,
                task_id=s.task_id,
                step=s.steps,
                last_request_id=s.last_id,
                elapsed_s=time.monotonic() - s.started,
            )
        return ObservationReply(
            request_id=msg.request_id,
            session_id=s.id,
            resume_token=s.resume_token,
            observation=s.last_observation,
            info=info.wire(),
        )

    # -- detaching, ending, sweeping -------------------------------------------------------------
    def detach(self, conn: EpisodeConnection) -> None:
        """The connection dropped: keep its episode for `resume_grace_s`."""
        s = self.table.detach(conn)
        if s is not None:  # no grace: it ends now
            self._end_bg(s, "disconnected")

    def _end_bg(self, s: Session, reason: str) -> None:
        """End now (no resume or step can reach it from here on); release in the background."""
        if not self.table.finish(s, reason):
            return
        task = asyncio.create_task(self._release(s))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end(self, s: Session, reason: str) -> None:
        """End an episode and hand its sandbox back to the pool (which destroys it)."""
        if self.table.finish(s, reason):
            await self._release(s)

    async def _release(self, s: Session) -> None:
        await release_episode(
            s,
            pool=self.pool,
            groups=self.groups,
            backend=self.backend.name if self.backend else None,
            cost_metrics=self.cost_metrics if self.settings.cost_ledger else None,
        )

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                self.sweep()
            except Exception:  # the sweeper must outlive any one bad session
                log.exception("session sweep failed")

    def sweep(self, now: float | None = None) -> list[str]:
        """End abandoned (grace over) and idle episodes; return their ids. Groups past their
        ttl with no live member are removed."""
        now = time.monotonic() if now is None else now
        if self.groups is not None:
            self.groups.expire(now)
        due = self.table.due(now)
        for s, reason in due:
            self._end_bg(s, reason)
        return [s.id for s, _ in due]

    def sessions_view(self) -> list[SessionEntry]:
        """The live episodes as `GET /v1/sessions` lists them."""
        return self.table.view()

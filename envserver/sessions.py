"""Episodes and their lifecycle: `EnvService` owns the backend, the pool, the tasks and sessions.

One `Session` is one episode: a task, a leased sandbox, the step count and clocks, and the
websocket `Connection` it is attached to (None while it waits for a `resume`). The service
methods `reset`, `step`, `close` and `resume` are what the websocket loop dispatches to; each
returns a reply model or raises, and `envserver.errors.to_wire_error` picks the code.

Lifecycle rules:
- A reset on a connection that already has an episode ends the old one first.
- `submit` ends the episode with the verifier's reward (`terminated`); hitting `max_steps` or the
  episode's wall-time limit ends it with `truncated`. Ending releases the sandbox to the pool,
  which destroys it (no reuse).
- A dropped connection detaches its episode; `resume` with the session's token re-attaches it
  within `resume_grace_s`, after which a sweep destroys it. The sweep also ends episodes idle
  for `idle_timeout_s`.
- A step whose request_id equals the last one handled returns the cached reply (or waits for the
  in-flight one) instead of running again, so a client may safely resend a step whose reply
  was lost with its connection.

Why over 500 lines: the lifecycle above is one state machine over `Session`s (reset, step,
resume, sweep, close); its parts with their own concerns already live apart
(envserver/groups.py, envserver/actions.py, tasks/episode.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envserver.actions import apply_action, apply_desktop
from envserver.cost import CostMetrics, episode_cost
from envserver.errors import BusyError, CapacityError, NoEpisodeError
from envserver.groups import Group, GroupRegistry, Prepared
from envserver.metrics import ServerMetrics
from envserver.protocol import (
    DESKTOP_ACTION_KINDS,
    ClosedReply,
    CloseMsg,
    CommandAction,
    EpisodeCost,
    Observation,
    ObservationReply,
    ResetInfo,
    ResetMsg,
    ResumeInfo,
    ResumeMsg,
    ScreenshotAction,
    StepInfo,
    StepMsg,
    StepResultReply,
    SubmitAction,
    TaskStepInfo,
)
from envserver.settings import ServerSettings
from sandboxes import Sandbox, SandboxBackend, get_backend
from sandboxes.errors import SnapshotUnsupportedError
from sandboxes.lifetime import LifetimeSettings
from sandboxes.pool import PoolSettings, SandboxPool

if TYPE_CHECKING:
    from envserver.app import Connection

log = logging.getLogger(__name__)

#: Ways an episode ends with a final step reply worth keeping for a client that lost it.
_FINAL_REPLY_REASONS = frozenset({"submit", "max_steps", "time_limit"})


@dataclass(eq=False)
class Session:
    """One episode, attached to at most one connection."""

    id: str
    resume_token: str
    task_id: str
    task: Any
    sandbox: Sandbox
    setup: Any
    seed: int | None
    desktop: Any = None  # sandboxes.desktop.Desktop of a desktop task, else None
    bridge: Any = None  # envserver.gateway_bridge.GatewayBridge when reset asked for one
    group: Any = None  # envserver.groups.Group when reset named one (until released)
    started: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    steps: int = 0
    conn: Connection | None = None
    detached_at: float | None = None
    done: bool = False
    last_observation: Observation = field(default_factory=Observation)
    # Idempotent resend: the request being handled and the last reply sent.
    inflight_id: str | None = None
    inflight: asyncio.Future[StepResultReply] | None = None
    last_id: str | None = None
    last_reply: StepResultReply | None = None
    # The cost ledger (envserver/cost.py): when the lease began (unix time), the seconds spent
    # preparing and verifying, the commands run; `cost` once the episode ended.
    leased_at: float = field(default_factory=time.time)
    prepare_s: float = 0.0
    verifier_s: float = 0.0
    commands: int = 0
    cost: EpisodeCost | None = None

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "session_id": self.id,
            "task_id": self.task_id,
            "seed": self.seed,
            "steps": self.steps,
            "age_s": round(now - self.started, 3),
            "idle_s": round(now - self.last_active, 3),
            "attached": self.conn is not None,
            "busy": self.inflight is not None,
            "sandbox_id": self.sandbox.id,
            "from_pool": self.sandbox.from_pool,
        }


class EnvService:
    """The server's state: backend, pool, task registry, sessions, metrics."""

    def __init__(self, settings: ServerSettings, backend: SandboxBackend | None = None) -> None:
        self.settings = settings
        self._own_backend = backend is None
        self.backend: SandboxBackend | None = backend
        self.pool: SandboxPool | None = None
        self.tasks: Any = None
        self.metrics = ServerMetrics()
        self.cost_metrics = CostMetrics(self.metrics.registry)
        self.sessions: dict[str, Session] = {}
        self.connections = 0
        self._reserved = 0  # resets between the capacity check and the session's creation
        self._sweeper: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()
        # Ended episodes kept for resume_grace_s so a lost final reply can still be fetched.
        self._finished: dict[str, Session] = {}
        # task id -> (task object, its SandboxSpec): building a spec reads the task's files.
        self._specs: dict[str, tuple[Any, Any]] = {}
        self._network_ceiling = settings.network_ceiling_policy()
        self.groups: GroupRegistry | None = None  # made with the pool, in start()
        self.metrics.sessions_active.set_function(lambda: len(self.sessions))
        self.metrics.sessions_detached.set_function(
            lambda: sum(1 for s in self.sessions.values() if s.conn is None)
        )
        self.metrics.connections.set_function(lambda: self.connections)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        from tasks import TaskRegistry

        s = self.settings
        self.tasks = await asyncio.to_thread(
            TaskRegistry, list(s.task_dirs), include_builtin=s.include_builtin
        )
        if self.backend is None:
            self.backend = get_backend(s.backend, **s.backend_options)
        ensure = getattr(self.backend, "ensure_available", None)
        if ensure is not None:
            # A backend that cannot work (no E2B key or SDK, no Docker engine) stops the
            # server at startup with the reason, instead of failing every reset later.
            try:
                await ensure()
            except Exception as exc:
                log.error("backend %s is not usable: %s", self.backend.name, exc)
                raise
        if s.reap_on_start:
            await self._reap_orphans()
        grace = s.sandbox_grace_s
        self.pool = SandboxPool(
            self.backend,
            PoolSettings(
                min_ready=s.pool_size,
                max_total=max(s.pool_max_total, s.max_sessions),
                lifetime=LifetimeSettings(enabled=grace is not None, grace_s=grace or 300.0),
                host_limits=s.create_limits.get(self.backend.name),
            ),
        )
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

    async def _reap_orphans(self) -> None:
        assert self.backend is not None
        try:
            removed = await self.backend.reap(only_expired=True)
        except Exception:  # a failed cleanup must not keep the server from serving
            log.exception("reaping orphaned sandboxes at startup failed")
            return
        if removed:
            log.info("removed %d orphaned sandboxes at startup: %s", len(removed), removed[:10])

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

    def spec_for(self, task: Any) -> Any:
        """The task's `SandboxSpec`, built once per task object (it reads the Dockerfile: ~5%
        of the server's CPU when every reset rebuilt it in the sessions benchmark)."""
        from tasks.runtime import sandbox_spec_for

        cached = self._specs.get(task.id)
        if cached is not None and cached[0] is task:
            return cached[1]
        spec = sandbox_spec_for(
            task, self.settings.image_map, network_ceiling=self._network_ceiling
        )
        # A network this backend cannot enforce refuses the task here, before any sandbox.
        if self.backend is not None:
            self.backend.check_network(spec)
            self.backend.check_services(spec)  # a multi-container task needs docker
        self._specs[task.id] = (task, spec)
        return spec

    # -- the four requests ---------------------------------------------------------------------
    async def reset(self, conn: Connection, msg: ResetMsg) -> ObservationReply:
        from tasks.runtime import mark_episode, prepare_episode

        verify = msg.options.verify or self.settings.verify
        if conn.session is not None:
            await self._end(conn.session, "reset")
        assert self.pool is not None
        task = self.tasks.get(msg.task_id)
        if len(self.sessions) + self._reserved >= self.settings.max_sessions:
            raise CapacityError(
                f"server is at capacity: {len(self.sessions)} episodes running, "
                f"max_sessions={self.settings.max_sessions}"
            )
        group, member = None, 0
        if msg.options.group is not None:
            assert self.groups is not None
            group, member = self.groups.join(msg.options.group, msg.task_id, msg.seed)
        self._reserved += 1
        try:
            spec = self.spec_for(task)
            prepared = None
            if group is not None and member > 0:  # a copy of member 0's prepared sandbox
                sandbox, prepared, acquire_s = await self._member_sandbox(group, spec)
                forked = prepared.changes is not None or prepared.fork_spec is not None
            else:
                t0 = time.perf_counter()
                forked = False
                sandbox = await self.pool.acquire(spec)
                acquire_s = time.perf_counter() - t0
            self.metrics.acquire_latency.observe(acquire_s)
            # Its hard lifetime: the episode's limits (sandboxes.lifetime), kept by the pool.
            sandbox.episode_end = time.time() + self._episode_limit_s(task)
            try:
                t1 = time.perf_counter()
                if prepared is not None and forked:  # a copy of member 0's prepared sandbox
                    if prepared.changes is not None:
                        await sandbox.apply_changes(prepared.changes)
                    setup = prepared.setup.model_copy(deep=True)  # and of its set-up
                    if setup.network is not None:
                        await sandbox.set_network(setup.network.agent)
                    await mark_episode(task, sandbox, setup, verify, forked=True)
                else:
                    setup = await prepare_episode(
                        task,
                        sandbox,
                        msg.seed,
                        network_ceiling=self._network_ceiling,
                        verify=verify,
                    )
                if group is not None and member == 0:
                    await self._snapshot_group(group, sandbox, spec, setup)
                    self.groups.acquired(group)  # type: ignore[union-attr]
                desktop = setup.desktop  # brought up by prepare_episode for a desktop task
                bridge = None
                if msg.options.gateway_url is not None:  # a harness in the sandbox calls a gateway
                    from envserver.gateway_bridge import GatewayBridge

                    bridge = await GatewayBridge.open(sandbox, msg.options.gateway_url)
                prepare_s = time.perf_counter() - t1
            except BaseException:
                await asyncio.shield(self.pool.release(sandbox))
                raise
        except BaseException as exc:
            if group is not None:
                assert self.groups is not None
                if member == 0:  # every member gets member 0's error
                    self.groups.fail(group, exc)
                self.groups.left(group)
            raise
        finally:
            self._reserved -= 1
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
            conn=conn,
            group=group,
            leased_at=time.time() - prepare_s,
            prepare_s=prepare_s,
        )
        self.sessions[session.id] = session
        conn.session = session
        if not conn.open:  # the socket dropped while the sandbox was being prepared
            self.detach(conn)
        obs = Observation(output=getattr(setup, "instruction", None) or task.instruction)
        if desktop is not None:  # a desktop agent's first look at the screen
            obs = await apply_desktop(desktop, ScreenshotAction())
            obs.output = setup.instruction
        session.last_observation = obs
        return ObservationReply(
            request_id=msg.request_id,
            session_id=session.id,
            resume_token=session.resume_token,
            observation=obs,
            info=ResetInfo(
                task_id=msg.task_id,
                seed=msg.seed,
                acquire_s=acquire_s,
                prepare_s=prepare_s,
                from_pool=sandbox.from_pool,
                desktop=desktop is not None,
                sandbox_id=sandbox.id,
                backend=self.backend.name if self.backend else None,
                max_steps=self.settings.max_steps,
                time_limit_s=self.settings.episode_time_limit_s,
                **({"gateway_socket": "/run/sandgym/gateway.sock"} if bridge else {}),
                **({"network": setup.network.describe()} if setup.network is not None else {}),
                **({"group": group.describe(member, forked)} if group is not None else {}),
                verify=setup.verify,
            ).wire(),
        )

    def _episode_limit_s(self, task: Any) -> float:
        """The longest an episode of `task` can hold its sandbox: the time limit and a verifier
        run per step of the task (the last may start just before the limit). While the server
        lives, the pool's refresh keeps `sandbox_grace_s` ahead of now on top of it."""
        timeouts = getattr(task, "timeouts", None)
        verifier_s = float(getattr(timeouts, "verifier_timeout_s", 120.0))
        steps = max(1, len(getattr(task, "steps", None) or ()))
        return self.settings.episode_time_limit_s + steps * verifier_s

    async def _member_sandbox(self, group: Group, spec: Any) -> tuple[Sandbox, Prepared, float]:
        """A member after the first: its sandbox, member 0's preparation, and the seconds spent
        acquiring. Where the backend forks by changes, the sandbox is one of the task's own
        spec, acquired at once (made while member 0 prepares); else the member waits for the
        preparation and takes one made from its snapshot. Either way the member is counted as
        having its sandbox; on error nothing is kept."""
        assert self.groups is not None and self.pool is not None
        early = self.backend is not None and self.backend.forks_by_changes
        sandbox: Sandbox | None = None
        acquire_s = 0.0
        try:
            if early:
                t0 = time.perf_counter()
                sandbox = await self.pool.acquire(spec)
                acquire_s = time.perf_counter() - t0
            prepared = await asyncio.shield(group.prepared)
            if prepared.changes is None and (sandbox is None or prepared.fork_spec is not None):
                if sandbox is not None:  # member 0 fell back to a snapshot
                    await asyncio.shield(self.pool.release(sandbox))
                    sandbox = None
                t0 = time.perf_counter()
                sandbox = await self.pool.acquire(prepared.fork_spec or spec)
                acquire_s += time.perf_counter() - t0
        except BaseException:
            if sandbox is not None:
                await asyncio.shield(self.pool.release(sandbox))
            raise
        assert sandbox is not None
        self.groups.acquired(group)
        return sandbox, prepared, acquire_s

    async def _snapshot_group(self, group: Group, sandbox: Sandbox, spec: Any, setup: Any) -> None:
        """Member 0, prepared: hand the others its changed files (a backend that forks by
        changes), else snapshot its sandbox and have the pool make their copies now. A backend
        without either, or a desktop task (its state is running programs), leaves every member
        to prepare on its own."""
        assert self.groups is not None and self.pool is not None
        prepared = Prepared(setup=setup.model_copy(update={"desktop": None}, deep=True))
        copies = group.size > 1 and setup.desktop is None
        if copies and self.backend is not None and self.backend.forks_by_changes:
            try:
                prepared.changes = await sandbox.changes()
            except SnapshotUnsupportedError as exc:
                log.info("group %s: a snapshot instead of changes (%s)", group.id, exc)
        if copies and prepared.changes is None:
            try:
                snap = await sandbox.snapshot()
            except SnapshotUnsupportedError as exc:
                log.info("group %s: members prepare on their own (%s)", group.id, exc)
            else:
                prepared.snapshot = snap
                prepared.fork_spec = spec.model_copy(update={"snapshot": snap})
                await self.pool.prewarm({prepared.fork_spec: group.size - 1})
        self.groups.resolve(group, prepared)

    async def step(self, conn: Connection, msg: StepMsg) -> StepResultReply:
        s = conn.session
        if s is not None and msg.request_id == s.last_id and s.last_reply is not None:
            return s.last_reply  # a resend after a lost reply: never run the action twice
        if s is None or s.done:
            raise NoEpisodeError("no episode on this connection: send `reset` (or `resume`) first")
        if s.inflight is not None:
            if msg.request_id == s.inflight_id:
                return await asyncio.shield(s.inflight)
            raise BusyError(
                f"request {s.inflight_id!r} of this session is still being handled; "
                "send one request at a time"
            )
        fut: asyncio.Future[StepResultReply] = asyncio.get_running_loop().create_future()
        s.inflight, s.inflight_id = fut, msg.request_id
        try:
            reply = await self._step(s, msg)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: a resend may never come
            raise
        else:
            fut.set_result(reply)
            s.last_id, s.last_reply = msg.request_id, reply
            return reply
        finally:
            s.inflight, s.inflight_id = None, None
            s.last_active = time.monotonic()

    async def _step(self, s: Session, msg: StepMsg) -> StepResultReply:
        settings = self.settings
        action = msg.action
        now = time.monotonic()
        elapsed = now - s.started
        remaining = settings.episode_time_limit_s - elapsed
        if remaining <= 0:
            await self._end(s, "time_limit")
            return StepResultReply(
                request_id=msg.request_id,
                observation=Observation(output="[sandgym: episode time limit reached]\n"),
                truncated=True,
                info=StepInfo(step=s.steps, elapsed_s=elapsed, truncation="time_limit").wire(),
            )
        info: dict[str, Any] = {}
        t0 = time.perf_counter()
        if isinstance(action, SubmitAction):
            from tasks.runtime import score_step

            done = True
            try:
                result, outcome = await score_step(
                    s.task,
                    s.sandbox,
                    s.setup,
                    stop_agent_processes=self.settings.verifier_stop_agent_processes,
                    backend=self.backend,  # a separate verifier's sandbox comes from it
                    image_map=self.settings.image_map,
                )
                done = outcome.done
            finally:
                verifier_s = time.perf_counter() - t0
                s.verifier_s += verifier_s
                if done:  # (also when scoring failed: the episode cannot go on)
                    await self._end(s, "submit")
            self.metrics.latency_by_kind["submit"].observe(verifier_s)
            self.metrics.steps.inc()
            info = {
                "step": s.steps + 1,
                "elapsed_s": time.monotonic() - s.started,
                "verifier_s": verifier_s,
                "verifier_duration_s": result.duration_s,
                "verifier_output": _tail(result.output or ""),
                "from_pool": s.sandbox.from_pool,
                **self._tamper_info(result),
            }
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
                observation=Observation(
                    output=f"[sandgym: submitted; reward {outcome.reward:g}]\n"
                ),
                reward=float(outcome.reward),
                terminated=True,
                info=StepInfo(**info).wire(),
            )
        timeout_s = settings.default_action_timeout_s
        if isinstance(action, CommandAction) and action.timeout_s is not None:
            timeout_s = action.timeout_s
        # Never let one action outlive the episode's own time limit by much.
        timeout_s = max(0.001, min(timeout_s, settings.max_action_timeout_s, remaining))
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
            await self._end(s, str(info["truncation"]))
            if s.cost is not None:
                info["cost"] = s.cost
        return StepResultReply(
            request_id=msg.request_id,
            observation=obs,
            truncated=truncated,
            info=StepInfo(**info).wire(),
        )

    def _tamper_info(self, result: Any) -> dict[str, Any]:
        """info.tamper and info.verify of a scored submit, counted in the metrics."""
        if result.tamper is None:
            return {}
        self.metrics.episode_verified(result.verify, result.tamper)
        return {"tamper": result.tamper.model_dump(), "verify": result.verify}

    async def close(self, conn: Connection, msg: CloseMsg) -> ClosedReply:
        s = conn.session
        if s is None:
            return ClosedReply(request_id=msg.request_id, session_id=None)
        await self._end(s, "closed")
        return ClosedReply(request_id=msg.request_id, session_id=s.id)

    async def resume(self, conn: Connection, msg: ResumeMsg) -> ObservationReply:
        s = self.sessions.get(msg.session_id) or self._finished.get(msg.session_id)
        if s is None or not secrets.compare_digest(s.resume_token, msg.resume_token):
            raise NoEpisodeError(
                f"no resumable episode {msg.session_id!r} with that token: it ended, its "
                f"{self.settings.resume_grace_s:g}s grace ran out, or the token is wrong"
            )
        if conn.session is not None and conn.session is not s:
            await self._end(conn.session, "reset")
        if s.done:
            # It ended (submit, truncation) while the client was away: attach it read-only so
            # a resend of the final step gets its cached reply.
            conn.session = s
            return ObservationReply(
                request_id=msg.request_id,
                session_id=s.id,
                resume_token=s.resume_token,
                observation=s.last_observation,
                info=ResumeInfo(
                    resumed=True, ended=True, step=s.steps, last_request_id=s.last_id
                ).wire(),
            )
        if s.conn is not None and s.conn is not conn:
            # The old socket may be half-open and not yet noticed dead: the resumer wins.
            s.conn.session = None
        s.conn, s.detached_at = conn, None
        s.last_active = time.monotonic()
        conn.session = s
        if not conn.open:
            self.detach(conn)
        return ObservationReply(
            request_id=msg.request_id,
            session_id=s.id,
            resume_token=s.resume_token,
            observation=s.last_observation,
            info=ResumeInfo(
                resumed=True,
                task_id=s.task_id,
                step=s.steps,
                last_request_id=s.last_id,
                elapsed_s=time.monotonic() - s.started,
            ).wire(),
        )

    # -- detaching, ending, sweeping -------------------------------------------------------------
    def detach(self, conn: Connection) -> None:
        """The connection dropped: keep its episode for `resume_grace_s`."""
        s = conn.session
        conn.session = None
        if s is None or s.done or s.conn is not conn:
            return
        s.conn, s.detached_at = None, time.monotonic()
        if self.settings.resume_grace_s <= 0:
            self._end_bg(s, "disconnected")

    def _end_bg(self, s: Session, reason: str) -> None:
        """End now (no resume or step can reach it from here on); release in the background."""
        if not self._finish(s, reason):
            return
        task = asyncio.create_task(self._release(s))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end(self, s: Session, reason: str) -> None:
        """End an episode and hand its sandbox back to the pool (which destroys it)."""
        if self._finish(s, reason):
            await self._release(s)

    def _finish(self, s: Session, reason: str) -> bool:
        """Mark an episode ended, synchronously; False when it already was."""
        if s.done:
            return False
        s.done = True
        s.detached_at = time.monotonic()  # from now on: how long the final reply is kept
        self.sessions.pop(s.id, None)
        if self.settings.resume_grace_s > 0 and reason in _FINAL_REPLY_REASONS:
            self._finished[s.id] = s
        if s.conn is not None and s.conn.session is s:
            s.conn.session = None
        self.metrics.episode_ended(reason)
        return True

    async def _release(self, s: Session) -> None:
        if s.bridge is not None:
            await s.bridge.close()
            s.bridge = None
        if self.pool is None:
            return
        if self.settings.cost_ledger:
            s.cost = await episode_cost(
                s.sandbox,
                backend=self.backend.name if self.backend else None,
                leased_at=s.leased_at,
                prepare_s=s.prepare_s,
                verifier_s=s.verifier_s,
                commands=s.commands,
            )
            self.cost_metrics.add(s.cost)
        try:
            await asyncio.shield(self.pool.release(s.sandbox))
        except Exception:
            log.exception("releasing sandbox %s failed", s.sandbox.id)
        if s.group is not None and self.groups is not None:
            group, s.group = s.group, None
            self.groups.left(group)

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
        ended = []
        st = self.settings
        for sid, s in list(self._finished.items()):
            if s.detached_at is None or now - s.detached_at >= st.resume_grace_s:
                del self._finished[sid]
        for s in list(self.sessions.values()):
            if s.inflight is not None:
                continue
            if s.detached_at is not None and now - s.detached_at >= st.resume_grace_s:
                reason = "abandoned"
            elif now - s.last_active >= st.idle_timeout_s:
                reason = "idle"
            else:
                continue
            ended.append(s.id)
            self._end_bg(s, reason)
        return ended

    @property
    def resetting(self) -> int:
        """Resets past the capacity check whose session does not exist yet (they hold a slot)."""
        return self._reserved

    def sessions_view(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [s.describe(now) for s in self.sessions.values()]


def _tail(text: str, limit: int = 16_000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]

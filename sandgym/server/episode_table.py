"""The episode table: the live episodes (`Session`s) by id, the ended ones kept for a lost final
reply, the capacity slots, and the rules of detaching, resuming and sweeping.

It holds state and decides; it releases nothing itself. `EnvService` (sandgym/server/sessions.py)
ends what the table marks ended (`finish`, `detach`, `due`) and hands the sandbox back.

Rules:
- capacity counts the live episodes and the resets past the capacity check whose episode does not
  exist yet (`reserve`);
- a dropped connection detaches its episode; `resumable` finds it again by id and token within
  `resume_grace_s`; an episode that ended with a final reply worth keeping (`submit`, a
  truncation) stays findable that long too, read-only;
- `due` names the episodes to end: detached past the grace (`abandoned`), or idle for
  `idle_timeout_s` (`idle`); one with a request in flight is never due.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sandgym.sandboxes import Sandbox
from sandgym.server.errors import CapacityError, NoEpisodeError
from sandgym.server.settings import ServerSettings
from sandgym.wire.protocol import EpisodeCost, Observation, SessionEntry, StepResultReply

if TYPE_CHECKING:
    from sandgym.sandboxes.desktop import Desktop
    from sandgym.server.gateway_bridge import GatewayBridge
    from sandgym.server.groups import Group
    from sandgym.tasks.episode_models import EpisodeSetup
    from sandgym.tasks.models import TaskSpec

#: Ways an episode ends with a final step reply worth keeping for a client that lost it.
FINAL_REPLY_REASONS = frozenset({"submit", "max_steps", "time_limit"})


class EpisodeConnection(Protocol):
    """What the service needs of a connection (`sandgym.server.app.Connection`, an OpenEnv socket's
    `WireConnection`): the episode it holds, and whether its peer is still there."""

    session: Session | None

    @property
    def open(self) -> bool: ...


@dataclass(eq=False)
class Session:
    """One episode, attached to at most one connection."""

    id: str
    resume_token: str
    task_id: str
    task: TaskSpec
    sandbox: Sandbox
    setup: EpisodeSetup
    seed: int | None
    desktop: Desktop | None = None  # the display and app of a desktop task
    bridge: GatewayBridge | None = None  # when reset asked for a gateway
    group: Group | None = None  # when reset named one (until released)
    started: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    steps: int = 0
    conn: EpisodeConnection | None = None
    detached_at: float | None = None
    done: bool = False
    last_observation: Observation = field(default_factory=Observation)
    # Idempotent resend (sandgym/server/resend.py): the request being handled and the last reply sent.
    inflight_id: str | None = None
    inflight: asyncio.Future[StepResultReply] | None = None
    last_id: str | None = None
    last_reply: StepResultReply | None = None
    # The cost ledger (sandgym/server/cost.py): when the lease began (unix time), the seconds spent
    # preparing and verifying, the commands run; `cost` once the episode ended.
    leased_at: float = field(default_factory=time.time)
    prepare_s: float = 0.0
    verifier_s: float = 0.0
    commands: int = 0
    cost: EpisodeCost | None = None

    def describe(self, now: float) -> SessionEntry:
        """This episode's entry in `GET /v1/sessions`."""
        return SessionEntry(
            session_id=self.id,
            task_id=self.task_id,
            seed=self.seed,
            steps=self.steps,
            age_s=round(now - self.started, 3),
            idle_s=round(now - self.last_active, 3),
            attached=self.conn is not None,
            busy=self.inflight is not None,
            sandbox_id=self.sandbox.id,
            from_pool=self.sandbox.from_pool,
        )


class SessionTable:
    """The live and recently ended episodes, and the capacity slots."""

    def __init__(self, settings: ServerSettings, on_end: Callable[[str], None]) -> None:
        self.settings = settings
        self.live: dict[str, Session] = {}
        # Ended episodes kept for resume_grace_s so a lost final reply can still be fetched.
        self.finished: dict[str, Session] = {}
        self.reserved = 0  # resets between the capacity check and the session's creation
        self._on_end = on_end  # told the reason of every episode that ends (the metrics)

    def check_capacity(self) -> None:
        """A `CapacityError` when every slot is held by an episode or a reset."""
        if len(self.live) + self.reserved >= self.settings.max_sessions:
            raise CapacityError(
                f"server is at capacity: {len(self.live)} episodes running, "
                f"max_sessions={self.settings.max_sessions}"
            )

    @contextlib.contextmanager
    def reserve(self) -> Iterator[None]:
        """Hold a slot while a reset prepares its episode."""
        self.reserved += 1
        try:
            yield
        finally:
            self.reserved -= 1

    def add(self, s: Session, conn: EpisodeConnection) -> None:
        """A new episode, attached to `conn`."""
        self.live[s.id] = s
        s.conn = conn
        conn.session = s

    def resumable(self, session_id: str, resume_token: str) -> Session:
        """The live or recently ended episode of that id and token; `NoEpisodeError` else."""
        s = self.live.get(session_id) or self.finished.get(session_id)
        if s is None or not secrets.compare_digest(s.resume_token, resume_token):
            raise NoEpisodeError(
                f"no resumable episode {session_id!r} with that token: it ended, its "
                f"{self.settings.resume_grace_s:g}s grace ran out, or the token is wrong"
            )
        return s

    def attach(self, s: Session, conn: EpisodeConnection) -> None:
        """A live episode taken over by `conn` (resume)."""
        if s.conn is not None and s.conn is not conn:
            # The old socket may be half-open and not yet noticed dead: the resumer wins.
            s.conn.session = None
        s.conn, s.detached_at = conn, None
        s.last_active = time.monotonic()
        conn.session = s

    def detach(self, conn: EpisodeConnection) -> Session | None:
        """The connection dropped: its episode waits `resume_grace_s` for a resume. Returns the
        episode when it must end now instead (no grace)."""
        s = conn.session
        conn.session = None
        if s is None or s.done or s.conn is not conn:
            return None
        s.conn, s.detached_at = None, time.monotonic()
        return s if self.settings.resume_grace_s <= 0 else None

    def finish(self, s: Session, reason: str) -> bool:
        """Mark an episode ended, synchronously; False when it already was."""
        if s.done:
            return False
        s.done = True
        s.detached_at = time.monotonic()  # from now on: how long the final reply is kept
        self.live.pop(s.id, None)
        if self.settings.resume_grace_s > 0 and reason in FINAL_REPLY_REASONS:
            self.finished[s.id] = s
        if s.conn is not None and s.conn.session is s:
            s.conn.session = None
        self._on_end(reason)
        return True

    def due(self, now: float) -> list[tuple[Session, str]]:
        """Forget ended episodes past the grace; return the live ones to end, with the reason."""
        st = self.settings
        for sid, s in list(self.finished.items()):
            if s.detached_at is None or now - s.detached_at >= st.resume_grace_s:
                del self.finished[sid]
        due = []
        for s in list(self.live.values()):
            if s.inflight is not None:
                continue
            if s.detached_at is not None and now - s.detached_at >= st.resume_grace_s:
                due.append((s, "abandoned"))
            elif now - s.last_active >= st.idle_timeout_s:
                due.append((s, "idle"))
        return due

    def view(self) -> list[SessionEntry]:
        """The live episodes as `GET /v1/sessions` lists them."""
        now = time.monotonic()
        return [s.describe(now) for s in self.live.values()]

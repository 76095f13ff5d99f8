"""Episode groups (`reset.options.group`, protocol 1.1): one preparation, N copies.

GRPO and RLOO play N episodes of one task and seed. The first reset that names a group id
(member 0) prepares its sandbox as any reset does (environment, task set-up, the seed's
instance). Then, two ways:

- where the backend forks by changes (`SandboxBackend.forks_by_changes`: docker), every other
  member acquires a sandbox of the task's own spec at once, made while member 0 prepares, and
  gets member 0's changed files (`Sandbox.changes` / `apply_changes`);
- else member 0's sandbox is snapshotted (`Sandbox.snapshot`: a `docker commit`, a copy of a
  local tree) and the pool makes `size - 1` sandboxes from that snapshot, one per member.

Either way each member gets a copy of member 0's episode set-up: the same files, environment
variables and instruction, and from then on its own (a write in one is never seen in
another). Processes are not copied: a member's shell is a fresh one in the same directory. Where
a snapshot cannot be made (a backend without one, a desktop task whose state lives in running
programs) every member prepares on its own, still with the seed's identical instance.

A preparation that fails fails every member with that same error. A group's snapshot is removed
once all its members have joined and released their sandboxes, or, when some never come, once
its `ttl_s` has passed with none of them live; the pool's ready copies go first. Snapshots carry
the server's labels, so the reaper removes what a killed server left.

All of it lives here: `GroupRegistry.join` at a reset, `member_sandbox` and `fork_setup` for a
member after the first, `share` for member 0, `abandon` when a reset fails; `left` when a member's
sandbox is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandgym.sandboxes.errors import SnapshotUnsupportedError
from sandgym.server.errors import InvalidMessageError
from sandgym.tasks.episode_start import mark_episode
from sandgym.wire.protocol import GroupOptions

if TYPE_CHECKING:
    from sandgym.sandboxes import Sandbox, SandboxBackend, SandboxSpec
    from sandgym.sandboxes.pool import SandboxPool
    from sandgym.sandboxes.spec import FileChanges
    from sandgym.tasks.episode_models import EpisodeSetup, VerifyMode
    from sandgym.tasks.models import TaskSpec

log = logging.getLogger(__name__)


class GroupMismatchError(InvalidMessageError):
    """A reset named a group but not its task, seed or size, or the group is already full."""


class GroupAbandonedError(InvalidMessageError):
    """Member 0's reset went away (cancelled, connection lost) before the group was prepared."""


@dataclass
class Prepared:
    """What member 0's preparation hands the others."""

    setup: EpisodeSetup  # member 0's, copied per member
    fork_spec: SandboxSpec | None = None  # naming the snapshot; None: members prepare on their own
    snapshot: str | None = None
    changes: FileChanges | None = None  # member 0's (a backend that forks by changes)

    @property
    def forked(self) -> bool:
        """The members start from a copy of member 0 (else each prepares on its own)."""
        return self.changes is not None or self.fork_spec is not None


@dataclass
class Group:
    id: str
    task_id: str
    seed: int | None
    size: int
    created: float = field(default_factory=time.monotonic)
    joined: int = 0
    live: int = 0
    acquired: int = 0  # members that got their sandbox
    prepared: asyncio.Future[Prepared] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    removing: bool = False

    def describe(self, member: int, forked: bool) -> dict[str, Any]:
        return {"id": self.id, "size": self.size, "member": member, "forked": forked}


class GroupRegistry:
    """The server's live groups, and the removal of their snapshots."""

    def __init__(self, backend: SandboxBackend, pool: SandboxPool, ttl_s: float = 600.0) -> None:
        self.backend = backend
        self.pool = pool
        self.ttl_s = ttl_s
        self.groups: dict[str, Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.snapshots_made = 0
        self.snapshots_removed = 0

    def join(self, opts: GroupOptions, task_id: str, seed: int | None) -> tuple[Group, int]:
        """The group and this reset's member number (0 prepares); a named error when the
        reset does not match the group or the group is full."""
        g = self.groups.get(opts.id)
        if g is None or g.removing:
            g = self.groups[opts.id] = Group(opts.id, task_id, seed, opts.size)
        elif (g.task_id, g.seed, g.size) != (task_id, seed, opts.size):
            raise GroupMismatchError(
                f"group {opts.id!r} is task {g.task_id!r} seed {g.seed} size {g.size}; this "
                f"reset asked for task {task_id!r} seed {seed} size {opts.size}"
            )
        elif g.joined >= g.size:
            raise GroupMismatchError(
                f"group {opts.id!r} already has its {g.size} members; use a new group id"
            )
        member = g.joined
        g.joined += 1
        g.live += 1
        return g, member

    def abandon(self, g: Group, member: int, exc: BaseException) -> None:
        """A member's reset failed: member 0's error becomes every member's."""
        if member == 0:
            self.fail(g, exc)
        self.left(g)

    async def member_sandbox(self, g: Group, spec: SandboxSpec) -> tuple[Sandbox, Prepared, float]:
        """A member after the first: its sandbox, member 0's preparation, and the seconds spent
        acquiring. Where the backend forks by changes, the sandbox is one of the task's own
        spec, acquired at once (made while member 0 prepares); else the member waits for the
        preparation and takes one made from its snapshot. Either way the member is counted as
        having its sandbox; on error nothing is kept."""
        early = self.backend.forks_by_changes
        sandbox: Sandbox | None = None
        acquire_s = 0.0
        try:
            if early:
                t0 = time.perf_counter()
                sandbox = await self.pool.acquire(spec)
                acquire_s = time.perf_counter() - t0
            prepared = await asyncio.shield(g.prepared)
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
        self.acquired(g)
        return sandbox, prepared, acquire_s

    async def fork_setup(
        self, task: TaskSpec, sandbox: Sandbox, prepared: Prepared, verify: VerifyMode | None
    ) -> EpisodeSetup:
        """A forked member's set-up: member 0's changed files applied to its sandbox (a backend
        that forks by changes; a snapshot's copy has them already), a copy of member 0's set-up,
        the agent's network, and the tamper baseline."""

        if prepared.changes is not None:
            await sandbox.apply_changes(prepared.changes)
        setup = prepared.setup.model_copy(deep=True)
        if setup.network is not None:
            await sandbox.set_network(setup.network.agent)
        await mark_episode(task, sandbox, setup, verify, forked=True)
        return setup

    async def share(
        self, g: Group, sandbox: Sandbox, spec: SandboxSpec, setup: EpisodeSetup
    ) -> None:
        """Member 0, prepared: hand the others its changed files (a backend that forks by
        changes), else snapshot its sandbox and have the pool make their copies now. A backend
        without either, or a desktop task (its state is running programs), leaves every member
        to prepare on its own. Member 0 then counts as having its sandbox."""
        prepared = Prepared(setup=setup.model_copy(update={"desktop": None}, deep=True))
        copies = g.size > 1 and setup.desktop is None
        if copies and self.backend.forks_by_changes:
            try:
                prepared.changes = await sandbox.changes()
            except SnapshotUnsupportedError as exc:
                log.info("group %s: a snapshot instead of changes (%s)", g.id, exc)
        if copies and prepared.changes is None:
            try:
                snap = await sandbox.snapshot()
            except SnapshotUnsupportedError as exc:
                log.info("group %s: members prepare on their own (%s)", g.id, exc)
            else:
                prepared.snapshot = snap
                prepared.fork_spec = spec.model_copy(update={"snapshot": snap})
                await self.pool.prewarm({prepared.fork_spec: g.size - 1})
        self.resolve(g, prepared)
        self.acquired(g)

    def resolve(self, g: Group, prepared: Prepared) -> None:
        if prepared.snapshot is not None:
            self.snapshots_made += 1
        if not g.prepared.done():
            g.prepared.set_result(prepared)

    def fail(self, g: Group, exc: BaseException) -> None:
        """Member 0's preparation failed: every member gets this error."""
        if isinstance(exc, asyncio.CancelledError):  # member 0's reset went away
            exc = GroupAbandonedError(
                f"member 0 of group {g.id!r} stopped before the group was prepared; reset "
                "with a new group id"
            )
        if not g.prepared.done():
            g.prepared.set_exception(exc)
            g.prepared.exception()  # retrieved: no "never retrieved" warning if none waits

    def acquired(self, g: Group) -> None:
        """A member got its sandbox. Once all have, the pool stops keeping copies of the
        snapshot (it would otherwise replace each released one for a member that never
        comes)."""
        g.acquired += 1
        if g.acquired >= g.size and g.prepared.done() and g.prepared.exception() is None:
            fork_spec = g.prepared.result().fork_spec
            if fork_spec is not None:
                task = asyncio.create_task(self.pool.forget(fork_spec, timeout_s=0))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def left(self, g: Group) -> None:
        """A member's sandbox was released (or its reset failed)."""
        g.live -= 1
        if g.joined >= g.size and g.live <= 0:
            self._remove_bg(g)

    def expire(self, now: float | None = None) -> list[str]:
        """Groups past their ttl with no live member: removed (their missing members never
        came). Returns their ids."""
        now = time.monotonic() if now is None else now
        gone = [
            g
            for g in self.groups.values()
            if not g.removing and g.live <= 0 and now - g.created >= self.ttl_s
        ]
        for g in gone:
            self._remove_bg(g)
        return [g.id for g in gone]

    def _remove_bg(self, g: Group) -> None:
        if g.removing:
            return
        g.removing = True
        task = asyncio.create_task(self._remove(g), name=f"sandgym-group-remove-{g.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _remove(self, g: Group) -> None:
        try:
            if not g.prepared.done():
                self.fail(g, GroupMismatchError(f"group {g.id!r} was removed before it was ready"))
            elif g.prepared.exception() is None:
                p = g.prepared.result()
                if p.fork_spec is not None:
                    await self.pool.forget(p.fork_spec)
                if p.snapshot is not None:
                    await self._remove_snapshot(p.snapshot)
        finally:
            if self.groups.get(g.id) is g:
                del self.groups[g.id]

    async def _remove_snapshot(self, snapshot: str) -> None:
        # A copy still being destroyed keeps a docker image in use: retry for a while, then
        # leave it to the reaper (it is labelled like the server's sandboxes).
        for attempt in range(20):
            try:
                await self.backend.remove_snapshot(snapshot)
            except Exception as exc:
                if attempt == 19:
                    log.warning("group snapshot %s not removed: %s", snapshot, exc)
                    return
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            else:
                self.snapshots_removed += 1
                return

    async def close(self) -> None:
        """Remove every group's snapshot (server shutdown)."""
        for g in list(self.groups.values()):
            self._remove_bg(g)
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._tasks, return_exceptions=True)

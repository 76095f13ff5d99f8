"""Hard lifetimes: every sandbox carries a deadline after which it ends itself, server or not.

A sandbox's deadline is a unix time its backend keeps where the sandbox itself can read it and
the agent cannot change it (docker: `/run/sandgym/deadline`, the bridge directory bind-mounted
read-only; local: `/run/sandgym-life/deadline`, a read-only bind of a host directory; E2B: the
provider's own sandbox timeout, `set_timeout`). Inside, the sandbox's pid 1 itself (docker:
bash running `HELPER_SCRIPT`, which `MAIN_INIT` execs; local: bash running `INIT_SCRIPT`) reads it
about once a second and exits once it has passed, which ends everything in the sandbox; E2B kills
the VM at its timeout. So a sandbox whose server was killed (or hangs) ends by itself, without any
server or reaper running.

Nothing inside can keep it alive past its deadline: the kernel delivers no SIGSTOP or SIGKILL sent
inside a pid namespace to its pid 1, nor any signal it has no handler for (it ignores the
terminating ones); it forks nothing and waits on no child once started (bash builtins only), so
stopping or killing the other processes, a fork bomb, a full disk or replaced shells on disk leave
it running; it reads the deadline relative to its working directory, the read-only mount. Bound:
it ends within about 2.5 s of the deadline (whole seconds, checked once a second;
tests/integration/test_deadline_attacks.py allows 10 s under load). Not covered: a docker image
without bash, whose pid 1 is its `sh` forking `sleep` and `date` (a root agent that stops those
holds it), and a compose service's watcher, a child of tini that the service's own root processes
could stop (docs/operations.md). A private verifier's container shares the sandbox's pid namespace
and ends with its pid 1 at the latest.

What the deadline is (`desired_deadline`):
- a sandbox waiting in the pool: `grace_s` from now, moved on while its server is alive;
- a sandbox leased to an episode: the end its episode's limits allow (`Sandbox.episode_end`,
  set by the server at reset: the episode's time limit plus the verifier's and a slack), or
  `grace_s` from now when that is later (an episode still active past its limits, while its
  server lives, is extended).

The live server moves deadlines on (`LifetimeKeeper.refresh`, from the pool's maintenance loop)
whenever less than half of `grace_s` is left of the one written, so a file backend writes about
twice per `grace_s` per sandbox and E2B gets one `set_timeout` per episode plus one per
`grace_s / 2` while it waits in the pool. After the server is gone the sandbox ends at the last
deadline written: at most `grace_s` after the server's last refresh for a waiting sandbox, at the
end of its episode's limits (or `grace_s` after the last refresh, if later) for a leased one.

Sandboxes made outside a pool (a separate or pristine verifier's, `sandgym tasks check`'s, the
benchmarks') get theirs from `OwnLifetimes`: `limit_s` (their creator's own limits) plus
`grace_s` from when it is written, moved on by the same keeper while their creator lives.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from sandgym.sandboxes.createlimit import creating

if TYPE_CHECKING:
    from sandgym.sandboxes.base import Sandbox, SandboxBackend
    from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)

#: the file, in a directory the sandbox sees read-only, that holds its deadline (unix seconds)
DEADLINE_FILE = "deadline"


#: how long (seconds) a sandbox being created now lives from the moment its backend writes its
#: first deadline (set around a `backend.create` call by the pool and by `OwnLifetimes`; a
#: backend reads it with `first_deadline`, after building its image). A contextvar, so that a
#: sandbox nobody asked a deadline for gets none.
_FIRST_LIFETIME: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "sandgym_first_lifetime", default=None
)


def first_deadline() -> float | None:
    """The deadline (unix time) a sandbox created in this context starts with, counted from
    now, or None for none."""
    life = _FIRST_LIFETIME.get()
    return None if life is None else time.time() + life


def set_first_lifetime(seconds: float | None) -> contextvars.Token[float | None]:
    """Make sandboxes created in this context (task) start with a deadline `seconds` after
    their backend writes it."""
    return _FIRST_LIFETIME.set(seconds)


class LifetimeSettings(BaseModel):
    """How long sandboxes outlive their server (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True, description="give every sandbox a deadline after which it ends itself"
    )
    grace_s: float = Field(
        default=300.0,
        ge=5.0,
        description="a sandbox outlives its server's last refresh by at least this (less "
        "would end healthy sandboxes whose server is merely slow to refresh)",
    )


def write_deadline_file(directory: Path, deadline: float) -> None:
    """(Thread) write `deadline` (whole unix seconds, rounded up) into `directory`/deadline by
    an atomic rename, so a reader inside never sees a half-written number."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{DEADLINE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(f"{int(-(-deadline // 1))}\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, directory / DEADLINE_FILE)


def read_deadline_file(directory: Path) -> float | None:
    """The deadline in `directory`, or None without a readable one."""
    try:
        return float((directory / DEADLINE_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def desired_deadline(sb: Sandbox, now: float, grace_s: float) -> float:
    """The deadline `sb` should carry now, with its server alive (see the module docstring)."""
    heartbeat = now + grace_s
    end = sb.episode_end
    return heartbeat if end is None else max(heartbeat, end)


def needs_write(sb: Sandbox, desired: float, now: float, grace_s: float) -> bool:
    """Whether the deadline written on `sb` must move: none yet, less than half of `grace_s`
    left of it, or the desired one is later by more than half of `grace_s` (an episode's limits
    set at reset)."""
    current = sb.deadline
    if current is None:
        return True
    return current - now < grace_s / 2 or desired - current > grace_s / 2


class LifetimeStats(BaseModel):
    """What the pool's snapshot (and `/metrics`) shows of the deadline keeper."""

    model_config = ConfigDict(extra="forbid")

    writes: int = Field(description="deadlines written (files, set_timeout calls)")
    errors: int = Field(description="failed writes (retried next round)")
    grace_s: float = Field(description="how far ahead a waiting sandbox's deadline is kept")


class LifetimeKeeper:
    """Moves the deadlines of a live server's sandboxes on; one per pool."""

    def __init__(self, settings: LifetimeSettings) -> None:
        self.settings = settings
        self.writes = 0  # deadlines written (files, set_timeout calls)
        self.errors = 0  # failed writes (retried next round)
        self._round: asyncio.Task[None] | None = None

    def refresh(self, sandboxes: Iterable[Sandbox], now: float | None = None) -> None:
        """Start one round of deadline writes for those of `sandboxes` whose deadline must move
        (in the background; a round still running is not doubled)."""
        if not self.settings.enabled or (self._round is not None and not self._round.done()):
            return
        now = time.time() if now is None else now
        grace = self.settings.grace_s
        due = []
        for sb in sandboxes:
            if sb.closed or sb.deadline is None:  # made without one: nobody asked for it
                continue
            desired = desired_deadline(sb, now, grace)
            if needs_write(sb, desired, now, grace):
                due.append((sb, desired))
        if due:
            self._round = asyncio.create_task(self._write(due), name="sandgym-lifetime-refresh")

    async def _write(self, due: list[tuple[Sandbox, float]]) -> None:
        for sb, deadline in due:
            if sb.closed:
                continue
            try:
                await sb.set_deadline(deadline)
                self.writes += 1
            except Exception as exc:  # a sandbox being destroyed, an API hiccup: next round
                self.errors += 1
                log.info("lifetime: moving the deadline of %s failed: %s", sb.id, exc)

    async def aclose(self) -> None:
        if self._round is not None and not self._round.done():
            self._round.cancel()
            try:
                await self._round
            except asyncio.CancelledError:
                pass

    def stats(self) -> LifetimeStats:
        return LifetimeStats(writes=self.writes, errors=self.errors, grace_s=self.settings.grace_s)


# -- sandboxes made outside a pool ----------------------------------------------------------------

#: the environment variable the server's `sandbox_grace_s` is read from; processes without a
#: server (`sandgym tasks check`, the benchmarks) read it too
GRACE_ENV = "SANDGYM_SANDBOX_GRACE_S"

_configured: LifetimeSettings | None = None


def settings_from_env() -> LifetimeSettings:
    """The lifetime settings `SANDGYM_SANDBOX_GRACE_S` gives (as the server reads it: a number
    of seconds; `off`, `none`, `null` or empty for no deadlines; unset for the default)."""
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return LifetimeSettings()
    if raw.strip().lower() in ("", "off", "none", "null"):
        return LifetimeSettings(enabled=False)
    try:
        grace = float(raw)
    except ValueError:
        raise ValueError(
            f"{GRACE_ENV}: expected a number of seconds or `off`, found {raw!r}"
        ) from None
    return LifetimeSettings(grace_s=grace)


def configure_own_lifetimes(settings: LifetimeSettings) -> None:
    """Make `settings` (the server's, when it makes its pool) the ones sandboxes made outside
    a pool in this process get (`OwnLifetimes`), instead of `settings_from_env()`."""
    global _configured
    _configured = settings


def own_lifetime_settings() -> LifetimeSettings:
    """The settings `OwnLifetimes` uses by default: the configured ones, else the environment's."""
    return _configured if _configured is not None else settings_from_env()


class OwnLifetimes:
    """Deadlines for sandboxes made outside a pool (a separate or pristine verifier's sandbox,
    `sandgym tasks check`'s, a benchmark's), kept by their creator while it lives.

    `create(backend, spec, limit_s)` makes a sandbox whose first deadline is `limit_s` (what its
    creator's own limits allow it: a verifier's timeout, a task's agent and verifier timeouts)
    plus `grace_s` after the backend writes it, and records `limit_s` from then as its
    `episode_end`. While the `async with` block runs, the same `LifetimeKeeper` the pool uses
    moves the deadline on (never before `episode_end + grace_s`, then `grace_s` ahead of now);
    once the creator is killed nothing moves it and the sandbox ends itself at the last
    deadline written. Closing the sandboxes stays the creator's job."""

    def __init__(self, settings: LifetimeSettings | None = None) -> None:
        self.settings = settings if settings is not None else own_lifetime_settings()
        self.keeper = LifetimeKeeper(self.settings)
        self._kept: list[Sandbox] = []
        self._loop: asyncio.Task[None] | None = None

    async def __aenter__(self) -> OwnLifetimes:
        if self.settings.enabled:
            self._loop = asyncio.create_task(self._keep(), name="sandgym-own-lifetimes")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.cancel()
            try:
                await self._loop
            except asyncio.CancelledError:
                pass
        await self.keeper.aclose()

    async def create(self, backend: SandboxBackend, spec: SandboxSpec, limit_s: float) -> Sandbox:
        """`backend.create(spec)`, with a deadline `limit_s + grace_s` from when it is written
        (none with deadlines off); kept moving while this block runs."""
        if not self.settings.enabled:
            async with creating(backend.name):  # the creation limits the pool's obey too
                return await backend.create(spec)
        token = set_first_lifetime(limit_s + self.settings.grace_s)
        try:
            async with creating(backend.name):
                sb = await backend.create(spec)
        finally:
            _FIRST_LIFETIME.reset(token)
        if sb.deadline is not None:  # a backend without deadlines keeps none
            sb.episode_end = sb.deadline - self.settings.grace_s
            self._kept.append(sb)
        return sb

    async def _keep(self) -> None:
        interval = self.settings.grace_s / 4  # a refresh well before half the grace is left
        while True:
            self._kept = [sb for sb in self._kept if not sb.closed]
            self.keeper.refresh(self._kept)
            await asyncio.sleep(interval)

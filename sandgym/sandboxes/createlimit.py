"""Creation limits shared by every process on a host: a creation rate and a cap on sandboxes
being started at once, per backend, whatever the number of server processes.

A pool's own `create_rate_per_s` and `max_concurrent_creates` bound one pool; a fleet of
servers on one host (or several hosts on one E2B account) needs one bound for all of them, or
it exceeds what the engine or the provider takes (E2B's creations per second, Modal's). The
state lives in files under one directory (`CreateLimitSettings.directory`, default
`/tmp/sandgym-create-limits`), guarded by `flock`, so a process that dies holding a slot or
the bucket's lock releases it with its file descriptors (no stale state to clean):

- the cap: `<backend>.slot.<i>` for i < `max_starting`; a creation holds an exclusive lock on one
  of them from before `backend.create` until it returns;
- the rate: `<backend>.bucket` holds a token bucket (tokens, unix time of the last update); a
  creation takes a token under the file's lock, or waits until one accrues.

Across hosts (one E2B account used from several machines), point `directory` at a shared file
system whose locks work across machines (NFS v4: Linux maps `flock` onto its byte-range locks);
the bucket compares wall clocks, so the hosts' clocks must agree (NTP). Not tested here: there
is one host. Every process must be given the same numbers: each one applies its own.

The waiting is counted (`stats()`: waits, seconds waited, waiting now), and the pool reports it
in its snapshot, which `/metrics` exports as `sandgym_pool_create_limits_*`.

Every creation, not only the pool's: one limiter per backend name serves the whole process
(`shared_limiter`). A pool made with limits registers its limiter there while it lives; without
a pool (`sandgym tasks check`, a benchmark) the limits come from `SANDGYM_CREATE_LIMITS` (JSON,
`{"docker": {"max_starting": 2}}`, the same shape as the server's `create_limits`). Sandboxes
made outside the pool (a separate or pristine verifier's, `tasks check`'s: they all go through
`sandgym.sandboxes.lifetime.OwnLifetimes.create`) and a docker sandbox's private verifier
container each hold a slot and take a token (`creating`); a compose service is started inside
its sandbox's creation, under the slot that creation holds, and takes a token of its own
(`take_token`): a group of N services is one creation for the cap and 1 + N for the rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

#: where the shared state lives unless configured (per host: /tmp is not shared)
DEFAULT_DIRECTORY = Path(os.environ.get("SANDGYM_CREATE_LIMIT_DIR", "/tmp/sandgym-create-limits"))

#: the limits of a process without a pool: JSON, backend name -> `CreateLimitSettings`
LIMITS_ENV = "SANDGYM_CREATE_LIMITS"

#: how often a creation waiting for a slot looks again (no event crosses processes)
SLOT_POLL_S = 0.05


class CreateLimitSettings(BaseModel):
    """One backend's creation limits, shared by every process using the same `directory`."""

    model_config = ConfigDict(extra="forbid")

    rate_per_s: float | None = Field(
        default=None, gt=0, description="sandbox creations per second, all processes together"
    )
    burst: int = Field(default=1, ge=1, description="creations allowed back to back")
    max_starting: int | None = Field(
        default=None, ge=1, description="sandboxes being created at once, all processes together"
    )
    directory: Path = Field(
        default=DEFAULT_DIRECTORY,
        description="where the shared state lives: a local directory shares a host; a shared "
        "file system with working locks shares hosts",
    )

    @property
    def active(self) -> bool:
        return self.rate_per_s is not None or self.max_starting is not None


def _safe(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"expected a backend name of letters, digits, '_', '.', '-', got {name!r}")
    return name


class CreateLimitStats(BaseModel):
    """What the pool's snapshot (and `/metrics`) shows of the host-wide creation limits."""

    model_config = ConfigDict(extra="forbid")

    rate_per_s: float = Field(description="the creation rate limit; 0 = none")
    max_starting: int = Field(description="the cap on sandboxes being started; 0 = none")
    waits: int = Field(description="creations that had to wait (for a slot or a token)")
    wait_seconds: float = Field(description="seconds they waited, in all")
    waiting: int = Field(description="creations waiting now (this process)")
    starting: int = Field(description="creations holding a slot now (this process)")


class HostCreateLimiter:
    """The shared limits of one backend (see the module docstring); `async with starting():`
    around a creation."""

    def __init__(self, backend: str, settings: CreateLimitSettings) -> None:
        self.backend = _safe(backend)
        self.settings = settings
        self.directory = Path(settings.directory)
        self.waits = 0  # creations that had to wait (for a slot or a token)
        self.wait_s = 0.0  # seconds they waited, in all
        self.waiting = 0  # creations waiting now (this process)
        self.started_now = 0  # creations holding a slot now (this process)
        # Slots this process holds: where `flock` becomes a per-process POSIX lock (NFS), a
        # second lock by the same process would succeed, so this process skips its own.
        self._held: set[int] = set()
        self._held_lock = threading.Lock()
        self._bucket_lock = threading.Lock()
        self.last_grant: float | None = None
        self.granted = 0  # creations let through (a slot held and a token taken), in all
        self.tokens_taken = 0  # tokens taken (creations, and the services inside them)

    # -- the cap ---------------------------------------------------------------------------
    def _try_slot(self) -> tuple[int, IO[bytes]] | None:
        """(Thread) lock a free slot file: (index, open file), or None when all are taken."""
        assert self.settings.max_starting is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        for i in range(self.settings.max_starting):
            with self._held_lock:
                if i in self._held:
                    continue
                f = open(self.directory / f"{self.backend}.slot.{i}", "ab")  # noqa: SIM115
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                except BaseException:
                    f.close()
                    raise
                self._held.add(i)
                return i, f
        return None

    def _free_slot(self, slot: tuple[int, IO[bytes]]) -> None:
        i, f = slot
        with self._held_lock:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            finally:
                f.close()
                self._held.discard(i)

    # -- the rate --------------------------------------------------------------------------
    def _take_token(self) -> float:
        """(Thread) take a token from the shared bucket: 0.0, or the seconds until one accrues
        (nothing taken then). `last_grant` is the unix time of the last token taken, read
        under the bucket's lock."""
        rate = self.settings.rate_per_s
        assert rate is not None
        burst = float(self.settings.burst)
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._bucket_lock, open(self.directory / f"{self.backend}.bucket", "a+") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                f.seek(0)
                now = time.time()
                try:
                    tokens_s, last_s = f.read().split()
                    tokens, last = float(tokens_s), float(last_s)
                except ValueError:  # new (or torn by a crash mid-write): a full bucket
                    tokens, last = burst, now
                tokens = min(burst, tokens + max(0.0, now - last) * rate)
                wait = 0.0
                if tokens >= 1.0:
                    tokens -= 1.0
                    self.last_grant = now
                    self.tokens_taken += 1
                else:
                    wait = (1.0 - tokens) / rate
                f.seek(0)
                f.truncate()
                f.write(f"{tokens!r} {now!r}\n")
                f.flush()
                return wait
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    # -- both ------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def starting(self) -> AsyncIterator[None]:
        """Hold a slot (when capped) and take a token (when rated) for one creation."""
        s = self.settings
        t0 = time.monotonic()
        waited = False
        slot: tuple[int, IO[bytes]] | None = None
        self.waiting += 1
        try:
            if s.max_starting is not None:
                while True:
                    slot = await asyncio.to_thread(self._try_slot)
                    if slot is not None:
                        break
                    waited = True
                    await asyncio.sleep(SLOT_POLL_S)
            if s.rate_per_s is not None:
                while (wait := await asyncio.to_thread(self._take_token)) > 0:
                    waited = True
                    await asyncio.sleep(wait)
        except BaseException:
            if slot is not None:
                await asyncio.shield(asyncio.to_thread(self._free_slot, slot))
            raise
        finally:
            self.waiting -= 1
            if waited:
                self.waits += 1
                self.wait_s += time.monotonic() - t0
        self.started_now += 1
        self.granted += 1
        try:
            yield
        finally:
            self.started_now -= 1
            if slot is not None:
                await asyncio.shield(asyncio.to_thread(self._free_slot, slot))

    def stats(self) -> CreateLimitStats:
        """What `/metrics` shows: the limits, and this process's waiting."""
        s = self.settings
        return CreateLimitStats(
            rate_per_s=s.rate_per_s or 0.0,
            max_starting=s.max_starting or 0,
            waits=self.waits,
            wait_seconds=round(self.wait_s, 6),
            waiting=self.waiting,
            starting=self.started_now,
        )

    async def take_token(self) -> None:
        """Take one token of the rate (nothing without one): a container started inside a
        creation that already holds its slot (a compose service of a group)."""
        if self.settings.rate_per_s is None:
            return
        t0 = time.monotonic()
        waited = False
        self.waiting += 1
        try:
            while (wait := await asyncio.to_thread(self._take_token)) > 0:
                waited = True
                await asyncio.sleep(wait)
        finally:
            self.waiting -= 1
            if waited:
                self.waits += 1
                self.wait_s += time.monotonic() - t0


class CreateLimitsEnvError(ValueError):
    """`SANDGYM_CREATE_LIMITS` does not hold backend name -> creation limits."""


# -- the process's limiters, one per backend name ----------------------------------------------
_registered: dict[str, HostCreateLimiter] = {}
#: the limiters `SANDGYM_CREATE_LIMITS` made, for the value they were made from
_from_env: dict[tuple[str, str], HostCreateLimiter | None] = {}
_ADAPTER = TypeAdapter(dict[str, CreateLimitSettings])


def limits_from_env(raw: str | None = None) -> dict[str, CreateLimitSettings]:
    """The limits `SANDGYM_CREATE_LIMITS` names (none when unset or empty)."""
    raw = os.environ.get(LIMITS_ENV, "") if raw is None else raw
    if not raw.strip():
        return {}
    try:
        return _ADAPTER.validate_python(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        raise CreateLimitsEnvError(
            f"{LIMITS_ENV}: expected JSON of backend name -> limits such as "
            f'{{"docker": {{"max_starting": 2, "rate_per_s": 5}}}}, found {raw!r} ({exc})'
        ) from None


def register(backend: str, settings: CreateLimitSettings) -> HostCreateLimiter:
    """Make a limiter with `settings` the process's limiter of `backend` (a pool does, while it
    lives) and return it; `unregister` undoes it."""
    limiter = HostCreateLimiter(backend, settings)
    _registered[limiter.backend] = limiter
    return limiter


def unregister(limiter: HostCreateLimiter) -> None:
    """Drop `limiter` from the process's limiters, if it is still the registered one."""
    if _registered.get(limiter.backend) is limiter:
        del _registered[limiter.backend]


def shared_limiter(backend: str) -> HostCreateLimiter | None:
    """The process's limiter of `backend`: the registered one (a pool's), else the one
    `SANDGYM_CREATE_LIMITS` configures (made once), else None (no limits)."""
    if backend in _registered:
        return _registered[backend]
    raw = os.environ.get(LIMITS_ENV, "")
    if (backend, raw) not in _from_env:
        settings = limits_from_env(raw).get(backend)
        limiter = None
        if settings is not None and settings.active:
            limiter = HostCreateLimiter(backend, settings)
        _from_env[(backend, raw)] = limiter
    return _from_env[(backend, raw)]


def creating(backend: str) -> contextlib.AbstractAsyncContextManager[None]:
    """The limits of `backend` around one creation (a slot and a token; nothing without
    limits): `async with creating(backend.name): await backend.create(spec)`."""
    limiter = shared_limiter(backend)
    if limiter is None:
        return contextlib.nullcontext()
    return limiter.starting()


async def take_token(backend: str) -> None:
    """One token of `backend`'s rate, for a container started inside a creation (nothing
    without a rate)."""
    limiter = shared_limiter(backend)
    if limiter is not None:
        await limiter.take_token()

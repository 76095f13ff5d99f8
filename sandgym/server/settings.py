"""`ServerSettings`: the env server's configuration, read from `SANDGYM_*` environment variables.

Every field can be set as `SANDGYM_<FIELD>` (e.g. `SANDGYM_PORT=9000`,
`SANDGYM_TASK_DIRS='["./my-tasks"]'`, `SANDGYM_IMAGE_MAP='{"ubuntu:22.04":"sandgym/terminal"}'`)
or passed to the constructor; `sandgym serve` flags override both.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandgym.sandboxes.createlimit import CreateLimitSettings
from sandgym.sandboxes.network import parse_policy

if TYPE_CHECKING:
    from sandgym.sandboxes.network import NetworkPolicy


class ServerSettings(BaseSettings):
    """Configuration of one env server process."""

    model_config = SettingsConfigDict(env_prefix="SANDGYM_", extra="forbid")

    host: str = Field("127.0.0.1", description="interface to listen on")
    port: int = Field(8765, ge=0, le=65535, description="TCP port (0 = any free port)")
    backend: str = Field("local", description="sandbox backend: local, docker, e2b or null")
    backend_options: dict[str, object] = Field(
        default_factory=dict, description="keyword arguments for the backend's constructor"
    )
    pool_size: int = Field(
        0, ge=0, description="ready sandboxes kept per task environment (0 = create on demand)"
    )
    pool_max_total: int = Field(64, ge=1, description="ready sandboxes kept across all specs")
    pool_max_concurrent_creates: int | None = Field(
        None,
        ge=1,
        description="sandbox creations run at once by the pool (both APIs); None: the backend's "
        "default (`default_concurrent_creates`: local 32, docker 8, others 4)",
    )
    task_dirs: list[Path] = Field(
        default_factory=list, description="extra task directories (the catalog is always served)"
    )
    include_builtin: bool = Field(True, description="serve the built-in catalog (builtin/*)")
    image_map: dict[str, str] = Field(
        default_factory=dict, description="task image name -> image to use instead"
    )
    token: str | None = Field(None, description="bearer token required on all but /healthz")
    group_ttl_s: float = Field(
        600.0,
        gt=0,
        description="a group (reset.options.group) whose members did not all come is removed "
        "(with its snapshot) this long after its first reset, once none of them is live",
    )
    network_ceiling: str | None = Field(
        None,
        description="the most open network any episode phase gets: 'no-network', "
        "'allowlist:HOST,...' or 'public' (None: each task's own policy); reported in info.network",
    )
    max_sessions: int = Field(
        1024,
        ge=1,
        description="ONE limit shared by both APIs: live episodes (episode API) plus sandboxes "
        "(sandbox API) held or being made, at most this many (else `capacity`); the default lets "
        "a host hold a thousand where its memory allows (min_available_memory_mb guards that)",
    )
    min_available_memory_mb: float | None = Field(
        1024.0,
        ge=0,
        description="a new sandbox (either API) is refused with `capacity` (HostMemoryError) "
        "while the host has less memory available than this (MemAvailable), before it swaps; "
        "None: no floor",
    )
    openenv_max_concurrent_envs: int | None = Field(
        None,
        ge=1,
        description="OpenEnv wire sockets (/openenv/ws) open at once, OpenEnv's "
        "max_concurrent_envs (None: max_sessions); beyond it a socket gets CAPACITY_REACHED",
    )
    max_steps: int = Field(
        200, ge=1, description="steps per episode before `truncated: true` (submit excluded)"
    )
    episode_time_limit_s: float = Field(
        3600.0, gt=0, description="wall time per episode before `truncated: true`"
    )
    idle_timeout_s: float = Field(
        600.0, gt=0, description="an episode with no request for this long is ended"
    )
    resume_grace_s: float = Field(
        60.0, ge=0, description="a dropped connection's episode is kept this long for `resume`"
    )
    verify: Literal["shared", "pristine", "refuse-tampered"] | None = Field(
        None,
        description="how episodes are verified unless a reset asks otherwise (None: each task's "
        "own `metadata.verify`, else `shared`); docs/verification.md",
    )
    verifier_stop_agent_processes: bool = Field(
        False,
        description="on backends without a private verifier (e2b; local and docker keep the "
        "verifier out of the agent's reach and ignore this): kill every process the agent left "
        "running before the tests run, so none can race the reward file; breaks tasks whose "
        "tests need a service the agent started",
    )
    max_message_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="larger client frames get `invalid_message`"
    )
    ws_impl: str = Field(
        "sandgym",
        description="websocket implementation: sandgym (uvicorn's websockets-sansio with a short "
        "path for whole data frames, sandgym/server/fastws.py: the least server CPU per step measured "
        "here), or one of uvicorn's: websockets-sansio, websockets, wsproto",
    )
    ws_per_message_deflate: bool = Field(
        False,
        description="offer permessage-deflate to clients (off: frames are small JSON, and "
        "compressing them cost ~5% of server CPU per step measured here)",
    )
    event_loop: str = Field(
        "auto",
        description="event loop: auto (uvloop when installed, else asyncio), uvloop, asyncio",
    )
    gc_gen0_threshold: int | None = Field(
        10_000,
        ge=700,
        description="`sandgym serve` only: the cyclic garbage collector's first threshold, "
        "raised from Python's 700 (every request allocates models, dicts, futures and a task; "
        "with 700 the collector ran every few requests), with startup objects frozen. Since "
        "connections and refused messages leave no reference cycles, 50000 and 100000 keep the "
        "fuzz test's RSS flat too (0.4-7 MiB) but were no faster than 10000 (server CPU per "
        "step 81-89 us against 84-86 in 4 alternating runs). None leaves the collector as "
        "Python sets it",
    )
    ping_interval_s: float | None = Field(
        20.0, description="websocket keepalive ping interval (None = no pings)"
    )
    ping_timeout_s: float | None = Field(20.0, description="seconds to wait for a pong")
    default_action_timeout_s: float = Field(
        60.0, gt=0, description="timeout of a command action that names none"
    )
    max_action_timeout_s: float = Field(
        1800.0, gt=0, description="a command action's timeout_s is capped at this"
    )
    max_output_bytes: int = Field(
        256 * 1024, ge=1024, description="an observation's output is cut to this many bytes"
    )
    sandbox_grace_s: float | None = Field(
        300.0,
        ge=5.0,
        description="every sandbox carries a deadline after which it ends itself, without any "
        "server (docker, local: its own init; e2b: E2B's timeout): this long after the server's "
        "last refresh, or at the end of its episode's limits if later; None: no deadline "
        "(docs/operations.md)",
    )
    cost_ledger: bool = Field(
        True,
        description="at each episode's end, read its sandbox's usage (CPU, peak memory, bytes "
        "written) and send the episode's cost ledger as info.cost (sandgym/server/cost.py)",
    )
    create_limits: dict[str, CreateLimitSettings] = Field(
        default_factory=dict,
        description="per backend name: a creation rate and a cap on sandboxes being started, "
        "shared by every server process on the host (or, with a shared directory, hosts), e.g. "
        '{"e2b": {"rate_per_s": 2, "max_starting": 8}} (docs/operations.md)',
    )
    reap_on_start: bool = Field(
        True, description="at startup, remove sandboxes a crashed server left (owner gone)"
    )
    sweep_interval_s: float = Field(
        1.0, gt=0, description="how often idle and abandoned episodes are looked for"
    )

    @field_validator("network_ceiling")
    @classmethod
    def _check_ceiling(cls, value: str | None) -> str | None:
        if value:
            parse_policy(value)  # ValueError says what was expected
        return value or None

    def network_ceiling_policy(self) -> NetworkPolicy | None:
        return parse_policy(self.network_ceiling) if self.network_ceiling else None

    @field_validator("sandbox_grace_s", "min_available_memory_mb", mode="before")
    @classmethod
    def _grace_off(cls, value: object) -> object:
        # `SANDGYM_SANDBOX_GRACE_S=off` (or empty, none, null): no deadlines; the same for
        # `SANDGYM_MIN_AVAILABLE_MEMORY_MB` (no memory floor)
        if isinstance(value, str) and value.strip().lower() in ("", "off", "none", "null"):
            return None
        return value

    @field_validator("token")
    @classmethod
    def _empty_token_is_none(cls, value: str | None) -> str | None:
        # `SANDGYM_TOKEN=` (as compose passes an unset variable) means "no token", not "".
        return value or None

"""The pool's settings: how it sizes, paces and guards sandbox creation (`PoolSettings`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandgym.sandboxes.createlimit import CreateLimitSettings
from sandgym.sandboxes.lifetime import LifetimeSettings


class PoolSettings(BaseModel):
    """How the warm pool sizes, paces and guards sandbox creation."""

    model_config = ConfigDict(extra="forbid")

    min_ready: int = Field(
        default=0, ge=0, description="ready sandboxes kept per key while the key is in demand"
    )
    max_total: int = Field(
        default=32,
        ge=1,
        description="global cap on sandboxes held: ready + creating + leased + being destroyed",
    )
    max_concurrent_creates: int = Field(
        default=4, ge=1, description="backend.create() calls allowed to run at the same time"
    )
    create_rate_per_s: float | None = Field(
        default=None,
        gt=0,
        description="token-bucket rate of backend.create() calls; None = unlimited",
    )
    create_burst: int = Field(
        default=1, ge=1, description="token-bucket capacity: creations allowed back to back"
    )
    max_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="a ready sandbox older than this is destroyed (and replaced)",
    )
    acquire_timeout_s: float = Field(
        default=120.0, gt=0, description="default time acquire() waits before PoolTimeoutError"
    )
    create_retries: int = Field(
        default=2, ge=0, description="extra attempts after a failed creation before giving up"
    )
    create_backoff_s: float = Field(
        default=0.5, ge=0, description="backoff before the first retry; doubles on each retry"
    )
    create_backoff_max_s: float = Field(
        default=10.0, ge=0, description="upper bound of the backoff"
    )
    failing_after: int = Field(
        default=3,
        ge=1,
        description="consecutive failed creations after which a key is marked failing",
    )
    failing_cooldown_s: float = Field(
        default=30.0,
        ge=0,
        description="how long a failing key fails fast before creation is retried",
    )
    demand_window_s: float = Field(
        default=300.0,
        ge=0,
        description="a key acquired or prewarmed within this window is kept at its target",
    )
    health_check: bool = Field(
        default=True, description="check a ready sandbox with is_alive() before handing it out"
    )
    health_check_timeout_s: float = Field(
        default=5.0, gt=0, description="an is_alive() check slower than this counts as dead"
    )
    destroy_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a sandbox close() slower than this is abandoned to the reaper",
    )
    close_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="close() waits this long for in-flight creations, then cancels",
    )
    maintenance_interval_s: float = Field(
        default=1.0, gt=0, description="period of the background loop (idle recycling, refill)"
    )
    latency_window: int = Field(
        default=10_000, ge=10, description="recent acquire latencies kept for the p50/p99 figures"
    )
    sweep_interval_s: float | None = Field(
        default=60.0,
        gt=0,
        description="period of the sweep that removes sandboxes labelled with this pool's owner "
        "id that the pool does not hold (creations whose answer was lost); None = no sweep",
    )
    sweep_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="an untracked sandbox is removed no sooner than this after a sweep first "
        "saw it (and only once every creation in flight then has ended)",
    )
    host_limits: CreateLimitSettings | None = Field(
        default=None,
        description="a creation rate and a cap on sandboxes being started, shared with every "
        "other process on the host using the same directory (sandgym.sandboxes.createlimit)",
    )
    min_available_memory_mb: float | None = Field(
        default=None,
        ge=0,
        description="refuse a creation (HostMemoryError) while the host has less memory "
        "available than this (MemAvailable, /proc/meminfo), so the host never swaps; None: no "
        "floor",
    )
    lifetime: LifetimeSettings = Field(
        default_factory=LifetimeSettings,
        description="deadlines after which the started pool's sandboxes end themselves, moved "
        "on while the pool lives (sandgym.sandboxes.lifetime)",
    )

    @model_validator(mode="after")
    def _check(self) -> PoolSettings:
        if self.create_backoff_max_s < self.create_backoff_s:
            raise ValueError(
                f"create_backoff_max_s ({self.create_backoff_max_s}) must be >= "
                f"create_backoff_s ({self.create_backoff_s})"
            )
        return self

"""The hard lifetime of the services beside a docker sandbox (`sandboxes.lifetime`): each ends by
its sandbox's deadline, with no server running.

A group's services (`sandboxes.docker.group`) are the task authors' containers, not ours, so the
sandbox's own init cannot run in them. When the sandbox has a deadline, each service's own
argv (the compose file's entrypoint and command, else the image's ENTRYPOINT and CMD, combined
as the engine combines them: `service_argv`) runs as the child of a small pid-1 init,
`SERVICE_INIT` under the image's `/bin/sh`, the way `docker run --init` runs it under tini. Beside
it a watcher reads the deadline from `/run/sandgym-life/deadline` (a read-only bind of
`<bridge dir>/life`, which the host side writes with the main container's deadline) once a
second; past it, the watcher sends SIGTERM to every process in the container, SIGKILL 10 s
later, and the init then exits with the service's status: the container stops (and stays, for
the reaper, as the main container does).

What differs from the container as written: the service is pid 2, not pid 1 (as under
`docker run --init`); `docker stop` reaches it only as the final SIGKILL (the init, a shell
waiting in the foreground, forwards no signal; sandgym never stops a service that way, it removes
it with force). An image without `/bin/sh` cannot run the init: its service runs exactly as
written, without a deadline (`run_plain`; a warning says so). An image without `sleep` or `date`
runs under the init, but its watcher does not start: no deadline either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandboxes.services import ServiceSpec

#: where a service container sees its sandbox's deadline directory (read-only)
LIFE_MOUNT = "/run/sandgym-life"

#: the host directory, inside the sandbox's bridge directory, that holds the services' deadline
LIFE_SUBDIR = "life"

#: A service's pid 1 when its sandbox has a deadline: `sh -c SERVICE_INIT init ARGV...`. The
#: watcher (a background subshell, started only when `sleep` and `date` exist) reads the deadline
#: once a second and, past it, sends SIGTERM to every process but itself and the init, then
#: SIGKILL 10 s later. The service (`"$@"`, the argv the engine would have run) runs in the
#: foreground, so it keeps the signal dispositions it would have had (a background job of a
#: non-interactive shell ignores SIGINT and SIGQUIT) and its exit status is the container's; the
#: `exit` after it keeps the shell from exec'ing it (which would make it pid 1, out of the
#: watcher's reach). The foreground wait reaps adopted orphans too.
SERVICE_INIT = (
    "command -v sleep >/dev/null && command -v date >/dev/null && "
    f"( while :; do sleep 1; read d < {LIFE_MOUNT}/deadline && "
    '[ "$(date +%s)" -gt "$d" ] && { kill -TERM -1; sleep 10; kill -KILL -1; exit 0; }; '
    "done ) >/dev/null 2>&1 &\n"
    '"$@"\n'
    "exit $?"
)


def service_argv(svc: ServiceSpec, image_config: dict[str, Any]) -> list[str]:
    """The argv the engine runs for `svc` from an image whose config is `image_config`: the
    compose entrypoint (an empty one clears the image's), else the image's ENTRYPOINT; then the
    compose command, else the image's CMD, which an entrypoint set by the compose file drops (the
    engine's rule when a container is created with an entrypoint)."""
    if svc.entrypoint:
        return [*svc.entrypoint, *(svc.command or ())]
    entrypoint = list(image_config.get("Entrypoint") or []) if svc.entrypoint is None else []
    command = list(svc.command) if svc.command else list(image_config.get("Cmd") or [])
    return [*entrypoint, *command]


class ServiceRun(BaseModel):
    """How a service container is started: `create_container`'s entrypoint and command, and the
    binds its host config adds."""

    model_config = ConfigDict(frozen=True)

    entrypoint: list[str] | None = Field(description="None: the image's")
    command: list[str] | None = Field(description="None: the image's (unless an entrypoint is set)")
    binds: dict[str, dict[str, str]] = Field(default_factory=dict, description="host dir -> mount")
    wrapped: bool = Field(description="under SERVICE_INIT: it ends by the sandbox's deadline")


def run_plain(svc: ServiceSpec) -> ServiceRun:
    """The service exactly as written: its compose entrypoint and command, else the image's."""
    return ServiceRun(
        entrypoint=list(svc.entrypoint) if svc.entrypoint is not None else None,
        command=list(svc.command) if svc.command is not None else None,
        wrapped=False,
    )


def run_with_deadline(
    svc: ServiceSpec, image_config: dict[str, Any], life_dir: Path | None
) -> ServiceRun:
    """The service under SERVICE_INIT, reading its deadline from `life_dir`; as written when the
    sandbox has no deadline (`life_dir` None) or there is no argv (the engine's own error)."""
    argv = service_argv(svc, image_config)
    if life_dir is None or not argv:
        return run_plain(svc)
    return ServiceRun(
        entrypoint=["/bin/sh", "-c", SERVICE_INIT, "init", *argv],
        command=None,  # with an entrypoint set, the engine adds no CMD of the image's
        binds={str(life_dir): {"bind": LIFE_MOUNT, "mode": "ro"}},
        wrapped=True,
    )


def no_shell(exc: BaseException) -> bool:
    """Whether the engine refused to start a wrapped service because its image has no /bin/sh."""
    text = str(exc).lower()
    return "/bin/sh" in text and ("no such file" in text or "not found" in text)

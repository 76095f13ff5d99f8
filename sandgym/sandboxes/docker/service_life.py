"""The hard lifetime of the services beside a docker sandbox (`sandgym.sandboxes.lifetime`): each ends by
its sandbox's deadline, with no server running.

A group's services (`sandgym.sandboxes.docker.group`) are the task authors' containers, not ours, so the
sandbox's own init cannot run in them. Every service container already runs under Docker's init
(tini, `--init`: the backend's `confinement`), with the service's argv as its child. When the
sandbox has a deadline, that argv (the compose file's entrypoint and command, else the image's
ENTRYPOINT and CMD, combined as the engine combines them: `service_argv`) is handed to
`SERVICE_INIT` under the image's `/bin/sh`, which starts a watcher and then `exec`s the argv: the
service keeps its place (tini's child, pid 2), its signal dispositions, the signals tini
forwards to it (`docker stop`) and its exit status (the container's). The watcher, left as the
service's child, reads the deadline from `/run/sandgym-life/deadline` (a read-only bind of
`<bridge dir>/life`, which the host side writes with the main container's deadline) once a
second; past it, it sends SIGTERM to every process in the container but tini, SIGKILL 10 s
later; tini then exits with the service's status, and the container stops (and stays, for the
reaper, as the main container does).

What differs from the container as written: one more process in it (the watcher, with a `sleep`
and a `date` a second). An image without `/bin/sh` cannot run the wrapper: its service runs
exactly as written, without a deadline (`has_shell` is checked before it starts; a warning
says so). An image without `sleep` or `date` runs the wrapper, which then starts no watcher: no
deadline either.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandgym.sandboxes.services import ServiceSpec

#: where a service container sees its sandbox's deadline directory (read-only)
LIFE_MOUNT = "/run/sandgym-life"

#: the host directory, inside the sandbox's bridge directory, that holds the services' deadline
LIFE_SUBDIR = "life"

#: What a service container runs when its sandbox has a deadline, under Docker's init:
#: `sh -c SERVICE_INIT init ARGV...`. Where `sleep` and `date` exist it starts the watcher (a
#: background subshell that reads the deadline once a second and, past it, sends SIGTERM to every
#: process but tini and itself, then SIGKILL 10 s later), then execs the service's own argv, so
#: the service is tini's child as before and the watcher never exits before the deadline (a
#: service reaping "any child" sees no stranger exit).
SERVICE_INIT = (
    "if command -v sleep >/dev/null && command -v date >/dev/null; then "
    f"( while :; do sleep 1; read d < {LIFE_MOUNT}/deadline && "
    '[ "$(date +%s)" -gt "$d" ] && { kill -TERM -1; sleep 10; kill -KILL -1; exit 0; }; '
    "done ) >/dev/null 2>&1 & fi\n"
    'exec "$@"'
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
    wrapped: bool = Field(description="through SERVICE_INIT: it ends by the sandbox's deadline")


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


def has_shell(api: Any, container_id: str) -> bool:
    """(Thread) whether created container `container_id` holds a `/bin/sh` to run SERVICE_INIT
    (the engine's stat of the path; the archive itself is not read)."""
    import docker.errors

    try:
        chunks, _stat = api.get_archive(container_id, "/bin/sh")
    except docker.errors.NotFound:
        return False
    with contextlib.suppress(Exception):
        chunks.close()
    return True

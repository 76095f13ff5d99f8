"""The hard lifetime of the services beside a docker sandbox (`sandgym.sandboxes.lifetime`): each ends by
its sandbox's deadline, with no server running, whatever the service's own processes do.

A group's services (`sandgym.sandboxes.docker.group`) are the task authors' containers, not ours.
When the sandbox has a deadline, the service's argv (the compose file's entrypoint and command,
else the image's ENTRYPOINT and CMD, combined as the engine combines them: `service_argv`) is
started by sandgym's own deadline keeper, `SERVICE_KEEPER`, which is the container's pid 1 (no
Docker init): `/bin/bash -c SERVICE_KEEPER sandgym-keeper ARGV...`.

- The keeper is the same kind of pid 1 as the sandbox's own (`exec_kill.HELPER_SCRIPT`): bash
  running only builtins once the service is started, never waiting on anything but that one
  child, so the kernel's shield of a namespace's init covers it: SIGSTOP and SIGKILL sent from
  inside never arrive, and the other signals only run its handlers. Once a second it reads the
  deadline (`/run/sandgym-life/deadline`, a read-only bind of `<bridge dir>/life`, which the host
  side writes with the main container's deadline, held as its working directory); past it, it
  sends SIGTERM to every process in the container, waits up to 2 s for the service to end, and
  exits (with the service's status if it ended, 143 when SIGTERM ended it; else 137), which makes
  the kernel kill whatever is left: the container stops (and stays, for
  the reaper, as the main container does). A service's root process that stops or kills every
  other process (`kill -STOP -1`, `kill -KILL -1`) or replaces /bin/bash on disk cannot hold it.
- The service runs as the keeper's child (pid 2 or so), forked before anything else: with the
  container's environment, working directory and user (bash adds `PWD` and `SHLVL=1` to the
  environment, as a shell entrypoint does), every signal at its default disposition (not the
  `SIGINT`/`SIGQUIT` ignore bash gives a background job). The keeper forwards HUP, INT,
  QUIT, TERM, USR1, USR2 and WINCH to it (so `docker stop` ends the service as it would under
  Docker's init) and exits with its status when it ends. Bash reaps every child that ends,
  orphans adopted by pid 1 included.

Images without `/bin/bash` (checked on the created container, `has_bash`) get the same keeper
under the server host's static bash (`static_bash`: `SANDGYM_STATIC_BASH`, else Debian's
`bash-static`), copied into the created container at STATIC_BASH_IN before it starts (a copy,
not a bind: the engine may be on another host). Where the host has none they keep the older,
weaker form: Docker's init (tini) runs `/bin/sh -c SERVICE_INIT init ARGV...`, which starts a
watcher subshell and then `exec`s the argv; a root process of the service can stop or kill that
watcher (it is an ordinary process), and then the service outlives its deadline until the
server or the reaper removes it. An image without `/bin/sh` either runs exactly as written,
without a deadline (a warning says so); so does one without `sleep` or `date` under
SERVICE_INIT.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandgym.sandboxes.main_process import engine_argv
from sandgym.sandboxes.services import ServiceSpec

log = logging.getLogger(__name__)

#: where a service container sees its sandbox's deadline directory (read-only)
LIFE_MOUNT = "/run/sandgym-life"

#: the host directory, inside the sandbox's bridge directory, that holds the services' deadline
LIFE_SUBDIR = "life"

#: pid 1 of a service container whose image has bash, when its sandbox has a deadline (see the
#: module docstring): `/bin/bash -c SERVICE_KEEPER sandgym-keeper ARGV...`. `f` forwards a signal
#: to the service; every trap is a handler, not an ignore, and the service is forked as a
#: subshell, which resets trapped signals to their defaults (a plain `"$@" &` would start it with
#: SIGINT and SIGQUIT ignored, as bash does for a background job: seen; `trap -` says it again). It
#: sleeps with `read -t` on a pipe it holds both ends of: no fork, nothing on disk.
SERVICE_KEEPER = (
    'f() { [[ -n $c ]] && kill -s "$1" "$c" 2>/dev/null; }; '
    'for s in HUP INT QUIT TERM USR1 USR2 WINCH; do trap "f $s" "$s"; done; '
    "trap : PIPE ALRM VTALRM PROF XCPU XFSZ TSTP TTIN TTOU; "
    '(trap - INT QUIT; exec "$@") & c=$!; '
    "cd %s 2>/dev/null || cd /; exec 3<> <(:)\n"
    "while :; do read -t 1 -u 3; "
    'kill -0 "$c" 2>/dev/null || { wait "$c"; exit; }; '
    "printf -v n '%%(%%s)T' -1; "
    "if read -r d 2>/dev/null < deadline && [[ $d =~ ^[0-9]+$ ]] && ((n > d)); then "
    "kill -TERM -1 2>/dev/null; for i in 1 2 3 4 5 6 7 8 9 10; do read -t 0.2 -u 3; "
    'kill -0 "$c" 2>/dev/null || break; done; '
    'kill -0 "$c" 2>/dev/null || { wait "$c"; exit; }; exit 137; fi; done'
) % LIFE_MOUNT

#: The weaker form, for an image without bash, under Docker's init:
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
    engine's rule when a container is created with an entrypoint: `main_process.engine_argv`)."""
    return engine_argv(svc.entrypoint, svc.command, image_config)


#: how a service container keeps its sandbox's deadline: `keeper` (SERVICE_KEEPER is pid 1, under
#: the image's /bin/bash), `static_keeper` (the same under the host's static bash, copied into a
#: bash-less container: `static_bash`), `watcher` (tini, SERVICE_INIT), `none` (as written)
DeadlineForm = Literal["keeper", "static_keeper", "watcher", "none"]

#: where a bash-less service container gets the host's static bash (copied in before it starts)
STATIC_BASH_IN = "/run/sandgym-keeper/bash"

#: the environment variable naming a static bash on the server's host (else STATIC_BASH_PATHS)
STATIC_BASH_ENV = "SANDGYM_STATIC_BASH"

#: where Debian's `bash-static` package puts it
STATIC_BASH_PATHS = ("/bin/bash-static", "/usr/bin/bash-static")


def is_static_elf(data: bytes) -> bool:
    """Whether `data` (a file's first 64 KiB at least) is a 64-bit little-endian ELF executable
    with no program interpreter (PT_INTERP): it needs no library of the container's."""
    import struct

    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 4 > len(data):
            return False
        if struct.unpack_from("<I", data, at)[0] == 3:  # PT_INTERP: dynamically linked
            return False
    return True


def static_bash() -> Path | None:
    """The server host's static bash (`SANDGYM_STATIC_BASH`, else Debian's `bash-static`), or
    None when there is none; ValueError when the variable names a file that is not a static
    ELF executable."""
    import os

    named = os.environ.get(STATIC_BASH_ENV)
    for candidate in [named] if named else STATIC_BASH_PATHS:
        path = Path(candidate)
        if not path.is_file():
            if named:
                raise ValueError(
                    f"{STATIC_BASH_ENV}: expected a static bash, found no file {named}"
                )
            continue
        with path.open("rb") as f:
            head = f.read(65536)
        if is_static_elf(head):
            return path
        if named:
            raise ValueError(
                f"{STATIC_BASH_ENV}: expected a statically linked 64-bit ELF executable, "
                f"found {named}, which is not one"
            )
    return None


def usable_static_bash() -> Path | None:
    """`static_bash()`, with a misnamed `SANDGYM_STATIC_BASH` logged (as a warning naming what
    it found) and treated as none: a container is not refused for it, it keeps the weaker form."""
    try:
        return static_bash()
    except ValueError as exc:
        log.warning("%s; bash-less containers keep the deadline without it", exc)
        return None


def static_bash_tar(path: Path) -> bytes:
    """A tar holding `path` as STATIC_BASH_IN (relative to /, with its directories), mode 0755,
    for put_archive into a created container."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        parts = STATIC_BASH_IN.strip("/").split("/")
        for i in range(1, len(parts)):
            d = tarfile.TarInfo("/".join(parts[:i]))
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(d)
        data = path.read_bytes()
        f = tarfile.TarInfo("/".join(parts))
        f.size, f.mode = len(data), 0o755
        tar.addfile(f, io.BytesIO(data))
    return buf.getvalue()


class ServiceRun(BaseModel):
    """How a service container is started: `create_container`'s entrypoint and command, the
    binds its host config adds, and whether Docker's init runs above it."""

    model_config = ConfigDict(frozen=True)

    entrypoint: list[str] | None = Field(description="None: the image's")
    command: list[str] | None = Field(description="None: the image's (unless an entrypoint is set)")
    binds: dict[str, dict[str, str]] = Field(default_factory=dict, description="host dir -> mount")
    form: DeadlineForm = Field(description="how it ends by the sandbox's deadline")
    docker_init: bool = Field(True, description="Docker's init (tini) as pid 1")

    @property
    def wrapped(self) -> bool:
        """Whether it ends by the sandbox's deadline (keeper or watcher)."""
        return self.form != "none"


def run_plain(svc: ServiceSpec) -> ServiceRun:
    """The service exactly as written: its compose entrypoint and command, else the image's."""
    return ServiceRun(
        entrypoint=list(svc.entrypoint) if svc.entrypoint is not None else None,
        command=list(svc.command) if svc.command is not None else None,
        form="none",
    )


def run_with_deadline(
    svc: ServiceSpec,
    image_config: dict[str, Any],
    life_dir: Path | None,
    form: DeadlineForm = "keeper",
) -> ServiceRun:
    """The service under SERVICE_KEEPER as pid 1 (`form` "keeper", for an image with
    /bin/bash) or under tini and SERVICE_INIT ("watcher"), reading its deadline from `life_dir`;
    as written when the sandbox has no deadline (`life_dir` None), `form` is "none", or there is
    no argv (the engine's own error)."""
    argv = service_argv(svc, image_config)
    if life_dir is None or not argv or form == "none":
        return run_plain(svc)
    binds = {str(life_dir): {"bind": LIFE_MOUNT, "mode": "ro"}}
    # with an entrypoint set, the engine adds no CMD of the image's (command None)
    if form in ("keeper", "static_keeper"):
        bash = "/bin/bash" if form == "keeper" else STATIC_BASH_IN
        return ServiceRun(
            entrypoint=[bash, "-c", SERVICE_KEEPER, "sandgym-keeper", *argv],
            command=None,
            binds=binds,
            form=form,
            docker_init=False,
        )
    return ServiceRun(
        entrypoint=["/bin/sh", "-c", SERVICE_INIT, "init", *argv],
        command=None,
        binds=binds,
        form="watcher",
    )


def has_file(api: Any, container_id: str, path: str) -> bool:
    """(Thread) whether created container `container_id` holds `path` (the engine's stat of it,
    symlinked directories above it followed; the archive itself is not read)."""
    import docker.errors

    try:
        chunks, _stat = api.get_archive(container_id, path)
    except docker.errors.NotFound:
        return False
    with contextlib.suppress(Exception):
        chunks.close()
    return True


def has_shell(api: Any, container_id: str) -> bool:
    """(Thread) whether created container `container_id` holds a `/bin/sh` to run SERVICE_INIT."""
    return has_file(api, container_id, "/bin/sh")


def has_bash(api: Any, container_id: str) -> bool:
    """(Thread) whether created container `container_id` holds a `/bin/bash` to run
    SERVICE_KEEPER."""
    return has_file(api, container_id, "/bin/bash")


def give_static_bash(api: Any, container_id: str) -> bool:
    """(Thread) copy the host's static bash into created (not started) container `container_id`
    at STATIC_BASH_IN when its image has no /bin/bash and the host has one (the main container's
    MAIN_INIT then runs its pid 1 with it); whether it did."""
    host_bash = usable_static_bash()
    if host_bash is None or has_bash(api, container_id):
        return False
    api.put_archive(container_id, "/", static_bash_tar(host_bash))
    return True

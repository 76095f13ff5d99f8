"""Commands in a Docker sandbox, and killing what they leave.

`exec` uses the low-level exec API and reads the multiplexed stream itself (`streams`), so output
is capped while it streams. Each exec carries a unique `SANDGYM_EXEC_ID` in its environment; on
timeout every process that still carries it is stopped and killed, by a `docker exec`ed killer and
by the container's pid 1, which is also the kill helper (`HELPER_SCRIPT`): it needs no new pid and so
still works when a fork bomb fills the pids limit. The same pid 1 keeps the sandbox's deadline, where
no process inside can stop it (see HELPER_SCRIPT). If leftovers of earlier execs exhaust the pids
limit, the next exec kills them and retries once."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
import time
import uuid
from typing import Any

from sandgym.sandboxes.common.files import files_tar
from sandgym.sandboxes.common.kill import (
    EXEC_MARKER_ENV,
    kill_marked_bash_script,
    kill_marked_script,
)
from sandgym.sandboxes.common.output import CappedBuffer
from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.common.users import is_root_user
from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.docker.names import BRIDGE_MOUNT
from sandgym.sandboxes.docker.service_life import STATIC_BASH_IN
from sandgym.sandboxes.docker.streams import _demux, _raw_socket
from sandgym.sandboxes.errors import SandboxError
from sandgym.sandboxes.main_process import HARBOR_MAIN_COMMAND as HARBOR_MAIN_COMMAND
from sandgym.sandboxes.main_process import main_argv
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.spec import ExecResult, SandboxSpec

log = logging.getLogger(__name__)


#: Where the in-container kill helper looks for requests (one file per exec marker). Not under
#: /run/sandgym: that is the bridge directory, bind-mounted read-only, where `mkdir` failed and
#: the helper fell back to `sleep infinity` (seen: no helper ran in any sandbox).
HELPER_DIR = "/run/sandgym-helper/kill"

#: In the bridge directory (bind-mounted read-only, BRIDGE_MOUNT), the sandbox's deadline
#: (`sandgym.sandboxes.lifetime`) lies: the host side writes it and the agent cannot.
DEADLINE_PATH = BRIDGE_MOUNT + "/deadline"

#: where pid 1 writes the exit status of the image's ENTRYPOINT once it has ended (see
#: HELPER_SCRIPT); absent while it runs, or when the image has none
ENTRYPOINT_EXIT_PATH = "/run/sandgym-helper/entrypoint-exit"

#: the signals pid 1 ignores (and the entrypoint it starts gets back at their defaults)
_SIGNALS = "HUP INT QUIT TERM USR1 USR2 ALRM PIPE VTALRM PROF XCPU XFSZ TSTP TTIN TTOU"


#: The container's pid 1 when the image has bash (MAIN_INIT execs it): one bash loop that keeps
#: the deadline and is the kill helper, and forks nothing once started. The kernel shields a
#: namespace's pid 1 from the signals sent inside it (SIGKILL and SIGSTOP never arrive, others
#: only when it has a handler, and it ignores the terminating ones), so no process in the
#: sandbox, root with CAP_KILL included, can stop or kill it; it waits on no child, so stopping
#: or killing any other process cannot block it; it runs from memory, so replacing /bin/bash or
#: /bin/sh on disk changes nothing; it needs no new pid, page of disk or fork, so a fork bomb at
#: the pids limit or a full disk leaves it running (a memory hog is the OOM killer's to end; if
#: it ever picked pid 1, the container would end, which is the deadline's own outcome).
#:
#: - Deadline: it holds the read-only bridge directory as its working directory (so renaming
#:   /run or building a fake /run/sandgym elsewhere moves nothing under it) and, once a second,
#:   reads `deadline` there with builtins (`printf '%(%s)T'` for the time); past it, it exits,
#:   which ends the container. The check also runs between every step of a kill request, so
#:   request files or processes the agent piles up cannot hold it past a second or so.
#: - Kill helper: every 0.2 s it looks for non-empty files in HELPER_DIR, named by an exec's
#:   marker, kills the processes carrying that marker and truncates the file. Requests arrive
#:   through put_archive, which needs no process inside the container, so a timed-out command is
#:   killed even when a fork bomb holds every pid the pids limit allows and no `docker exec` can
#:   start. (As root without CAP_SYS_PTRACE it cannot read other users' environments; execs run
#:   as another user rely on the exec-based killer.)
#: - Init: bash reaps any child that ends, orphans adopted by pid 1 included (its SIGCHLD
#:   handler waits for any pid); a SIGCHLD sent from inside only wakes its sleep early.
#: It sleeps with `read -t` on a pipe it holds both ends of (`3<> <(:)`): nothing on disk.
#: - The image's ENTRYPOINT (issue 58 item 1): when bash is given arguments (`image_argv`: the
#:   image's ENTRYPOINT followed by Harbor's main command, `sh -c "sleep infinity"`, or what the
#:   task compose file's main `entrypoint:`/`command:` make of them), it forks
#:   them once, first, before it moves to the bridge directory: the child has the container's
#:   environment, working directory and user, every signal at its default disposition (the
#:   subshell's `trap -`, as `service_life.SERVICE_KEEPER` starts a service), and its output goes
#:   to the container's log. Its processes are ordinary ones: the deadline's exit ends them with
#:   the container. When it ends, pid 1 writes its status to ENTRYPOINT_EXIT_PATH and a line to
#:   the container's log, and goes on (checked with `kill -0`, never a blocking `wait`): the
#:   sandbox outlives its entrypoint (see `docs/harbor_compat.md`).
HELPER_SCRIPT = (
    "trap '' %s; "
    '(($#)) && { (trap - %s; exec "$@") & ep=$!; }; '
    "cd %s 2>/dev/null || cd /; exec 3<> <(:); mkdir -p %s 2>/dev/null; t=0; "
    "due() { printf -v n '%%(%%s)T' -1; ((n == t)) && return; t=$n; "
    "if read -r d 2>/dev/null < deadline && [[ $d =~ ^[0-9]+$ ]] && ((n > d)); then exit 0; fi; }; "
    'ended() { [[ -n $ep ]] && ! kill -0 "$ep" 2>/dev/null || return 0; wait "$ep"; s=$?; ep=; '
    "printf 'sandgym: the image ENTRYPOINT exited with status %%s; the sandbox goes on without it\\n' "
    '"$s" >&2; printf \'%%s\\n\' "$s" > %s 2>/dev/null; }\n'
    'while :; do for f in %s/*; do due; [[ -s $f ]] || continue; m="%s=${f##*/}"; '
    "for r in 1 2 3 4 5 6; do hit=(); for e in /proc/[0-9]*/environ; do due; "
    "p=${e#/proc/}; p=${p%%/environ}; ((p == 1)) && continue; "
    "while IFS= read -r -d '' v; do due; if [[ $v == \"$m\" ]]; then "
    'kill -STOP "$p" 2>/dev/null; hit+=("$p"); break; fi; done 2>/dev/null < "$e"; done; '
    '((${#hit[@]})) || break; kill -KILL "${hit[@]}" 2>/dev/null; done; : > "$f"; done; '
    "due; ended; read -t 0.2 -u 3; done"
) % (
    _SIGNALS,
    _SIGNALS,
    BRIDGE_MOUNT,
    HELPER_DIR,
    ENTRYPOINT_EXIT_PATH,
    HELPER_DIR,
    EXEC_MARKER_ENV,
)


#: pid 1 of an image without bash (MAIN_INIT evals it in the image's sh): a loop that reads the
#: deadline once a second, from the bridge directory held as its working directory. It must fork
#: `sleep` and `date` and wait for them, so it is the one weaker case: a root agent that stops
#: those children (`kill -STOP -1` at the right moment) holds it, and a full pids limit makes its
#: forks fail (then it tries again, a second later). There is no kill helper in such an image.
#: `wait`ing on its foreground children, the sh reaps adopted orphans too. The image's
#: ENTRYPOINT, when given (`image_argv`), is started first as its background child, with the
#: signals an sh leaves ignored for a background job where it cannot reset them (INT and QUIT,
#: in dash); its end is neither logged nor written to ENTRYPOINT_EXIT_PATH.
MAIN_BOOT = (
    '[ $# -gt 0 ] && { (trap - INT QUIT; exec "$@") & }; '
    "cd %s 2>/dev/null || cd /; "
    'while :; do read d < deadline && [ "$(date +%%s)" -gt "$d" ] && exit 0; sleep 1; '
    "done 2>/dev/null"
) % BRIDGE_MOUNT

#: The container's entrypoint: `/bin/sh -c MAIN_INIT MAIN_BOOT HELPER_SCRIPT ARGV...`
#: (`main_entrypoint`; no Docker init above it), ARGV being what the image's ENTRYPOINT runs
#: (`image_argv`; none when the image has no ENTRYPOINT). With bash in the image, pid 1 becomes
#: `bash -c HELPER_SCRIPT sandgym-keeper ARGV...`; without, the host's static bash copied in
#: (`service_life.give_static_bash`, where the host has one and the sandbox has a deadline) runs
#: it; without either, the sh itself runs MAIN_BOOT ($0) with ARGV as its arguments. So an image
#: without bash is handled, not refused: its ENTRYPOINT runs under whichever pid 1 it gets.
#: Either way pid 1 gets, from inside, only the signals it has a handler for: the agent's
#: `kill -9 -1` ends its own processes (the entrypoint's included) but never the container,
#: which would turn its episode into a lost sandbox (masked as infrastructure by the trainer).
MAIN_INIT = (
    'h=$1; shift; if command -v bash >/dev/null 2>&1; then exec bash -c "$h" sandgym-keeper "$@"; fi; '
    f'if [ -x {STATIC_BASH_IN} ]; then exec {STATIC_BASH_IN} -c "$h" sandgym-keeper "$@"; fi; '
    'eval "$0"'
)

#: what `main_entrypoint` puts before the image's own argv
MAIN_PREFIX = ("/bin/sh", "-c", MAIN_INIT, MAIN_BOOT, HELPER_SCRIPT)


def image_argv(
    config: dict[str, Any],
    snapshot: bool = False,
    entrypoint: tuple[str, ...] | None = None,
    command: tuple[str, ...] | None = None,
) -> list[str]:
    """What pid 1 starts for the image whose Config (`docker image inspect`) is `config`, under a
    task compose file whose main service sets `entrypoint` and `command` (None: not set; the
    spec's `main_entrypoint`/`main_command`): `main_process.main_argv`, Harbor's rule (the
    compose entrypoint, else the image's ENTRYPOINT; then the compose command, else Harbor's
    HARBOR_MAIN_COMMAND, which replaces the image's CMD); nothing when that only keeps the
    container up (the image has no ENTRYPOINT and the compose file sets nothing, or a
    keep-alive such as `sleep infinity`: pid 1 keeps the container up). A `snapshot` image
    (`DockerSandbox.snapshot`, a `docker commit` of a sandbox) carries the sandbox's own
    entrypoint: its argv after MAIN_PREFIX is the original sandbox's, started again in each
    container made from it."""
    if snapshot:
        image_entrypoint = [str(a) for a in config.get("Entrypoint") or []]
        n = len(MAIN_PREFIX)
        return image_entrypoint[n:] if tuple(image_entrypoint[:n]) == MAIN_PREFIX else []
    return main_argv(entrypoint, command, config)


def main_entrypoint(argv: list[str]) -> list[str]:
    """The main container's entrypoint: MAIN_PREFIX, then `argv` (`image_argv`)."""
    return [*MAIN_PREFIX, *argv]


def entrypoint_exit(api: Any, container_id: str) -> int | None:
    """(Thread) the exit status of the image's ENTRYPOINT in container `container_id`, read from
    ENTRYPOINT_EXIT_PATH; None while it runs (or when there is none, or no bash keeps it)."""
    import io
    import tarfile

    import docker.errors

    try:
        chunks, _stat = api.get_archive(container_id, ENTRYPOINT_EXIT_PATH)
    except docker.errors.NotFound:
        return None
    data = b"".join(chunks)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.next()
        f = tar.extractfile(member) if member is not None else None
        text = f.read().decode(errors="replace").strip() if f is not None else ""
    return int(text) if text.isdigit() else None


#: kills every process but pid 1 (the init and kill helper) and itself: what the agent left
KILL_ALL_BUT_PID1_SCRIPT = (
    'for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" = 1 ] || [ "$pid" = $$ ] || '
    'kill -9 "$pid" 2>/dev/null; done; exit 0'
)


def _pid_exhausted(result: ExecResult) -> bool:
    """Whether Docker failed to start an exec because the container's pids limit is full."""
    if result.exit_code not in (126, 127, -1) or result.timed_out:
        return False
    text = (result.stdout + result.stderr).lower()
    return "oci runtime exec failed" in text and (
        "read init-p" in text or "resource temporarily unavailable" in text
    )


class ContainerExec:
    """`exec` with the output capped while it streams, and the killers of a timed-out one, in
    one container; the sandbox checks that it is open before it asks."""

    def __init__(self, container: Container, spec: SandboxSpec, max_output_bytes: int) -> None:
        self.container = container
        self.spec = spec
        self.max_output_bytes = max_output_bytes  # per stream
        #: markers of recent execs, for recovering a sandbox whose pids their leftovers hold
        self.markers: collections.deque[str] = collections.deque(maxlen=256)

    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        result = await self._exec_once(cmd, timeout_s, cwd, env, user)
        if _pid_exhausted(result):
            # Docker could not start the command: every pid the limit allows is taken, by what
            # earlier execs left running (a fork bomb that outlived its command). Without
            # a recovery the sandbox is dead for good, so those leftovers are killed (by the
            # helper, which needs no new pid) and the command is tried once more.
            log.warning(
                "docker: pids exhausted in %s; killing what earlier execs left",
                self.container.sandbox_id,
            )
            await self._kill_leftovers()
            result = await self._exec_once(cmd, timeout_s, cwd, env, user)
        return result

    async def _kill_leftovers(self) -> None:
        markers = list(self.markers)
        if not markers or not await self._ask_helper(*markers):
            return
        for _ in range(50):
            if await self._helper_done(markers[-1]):
                return
            await asyncio.sleep(0.1)

    async def _exec_once(
        self,
        cmd: str | list[str],
        timeout_s: float,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | None,
    ) -> ExecResult:
        import docker.errors

        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        workdir = normalize_sandbox_path(cwd, self.spec.workdir) if cwd else self.spec.workdir
        marker = uuid.uuid4().hex
        self.markers.append(marker)
        full_env = {**self.spec.env, **(env or {}), EXEC_MARKER_ENV: marker}
        run_user = user if user is not None else self.spec.user
        start = time.perf_counter()
        try:
            exec_id = await asyncio.to_thread(
                self.container.api.exec_create,
                self.container.id,
                argv,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                environment=full_env,
                workdir=workdir,
                user=run_user or "",
            )
        except (docker.errors.NotFound, docker.errors.APIError) as exc:
            await self.container.raise_if_lost("exec", exc)
            raise SandboxError(
                f"docker exec_create failed in sandbox {self.container.sandbox_id}: {exc}"
            ) from exc

        out, err = CappedBuffer(self.max_output_bytes), CappedBuffer(self.max_output_bytes)
        holder: dict[str, Any] = {}
        done = threading.Event()
        reader = asyncio.create_task(
            asyncio.to_thread(self._pump, exec_id["Id"], out, err, holder, done)
        )
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(reader), timeout_s)
        except TimeoutError:
            timed_out = True
            await self._kill_marked(marker, run_user)
            # The stream ends once every process holding its pipe is dead; a process that
            # escaped the marker (env -i) must not hang us, so cut the socket after a grace.
            try:
                await asyncio.wait_for(asyncio.shield(reader), 2.0)
            except TimeoutError:
                raw = _raw_socket(holder.get("sock"))
                if raw is not None:
                    with contextlib.suppress(OSError):
                        raw.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(reader, 5.0)
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_marked(marker, run_user))
            raise
        failure = reader.exception() if reader.done() and not reader.cancelled() else None
        if failure is not None:
            await self.container.raise_if_lost("exec", failure)
            raise SandboxError(
                f"docker exec stream failed in sandbox {self.container.sandbox_id}: {failure}"
            ) from failure

        exit_code: int | None = None
        if not timed_out:
            exit_code = await self._exit_code(exec_id["Id"])
            # No code, or death by a signal: maybe the whole container went down mid-command.
            # Docker records the container's exit a moment after its processes die, so a
            # SIGKILL'd command (137) watches the state for up to half a second.
            if exit_code is None or exit_code >= 128:
                checks = 10 if exit_code in (None, 137) else 1
                for i in range(checks):
                    lost = await self.container.lost("exec")
                    if lost is not None:
                        raise lost
                    if i + 1 < checks:
                        await asyncio.sleep(0.05)
        stdout, t1 = out.text()
        stderr, t2 = err.text()
        if exit_code == 126 and stdout.startswith("OCI runtime exec failed") and not stderr:
            # Docker could not start the program; say so the way a shell would: on stderr,
            # and 127 when the program does not exist.
            stdout, stderr = "", stdout.replace("\r\n", "\n")
            if "executable file not found" in stderr or "no such file or directory" in stderr:
                exit_code = 127
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=t1 or t2,
            duration_s=time.perf_counter() - start,
        )

    def _pump(
        self,
        exec_id: str,
        out: CappedBuffer,
        err: CappedBuffer,
        holder: dict[str, Any],
        done: threading.Event,
    ) -> None:
        """(Thread) start the exec and demultiplex its stream into the two capped buffers."""
        sock = self.container.api.exec_start(exec_id, tty=False, socket=True)
        holder["sock"] = sock
        try:
            _demux(sock, out, err)
        finally:
            done.set()

    async def _exit_code(self, exec_id: str) -> int | None:
        # The stream can end a moment before Docker records the exit code.
        for _ in range(50):
            try:
                info = await asyncio.to_thread(self.container.api.exec_inspect, exec_id)
            except Exception as exc:
                # Not a timeout: the command's exit status is unknown because the engine failed
                # to say it (or the container went away).
                await self.container.raise_if_lost("exec", exc)
                raise SandboxError(
                    f"docker exec in sandbox {self.container.sandbox_id}: expected its exit status from "
                    f"exec_inspect, the engine failed: {exc}"
                ) from exc
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.01)
        return None

    async def _kill_marked(self, marker: str, user: str | None) -> None:
        """Kill every process of one exec (by its env marker).

        Two killers race: the in-container helper (asked through put_archive; needs no new pid,
        sees root's processes) and a `docker exec` of a fork-free bash script run as the exec's
        own user (root without CAP_SYS_PTRACE cannot read another user's /proc/PID/environ).
        The exec is retried: under a fork bomb it may not get a pid at the first try.
        """
        helper_asked = await self._ask_helper(marker)
        root = is_root_user(user)
        for _attempt in range(30):
            try:
                code, out = await self.raw_exec(
                    ["bash", "-c", kill_marked_bash_script(marker)], user=user
                )
                if code != 0 and b"not found" in out:  # no bash in this image
                    code, out = await self.raw_exec(
                        ["sh", "-c", kill_marked_script(marker)], user=user
                    )
                if code == 0:
                    return
            except Exception as exc:
                if await self.container.state() != "running":
                    return
                log.debug("docker: killer exec failed in %s: %s", self.container.sandbox_id, exc)
            if helper_asked and root and await self._helper_done(marker):
                return
            await asyncio.sleep(0.1)
        log.warning(
            "docker: could not kill the processes of a timed-out exec in %s",
            self.container.sandbox_id,
        )

    async def _ask_helper(self, *markers: str) -> bool:
        requests = files_tar(dict.fromkeys(markers, b"kill\n"), 0o600)
        try:
            await asyncio.to_thread(
                self.container.api.put_archive, self.container.id, HELPER_DIR, requests
            )
            return True
        except Exception as exc:  # no helper in this image (no bash), or the container is gone
            tolerate("docker.ask_helper", exc, log)
            return False

    async def _helper_done(self, marker: str) -> bool:
        """True once the helper has handled (truncated) the request file."""

        def size() -> int:
            chunks, st = self.container.api.get_archive(self.container.id, f"{HELPER_DIR}/{marker}")
            with contextlib.suppress(Exception):
                chunks.close()
            return int(st.get("size", -1))

        try:
            return await asyncio.to_thread(size) == 0
        except Exception as exc:  # not handled yet as far as we can tell: the caller polls on
            tolerate("docker.helper_done", exc, log)
            return False

    async def raw_exec(self, argv: list[str], user: str | None = None) -> tuple[int | None, bytes]:
        """Run a short helper command to completion (no timeout machinery, no marker)."""

        def go() -> tuple[int | None, bytes]:
            ex = self.container.api.exec_create(
                self.container.id, argv, stdout=True, stderr=True, user=user or ""
            )
            output = self.container.api.exec_start(ex["Id"])
            code = self.container.api.exec_inspect(ex["Id"]).get("ExitCode")
            return code, output

        return await asyncio.to_thread(go)

    async def kill_agent_processes(self) -> None:
        """Kill every process in the container but its init (pid 1, the kill helper too) and the
        killer: what the agent left running."""
        for _ in range(3):  # a process forking while the list is made is caught next round
            await self.raw_exec(["sh", "-c", KILL_ALL_BUT_PID1_SCRIPT], user="root")

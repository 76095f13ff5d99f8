"""Commands in a Docker sandbox, and killing what they leave.

`exec` uses the low-level exec API and reads the multiplexed stream itself (`streams`), so output
is capped while it streams. Each exec carries a unique `SANDGYM_EXEC_ID` in its environment; on
timeout every process that still carries it is stopped and killed, by a `docker exec`ed killer and
by the container's main process, the kill helper (`HELPER_SCRIPT`), which needs no new pid and so
still works when a fork bomb fills the pids limit. If leftovers of earlier execs exhaust the pids
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
    KILL_ALL_BUT_INIT_SCRIPT,
    kill_marked_bash_script,
    kill_marked_script,
)
from sandgym.sandboxes.common.output import CappedBuffer
from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.common.users import is_root_user
from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.docker.streams import _demux, _raw_socket
from sandgym.sandboxes.errors import SandboxError
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.spec import ExecResult, SandboxSpec

log = logging.getLogger(__name__)


#: Where the in-container kill helper looks for requests (one file per exec marker). Not under
#: /run/sandgym: that is the bridge directory, bind-mounted read-only, where `mkdir` failed and
#: the helper fell back to `sleep infinity` (seen: no helper ran in any sandbox).
HELPER_DIR = "/run/sandgym-helper/kill"

#: The sandbox's deadline (`sandgym.sandboxes.lifetime`): in the read-only bridge directory, which the
#: host side writes and the agent cannot.
DEADLINE_PATH = "/run/sandgym/deadline"

#: The exit status with which the helper tells the init that the deadline passed.
DEADLINE_EXIT = 99


#: The container's kill helper (a child of its init, MAIN_INIT): a bash loop that forks
#: nothing once started. Every 0.2 s it looks for non-empty files in HELPER_DIR, named by an
#: exec's marker, kills the processes carrying that marker and truncates the file. Requests arrive through
#: put_archive, which needs no process inside the container, so a timed-out command is killed
#: even when a fork bomb holds every pid the pids limit allows and no `docker exec` can start.
#: (As root without CAP_SYS_PTRACE it cannot read other users' environments; execs run as
#: another user rely on the exec-based killer.) Images without bash get `sleep infinity`.
HELPER_SCRIPT = (
    "mkdir -p %s && { [ -p /run/sandgym-helper/tick ] || mkfifo /run/sandgym-helper/tick; } "
    "&& exec 3<>/run/sandgym-helper/tick || exec sleep infinity\n"
    'while :; do for f in %s/*; do [[ -s $f ]] || continue; m="%s=${f##*/}"; '
    "for r in 1 2 3 4 5 6; do hit=(); for e in /proc/[0-9]*/environ; do "
    "p=${e#/proc/}; p=${p%%/environ}; "
    "while IFS= read -r -d '' v; do if [[ $v == \"$m\" ]]; then "
    'kill -STOP "$p" 2>/dev/null; hit+=("$p"); break; fi; done 2>/dev/null < "$e"; done; '
    '((${#hit[@]})) || break; kill -KILL "${hit[@]}" 2>/dev/null; done; : > "$f"; done; '
    # once a second: past the deadline the host side wrote, end (the init then exits)
    "printf -v n '%%(%%s)T' -1; if ((n != t)); then t=$n; "
    "if read -r d 2>/dev/null < %s && [[ $d =~ ^[0-9]+$ ]] && ((n > d)); then exit %d; fi; fi; "
    "read -t 0.2 -u 3; done"
) % (HELPER_DIR, HELPER_DIR, EXEC_MARKER_ENV, DEADLINE_PATH, DEADLINE_EXIT)


#: sh starts the helper under bash when the image has bash; else a plain sh loop keeps the
#: deadline (forking `sleep` and `date`: it is the helper, not the init, whose forks may fail).
MAIN_BOOT = (
    'if command -v bash >/dev/null 2>&1; then exec bash -c "$0"; fi; '
    'while sleep 5; do read d < %s && [ "$(date +%%s)" -gt "$d" ] && exit %d; done 2>/dev/null; '
    "exec sleep infinity"
) % (DEADLINE_PATH, DEADLINE_EXIT)

#: The container's pid 1 (no Docker init above it): runs MAIN_BOOT ($0, with the helper as its
#: $0) as a child and starts it again whenever it ends. From inside, pid 1 gets only the signals
#: it has a handler for, and this one has none, so the agent's `kill -9 -1` ends the helper and
#: its own processes but never the container: a sandbox it could lose would be masked as
#: infrastructure by the trainer. `wait` reaps any child, so adopted orphans too (as an init
#: must); the `sleep 1` keeps a helper that cannot start from spinning. The helper ending with
#: DEADLINE_EXIT (the sandbox's deadline passed, `sandgym.sandboxes.lifetime`) ends the init, and with
#: it the container: nothing else can give that status (a signal's is 128+n).
MAIN_INIT = 'while :; do sh -c "$0" "$1" & wait $!; [ $? = %d ] && exit 0; sleep 1; done' % (
    DEADLINE_EXIT
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
        """Kill every process in the container but its init (pid 1), the kill helper and the
        killer: what the agent left running. The helper is told apart as the oldest process
        after pid 1 (it starts with the container; nothing the agent starts is older)."""
        for _ in range(3):  # a process forking while the list is made is caught next round
            await self.raw_exec(["sh", "-c", KILL_ALL_BUT_INIT_SCRIPT], user="root")

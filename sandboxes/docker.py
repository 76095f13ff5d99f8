"""The `docker` backend: one container per sandbox, driven through the Docker SDK.

A sandbox is a container under Docker's init (so zombies are reaped) with CPU, memory (swap
equal, i.e. no extra swap) and pids limits, all capabilities dropped except the few a root user
needs to work on its own files, `no-new-privileges`, and the network its spec's policy names
(`sandboxes.network`: public = the engine's bridge, attached or detached per phase; no-network
= loopback only; allowlist = loopback plus an egress proxy listening in the container's network
namespace, `sandboxes.egress`).
Its main process is a small fork-free bash loop, the kill helper (`HELPER_SCRIPT`; plain
`sleep infinity` in images without bash). Images come by name (default
`sandgym/terminal:latest`, made offline by `images/bootstrap-base.sh`), or are built from
`spec.build_context` once per content hash (`sandgym/ctx:<hash16>`, reused while it exists;
concurrent creates of one context share one build).

Commands: `exec` uses the low-level exec API and reads the multiplexed stream itself so output
is capped while it streams (a 10 MB flood costs at most the cap in memory). Each exec carries a
unique `SANDGYM_EXEC_ID` in its environment; on timeout every process inside the container that
still carries it (the command, its children, background jobs, even ones that called setsid) is
stopped and killed, by a `docker exec`ed killer and by the helper, which needs no new pid and so
still works when a fork bomb fills the pids limit. Background jobs of an exec that finishes in
time keep running (as with `docker exec`); if their leftovers later exhaust the pids limit, the
next exec kills them and retries once. Docker keeps reading an exec's output for up to ~2 s
after its main process exits while a background job holds the pipe. The persistent shell is a
`PexpectShell` over `docker exec -it ... bash`, started lazily (restarted if it exits). Files
move as tar archives (`put_archive`/`get_archive`); symlinks resolve inside the container's
root, never on the host. Every SDK call goes through `asyncio.to_thread`. A container that
vanished or stopped raises `SandboxLostError` from exec, shell and file calls.

Gateway bridge: every container gets a host directory of its own, `<bridge_root>/<sandbox id>`
(`bridge_root` is a backend option, default `$SANDGYM_DOCKER_BRIDGE_ROOT` or
`/tmp/sandgym-bridge`), bind-mounted read-only at `/run/sandgym`. The env server puts unix
sockets there (`Sandbox.bridge_dir`, used by `envserver.gateway_bridge`); a process in the
container can connect to them (a socket on a read-only mount still accepts connections) while
the container's network stays `none`, and cannot replace them. The directory is removed with its
container (close, failed create, reap). When the server itself runs in a container (compose),
Docker resolves the bind source on the *host*, so the same directory must be mounted into the
server's container at the same path (`- /tmp/sandgym-bridge:/tmp/sandgym-bridge`).

Verifier: `exec_private` runs it in a sibling container started from a snapshot of the sandbox
(`docker commit` into `sandgym/verifier-snapshot:<name>`), with the same confinement and only the
sandbox's network namespace shared, so nothing the agent left running can reach the tests or the
reward files while its services stay reachable on localhost; container and image are removed
after every verify (see `DockerSandbox.exec_private` for what a snapshot lacks, and the cost).

Groups: a spec with `services` (a compose file's other services) runs them beside the sandbox
on a private network of their own, the sandbox's container joined to it in every phase
(`sandboxes.docker_group`); they go with it on close, sweep and reap. Healthchecks: an image's
HEALTHCHECK is waited for through Docker's status, `spec.healthcheck` is run inside
(`sandboxes.health`), before `create` returns.

Reaping: `reap(only_expired=True)` removes containers of any owner whose lease expired or whose
owning process on this host is dead; `reap(only_expired=False)` also removes every container this
backend's owner created (what a server does when it shuts down or restarts under the same id).
Verifier snapshot images go with their verifier containers, by the same labels. `sandboxes.reaper`
holds the decision (`should_reap`) and the cross-backend `sandgym reap`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import logging
import os
import posixpath
import shutil
import socket
import struct
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandboxes.base import (
    LABEL_MANAGED,
    LABEL_OWNER,
    SandboxBackend,
    normalize_sandbox_path,
)
from sandboxes.cgroups import CPU_PERIOD_US
from sandboxes.common.files import files_tar, one_file_tar
from sandboxes.common.kill import (
    EXEC_MARKER_ENV,
    KILL_ALL_BUT_INIT_SCRIPT,
    kill_marked_bash_script,
    kill_marked_script,
)
from sandboxes.common.lazy_shell import ShellSandbox
from sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES, CappedBuffer
from sandboxes.docker_group import (
    LABEL_GROUP_OF,
    DockerGroup,
    owned_group_ids,
    reap_group_networks,
    remove_group,
    wait_docker_health,
)
from sandboxes.egress import EgressProxy, proxy_env
from sandboxes.errors import (
    BackendUnavailableError,
    NetworkPolicyUnsupportedError,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
)
from sandboxes.network import NetworkPolicy
from sandboxes.spec import ExecResult, SandboxSpec

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "sandgym/terminal:latest"
CTX_REPO = "sandgym/ctx"
#: where the per-container bridge directory appears inside the container
BRIDGE_MOUNT = "/run/sandgym"
DEFAULT_BRIDGE_ROOT = "/tmp/sandgym-bridge"
#: label naming a container's host bridge directory (so any reaper can remove it)
LABEL_BRIDGE_DIR = "sandgym.bridge_dir"
#: label on a verifier's container and its snapshot image: the id of the sandbox it scores
LABEL_VERIFIER_OF = "sandgym.verifier_of"
#: repository of the snapshot images verifiers run from (tag: the verifier container's name)
SNAPSHOT_REPO = "sandgym/verifier-snapshot"
#: a group's prepared sandbox, committed once (`DockerSandbox.snapshot`); its members start from it
GROUP_SNAPSHOT_REPO = "sandgym/group-snapshot"
LABEL_SNAPSHOT_OF = "sandgym.snapshot_of"
#: set in a verifier's own container, for tasks/private_verify.py's wrapper (no mounts needed)
VERIFIER_OWN_CONTAINER_ENV = "SANDGYM_VERIFIER_OWN_CONTAINER"
#: the verifier container's entrypoint: its stdin is a file put there before it started
_STDIN_BOOT = 'exec 0<"$0" && rm -f "$0" && exec "$@"'
#: the longest socket name the server puts in a bridge directory ("/gateway.sock" is 13 bytes)
_BRIDGE_SOCKET_NAME_MAX = 16
_MAX_UNIX_PATH = 107  # sun_path is 108 bytes with its terminating NUL

#: What root inside the sandbox keeps: enough to own, chmod and chown its files, switch to an
#: unprivileged user (apt's _apt, `su`-less `exec user=`), signal its processes, bind low ports.
#: Dropped compared to Docker's default: NET_RAW (raw sockets), MKNOD, AUDIT_WRITE.
CAP_ADD = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "SETUID",
    "SETGID",
    "SETPCAP",
    "SETFCAP",
    "KILL",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
]


def _make_bridge_dir(path: Path) -> None:
    """(Thread) a fresh, empty bridge directory that any user in the container can traverse."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=0o755, exist_ok=True)  # exists on the retry without storage limits
    os.chmod(path, 0o755)  # mkdir's mode is masked by the umask


def _remove_bridge_dir(path: Path) -> None:
    """(Thread) remove a bridge directory (it holds only sockets the server made)."""
    if path.is_symlink():
        path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        log.warning("docker: could not remove bridge directory %s", path)


#: a bridge directory without its container is left alone this long (it may be being created)
BRIDGE_SWEEP_GRACE_S = 120.0


def _sweep_bridge_root(root: Path, live: set[str]) -> None:
    """(Thread) remove bridge directories under `root` whose container no longer exists, and
    which are older than `BRIDGE_SWEEP_GRACE_S` (a create in flight makes its directory first)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    now = time.time()
    for d in entries:
        if not d.name.startswith("sg-") or d.name in live:
            continue
        try:
            age = now - d.lstat().st_mtime
        except OSError:
            continue
        if age > BRIDGE_SWEEP_GRACE_S:
            _remove_bridge_dir(d)


# Go's os.FileMode bits, as Docker reports them in the archive stat header.
_GO_MODE_DIR = 1 << 31
_GO_MODE_SYMLINK = 1 << 27


#: Where the in-container kill helper looks for requests (one file per exec marker).
HELPER_DIR = "/run/sandgym/kill"

#: The container's main process (under Docker's init): a bash loop that forks nothing once
#: started. Every 0.2 s it looks for non-empty files in HELPER_DIR, named by an exec's marker,
#: kills the processes carrying that marker and truncates the file. Requests arrive through
#: put_archive, which needs no process inside the container, so a timed-out command is killed
#: even when a fork bomb holds every pid the pids limit allows and no `docker exec` can start.
#: (As root without CAP_SYS_PTRACE it cannot read other users' environments; execs run as
#: another user rely on the exec-based killer.) Images without bash get `sleep infinity`.
HELPER_SCRIPT = (
    "mkdir -p %s && { [ -p /run/sandgym/tick ] || mkfifo /run/sandgym/tick; } "
    "&& exec 3<>/run/sandgym/tick || exec sleep infinity\n"
    'while :; do for f in %s/*; do [[ -s $f ]] || continue; m="%s=${f##*/}"; '
    "for r in 1 2 3 4 5 6; do hit=(); for e in /proc/[0-9]*/environ; do "
    "p=${e#/proc/}; p=${p%%/environ}; "
    "while IFS= read -r -d '' v; do if [[ $v == \"$m\" ]]; then "
    'kill -STOP "$p" 2>/dev/null; hit+=("$p"); break; fi; done 2>/dev/null < "$e"; done; '
    '((${#hit[@]})) || break; kill -KILL "${hit[@]}" 2>/dev/null; done; : > "$f"; done; '
    "read -t 0.2 -u 3; done"
) % (HELPER_DIR, HELPER_DIR, EXEC_MARKER_ENV)

#: sh starts the helper under bash when the image has bash, else just sleeps.
MAIN_BOOT = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$0"; fi; exec sleep infinity'


def _raw_socket(sock: Any) -> socket.socket | None:
    """The OS socket under whatever docker-py returned for a hijacked exec stream."""
    for attr in ("_sock", "sock"):
        inner = getattr(sock, attr, None)
        if isinstance(inner, socket.socket):
            return inner
    return sock if isinstance(sock, socket.socket) else None


def _read_exactly(sock: Any, n: int) -> bytes:
    from docker.utils import socket as dsocket

    buf = bytearray()
    while len(buf) < n:
        chunk = dsocket.read(sock, n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


class _ChunkReader(io.RawIOBase):
    """A file object over docker-py's archive chunk generator (for streaming tarfile reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._pending))
        b[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
        super().close()


def _pid_exhausted(result: ExecResult) -> bool:
    """Whether Docker failed to start an exec because the container's pids limit is full."""
    if result.exit_code not in (126, 127, -1) or result.timed_out:
        return False
    text = (result.stdout + result.stderr).lower()
    return "oci runtime exec failed" in text and (
        "read init-p" in text or "resource temporarily unavailable" in text
    )


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in ticks), or None when there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):  # a zombie init is a dead container
        return None
    return fields[19]


def _demux(sock: Any, out: CappedBuffer, err: CappedBuffer) -> None:
    """(Thread) read Docker's multiplexed stdout/stderr stream (exec or attach, no tty) into the
    two capped buffers until it ends or the socket is shut down; then close the socket."""
    try:
        while True:
            header = _read_exactly(sock, 8)
            if len(header) < 8:
                return
            stream_type, size = struct.unpack(">BxxxL", header)
            remaining = size
            while remaining > 0:
                chunk = _read_exactly(sock, min(remaining, 65536))
                if not chunk:
                    return
                remaining -= len(chunk)
                (err if stream_type == 2 else out).add(chunk)
    except OSError:
        return  # socket shut down by a timeout path
    finally:
        with contextlib.suppress(Exception):
            sock.close()
        raw = _raw_socket(sock)
        if raw is not None:
            with contextlib.suppress(Exception):
                raw.close()


class DockerSandbox(ShellSandbox):
    """One container. Create through `DockerBackend.create`."""

    backend_name = "docker"
    builds_images = True  # `DockerBackend.create` builds the spec's Dockerfile

    def __init__(
        self, spec: SandboxSpec, backend: DockerBackend, container_id: str, sandbox_id: str
    ) -> None:
        super().__init__(spec, sandbox_id)
        self._backend = backend
        self.container_id = container_id
        self._bridge_dir: Path | None = None  # set by DockerBackend.create
        self._on_bridge = False  # attached to the engine's bridge network now
        self._proxy: EgressProxy | None = None  # the allowlist's egress proxy
        self._group: DockerGroup | None = None  # the services beside it (docker_group)
        self.max_output_bytes = backend.max_output_bytes  # per stream, exec and shell
        # Markers of recent execs, for recovering a sandbox whose pids their leftovers hold.
        self._markers: collections.deque[str] = collections.deque(maxlen=256)

    @property
    def _api(self) -> Any:
        return self._backend._client().api

    @property
    def bridge_dir(self) -> Path | None:
        """This container's host directory, bind-mounted read-only at `/run/sandgym`."""
        return self._bridge_dir

    # -- lifecycle ---------------------------------------------------------------------------
    def _watch_host_pid(self, pid: int | None) -> None:
        """Remember the container's init as a host pid, when this process can see it (the
        server runs beside dockerd, not in a container of its own), so `is_alive` can read
        /proc instead of asking the engine: microseconds instead of milliseconds on the pool's
        hot path. The start time guards against pid reuse."""
        self._host_pid: int | None = None
        self._host_start: str | None = None
        if not pid:
            return
        try:  # the pid must be *this* container's (not a same-numbered pid in our namespace)
            with open(f"/proc/{pid}/cgroup") as f:
                if self.container_id not in f.read():
                    return
        except OSError:
            return
        start = _proc_start_time(pid)
        if start is not None:
            self._host_pid, self._host_start = pid, start

    async def is_alive(self) -> bool:
        if self._closed:
            return False
        pid = getattr(self, "_host_pid", None)
        if pid is not None:
            return _proc_start_time(pid) == self._host_start
        return await self._state() == "running"

    async def _state(self) -> str | None:
        """The container's status ('running', 'exited', ...) or None if it no longer exists."""
        import docker.errors

        try:
            info = await asyncio.to_thread(self._api.inspect_container, self.container_id)
        except docker.errors.NotFound:
            return None
        status: str = info.get("State", {}).get("Status", "unknown")
        return status

    async def _lost(self, what: str) -> SandboxLostError | None:
        """A SandboxLostError when the container is gone or stopped, else None."""
        state = await self._state()
        if state == "running":
            return None
        found = "no longer exists" if state is None else f"is {state}"
        return SandboxLostError(
            f"sandbox {self.id} ({what}): expected a running container, it {found}"
        )

    async def _start_network(self, pid: int | None) -> None:
        """The starting policy: off the bridge unless public; the allowlist proxy listening in
        the container's network namespace when some phase needs it."""
        if self._on_bridge and self.network.mode != "public":
            await self._set_bridge(False)
        if self.spec.needs_proxy:
            if not pid or getattr(self, "_host_pid", None) != pid:
                raise NetworkPolicyUnsupportedError(
                    f"sandbox {self.id}: an allowlist network needs the server on the Docker "
                    "engine's own host (its proxy listens in the container's network namespace, "
                    "entered through /proc); this server cannot see the container's processes"
                )
            self._proxy = EgressProxy(self.id, self.network)
            await self._proxy.start(f"/proc/{pid}/ns/net")

    async def _set_bridge(self, connected: bool) -> None:
        api = self._api
        if connected:
            await asyncio.to_thread(api.connect_container_to_network, self.container_id, "bridge")
        else:
            await asyncio.to_thread(
                api.disconnect_container_from_network, self.container_id, "bridge", force=True
            )
        self._on_bridge = connected

    async def _apply_network(self, policy: NetworkPolicy) -> None:
        """public: back on the bridge; no-network and allowlist: off it (loopback only), the
        proxy enforcing the allowlist (and, in a public phase, letting everything through)."""
        want_bridge = policy.mode == "public"
        if want_bridge != self._on_bridge:
            await self._set_bridge(want_bridge)
        if self._proxy is not None:
            self._proxy.set_policy(policy)

    async def _destroy(self) -> None:
        await self._close_shell()
        if self._proxy is not None:
            with contextlib.suppress(Exception):
                await self._proxy.close()
        # Shielded: a cancelled episode must still not leak its container.
        await asyncio.shield(self._backend._remove_container(self.container_id))
        if self._group is not None:
            await asyncio.shield(self._group.remove())
        if self._bridge_dir is not None:
            await asyncio.to_thread(_remove_bridge_dir, self._bridge_dir)

    # -- exec --------------------------------------------------------------------------------
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
            log.warning("docker: pids exhausted in %s; killing what earlier execs left", self.id)
            await self._kill_leftovers()
            result = await self._exec_once(cmd, timeout_s, cwd, env, user)
        return result

    async def _kill_leftovers(self) -> None:
        markers = list(self._markers)
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

        self._check_open()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        workdir = normalize_sandbox_path(cwd, self.spec.workdir) if cwd else self.spec.workdir
        marker = uuid.uuid4().hex
        self._markers.append(marker)
        full_env = {**self.spec.env, **(env or {}), EXEC_MARKER_ENV: marker}
        run_user = user if user is not None else self.spec.user
        start = time.perf_counter()
        try:
            exec_id = await asyncio.to_thread(
                self._api.exec_create,
                self.container_id,
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
            lost = await self._lost("exec")
            if lost is not None:
                raise lost from exc
            raise SandboxError(f"docker exec_create failed in sandbox {self.id}: {exc}") from exc

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
            lost = await self._lost("exec")
            if lost is not None:
                raise lost from failure
            raise SandboxError(
                f"docker exec stream failed in sandbox {self.id}: {failure}"
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
                    lost = await self._lost("exec")
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
        sock = self._api.exec_start(exec_id, tty=False, socket=True)
        holder["sock"] = sock
        try:
            _demux(sock, out, err)
        finally:
            done.set()

    async def _exit_code(self, exec_id: str) -> int | None:
        # The stream can end a moment before Docker records the exit code.
        for _ in range(50):
            try:
                info = await asyncio.to_thread(self._api.exec_inspect, exec_id)
            except Exception:
                return None
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
        root = user in (None, "", "root", "0")
        for _attempt in range(30):
            try:
                code, out = await self._raw_exec(
                    ["bash", "-c", kill_marked_bash_script(marker)], user=user
                )
                if code != 0 and b"not found" in out:  # no bash in this image
                    code, out = await self._raw_exec(
                        ["sh", "-c", kill_marked_script(marker)], user=user
                    )
                if code == 0:
                    return
            except Exception as exc:
                if await self._state() != "running":
                    return
                log.debug("docker: killer exec failed in %s: %s", self.id, exc)
            if helper_asked and root and await self._helper_done(marker):
                return
            await asyncio.sleep(0.1)
        log.warning("docker: could not kill the processes of a timed-out exec in %s", self.id)

    async def _ask_helper(self, *markers: str) -> bool:
        requests = files_tar(dict.fromkeys(markers, b"kill\n"), 0o600)
        try:
            await asyncio.to_thread(self._api.put_archive, self.container_id, HELPER_DIR, requests)
            return True
        except Exception:  # no helper in this image (no bash), or the container is gone
            return False

    async def _helper_done(self, marker: str) -> bool:
        """True once the helper has handled (truncated) the request file."""

        def size() -> int:
            chunks, st = self._api.get_archive(self.container_id, f"{HELPER_DIR}/{marker}")
            with contextlib.suppress(Exception):
                chunks.close()
            return int(st.get("size", -1))

        try:
            return await asyncio.to_thread(size) == 0
        except Exception:
            return False

    async def _raw_exec(self, argv: list[str], user: str | None = None) -> tuple[int | None, bytes]:
        """Run a short helper command to completion (no timeout machinery, no marker)."""

        def go() -> tuple[int | None, bytes]:
            ex = self._api.exec_create(
                self.container_id, argv, stdout=True, stderr=True, user=user or ""
            )
            output = self._api.exec_start(ex["Id"])
            code = self._api.exec_inspect(ex["Id"]).get("ExitCode")
            return code, output

        return await asyncio.to_thread(go)

    async def kill_agent_processes(self) -> None:
        """Kill every process in the container but its init (pid 1), the kill helper and the
        killer: what the agent left running. The helper is told apart as the oldest process
        after pid 1 (it starts with the container; nothing the agent starts is older)."""
        self._check_open()
        for _ in range(3):  # a process forking while the list is made is caught next round
            await self._raw_exec(["sh", "-c", KILL_ALL_BUT_INIT_SCRIPT], user="root")

    # -- the private verifier ----------------------------------------------------------------
    @property
    def supports_private_exec(self) -> bool:
        return True

    async def exec_private(
        self,
        cmd: list[str],
        stdin: bytes,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """`cmd` as root in a *sibling container* of its own, where no process of the agent's
        exists: what the verifier uses (tasks/private_verify.py), so that nothing the agent
        left running can see, join or touch the tests or the reward files.

        1. The sandbox's file system is snapshotted (`docker commit`, the container paused
           meanwhile) into `sandgym/verifier-snapshot:<name>`;
        2. a container `<sandbox id>-verifier-<hex>` starts from it with the sandbox's
           confinement (init, reduced capabilities, `no-new-privileges`, the spec's CPU,
           memory, pids and file-size limits), `VERIFIER_OWN_CONTAINER_ENV=1` set, and only
           the sandbox's *network* namespace shared (`network_mode=container:<sandbox>`): a
           test can still query a service the agent left listening on localhost, while pid,
           mount, IPC and UTS namespaces are its own (the agent's processes can neither see it
           nor reach its files through /proc);
        3. `stdin` is put into that container as a file (mode 0600) before it starts, and the
           entrypoint makes it the command's stdin and deletes it; stdout and stderr are read
           from an attach made before the start, capped like `exec`'s. On timeout the container
           is killed (every process in it: no marker hunt needed), `exit_code` is None;
        4. the container and the image are removed in every case (shielded from cancellation,
           after any Docker call still in flight). Both carry the sandbox's owner labels plus
           `sandgym.verifier_of=<sandbox id>`, so a reap after a server died mid-verify removes
           them (`DockerBackend.reap_matching`), and the pool's sweep of untracked sandboxes
           leaves a live one alone (`owned_sandbox_ids` skips them).

        What the verifier does not see: the contents of the sandbox's volumes (an image's
        `VOLUME`s; the backend itself mounts only the read-only bridge directory at
        /run/sandgym, which is left empty there) and tmpfs mounts (the backend makes none), and
        the agent's processes: a test that looks for them with `ps` or /proc finds nothing,
        while a service they run is reachable through the shared network (localhost, abstract
        unix sockets). Files the agent changed are all there (a commit holds the whole writable
        layer). The programs the verifier runs (sh, bash, the tests' interpreters) come from
        that snapshot too: an agent that replaces them still runs code as the verifier, as in
        any design where the tests run in the agent's environment (tasks/private_verify.py).

        Cost: a commit (grows with the bytes the agent changed), a container start and two
        removals; the verifier's container counts against its own limits, beside the sandbox's.
        Measured here (runc, overlay2, 2 cores; medians of 5 and of 8), `run_verifier` on a
        small task: +1 to +46 ms per verify (~0.4 s either way) over running the tests inside
        the sandbox (commit 80-100 ms, create+start 125-140 ms, removals ~15 ms, minus the
        copy-in and read-back that path needed); after the agent wrote 50 MB and 2,000 files:
        +0.9 to +1.1 s (commit ~0.5 s, image removal 0.2-0.25 s). The runtime
        must let a container join another's network namespace (runc does; gVisor's runsc
        keeps the network inside its sandbox)."""
        import docker.errors

        self._check_open()
        lost = await self._lost("private exec")
        if lost is not None:
            raise lost
        backend = self._backend
        api = self._api
        name = f"{self.id}-verifier-{uuid.uuid4().hex[:8]}"
        image = f"{SNAPSHOT_REPO}:{name}"
        stdin_path = f"/.sandgym-verifier-stdin-{uuid.uuid4().hex}"
        workdir = normalize_sandbox_path(cwd, self.spec.workdir) if cwd else self.spec.workdir
        full_env = {**self.spec.env, **(env or {}), VERIFIER_OWN_CONTAINER_ENV: "1"}
        host: dict[str, Any] = dict(
            network_mode=f"container:{self.container_id}",
            log_config={"type": "none"},  # output comes through the attach; none kept on disk
            **backend._confinement(self.spec),
        )
        host.pop("storage_opt", None)  # the verifier writes little; its writes are discarded
        start = time.perf_counter()
        in_flight: list[asyncio.Future[Any]] = []

        def thread(fn: Any, *args: Any, **kw: Any) -> asyncio.Future[Any]:
            fut = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kw))
            in_flight.append(fut)
            return fut

        def prepare() -> str:
            labels = backend.labels_for(self.spec)
            # The snapshot inherits the sandbox's labels; these mark it and its container as
            # a verifier's (and drop the bridge directory, which is the sandbox's alone).
            labels.update({LABEL_VERIFIER_OF: self.id, LABEL_BRIDGE_DIR: ""})
            api.commit(
                self.container_id, repository=SNAPSHOT_REPO, tag=name, conf={"Labels": labels}
            )
            cid: str = api.create_container(
                image,
                entrypoint=["/bin/sh", "-c", _STDIN_BOOT, stdin_path],
                command=list(cmd),
                name=name,
                labels=labels,
                environment=full_env,
                working_dir=workdir,
                user="0",
                host_config=api.create_host_config(**host),
            )["Id"]
            api.put_archive(cid, "/", one_file_tar(stdin_path, stdin, 0o600))
            mounts = api.inspect_container(self.container_id).get("Mounts") or []
            unseen = sorted(m.get("Destination", "?") for m in mounts if m.get("Type") == "volume")
            if unseen:
                log.warning(
                    "docker: the verifier of sandbox %s sees the image's contents, not the "
                    "agent's, at its volume(s) %s (a commit holds no volume)",
                    self.id,
                    ", ".join(unseen),
                )
            return cid

        out, err = CappedBuffer(self.max_output_bytes), CappedBuffer(self.max_output_bytes)
        timed_out = False
        exit_code: int | None = None
        try:
            try:
                cid = await asyncio.shield(thread(prepare))
                params = {"stdout": 1, "stderr": 1, "stream": 1}  # attached before the start
                sock = await asyncio.shield(thread(api.attach_socket, cid, params=params))
                reader = thread(_demux, sock, out, err)
                await asyncio.shield(thread(api.start, cid))
            except docker.errors.APIError as exc:
                lost = await self._lost("private exec")
                if lost is not None:
                    raise lost from exc
                raise SandboxError(
                    f"docker could not start the verifier container of sandbox {self.id}: {exc}"
                ) from exc
            try:
                await asyncio.wait_for(asyncio.shield(reader), timeout_s)
            except TimeoutError:
                timed_out = True
                with contextlib.suppress(docker.errors.APIError):
                    await asyncio.shield(thread(api.kill, cid))
                try:  # the stream ends with the container; never hang on it
                    await asyncio.wait_for(asyncio.shield(reader), 5.0)
                except TimeoutError:
                    raw = _raw_socket(sock)
                    if raw is not None:
                        with contextlib.suppress(OSError):
                            raw.shutdown(socket.SHUT_RDWR)
            if not timed_out:
                status = await asyncio.shield(thread(api.wait, cid, timeout=60))
                exit_code = int(status.get("StatusCode", -1))
        finally:
            await asyncio.shield(self._drop_verifier(in_flight, name, image))
        stdout, t1 = out.text()
        stderr, t2 = err.text()
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=t1 or t2,
            duration_s=time.perf_counter() - start,
        )

    async def _drop_verifier(
        self, in_flight: list[asyncio.Future[Any]], name: str, image: str
    ) -> None:
        """Remove a verifier's container and snapshot image, once the Docker calls it still has
        in flight returned (a commit or create finishing after the removal would leak)."""
        import docker.errors

        await self._backend._remove_container(name)  # ends the attach stream, if still open
        for fut in in_flight:
            with contextlib.suppress(BaseException):
                await fut
        await self._backend._remove_container(name)
        try:
            await asyncio.to_thread(self._api.remove_image, image, force=True)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("docker: could not remove verifier snapshot %s: %s", image, exc)

    # -- the persistent shell ----------------------------------------------------------------
    async def _after_shell_exit(self) -> None:
        lost = await self._lost("shell")
        if lost is not None:
            raise lost

    async def _start_shell(self) -> Any:
        from sandboxes.shell import PexpectShell

        argv = [self._backend.docker_cli, "exec", "-it", "-w", self.spec.workdir]
        for k, v in self.spec.env.items():
            argv += ["-e", f"{k}={v}"]
        if self.spec.user:
            argv += ["-u", self.spec.user]
        # An empty prompt from the first line on, so no `bash-5.2#` lands on the screen.
        argv += ["-e", "PS1=", "-e", "PS2="]
        argv += [self.container_id, "bash", "--noprofile", "--norc", "-i"]
        shell = PexpectShell(
            argv,
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.max_output_bytes,
        )
        try:
            await shell.start()
        except SandboxLostError as exc:
            lost = await self._lost("shell start")
            raise (lost or exc) from exc
        return shell

    async def _run_helper(self, script: str) -> str:
        _code, out = await self._raw_exec(["sh", "-c", script])
        return out.decode()

    async def _shell_error(self, exc: SandboxLostError) -> SandboxLostError:
        return await self._lost("shell") or exc

    # -- files -------------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        return normalize_sandbox_path(path, self.spec.workdir)

    async def snapshot(self) -> str:
        """`docker commit` of this container (paused for it) into a labelled image, which
        sandboxes of a spec naming it start from (`SandboxSpec.snapshot`)."""
        await self._check_running("snapshot")
        tag = f"{self.id}-{uuid.uuid4().hex[:6]}"
        labels = self._backend.labels_for(self.spec)
        labels.update({LABEL_SNAPSHOT_OF: self.id, LABEL_BRIDGE_DIR: ""})
        await asyncio.to_thread(
            self._api.commit,
            self.container_id,
            repository=GROUP_SNAPSHOT_REPO,
            tag=tag,
            conf={"Labels": labels},
        )
        return f"{GROUP_SNAPSHOT_REPO}:{tag}"

    async def _check_running(self, what: str) -> None:
        """Archive calls still work on a stopped container; a stopped sandbox is lost, though
        (one inspect per file call, a few ms)."""
        self._check_open()
        lost = await self._lost(what)
        if lost is not None:
            raise lost

    async def _put_archive(self, parent: str, data: Any) -> None:
        """put_archive into `parent`, creating it when missing; lost container -> error."""
        import docker.errors

        def put() -> None:
            if hasattr(data, "seek"):
                data.seek(0)
            self._api.put_archive(self.container_id, parent, data)

        try:
            await asyncio.to_thread(put)
            return
        except docker.errors.NotFound as exc:
            lost = await self._lost("write")
            if lost is not None:
                raise lost from exc
        code, out = await self._raw_exec(["mkdir", "-p", parent])
        if code != 0:
            raise SandboxPathError(
                f"cannot create directory {parent} in sandbox {self.id}: {out.decode(errors='replace')}"
            )
        try:
            await asyncio.to_thread(put)
        except docker.errors.NotFound as exc:
            # `mkdir -p` worked but Docker cannot resolve the directory in the container's
            # filesystem (e.g. a symlink into /proc): the agent's path, not a server fault.
            raise SandboxPathError(
                f"cannot write into {parent} in sandbox {self.id}: expected a directory of the "
                f"container's filesystem, Docker found none ({exc.explanation})"
            ) from exc
        except docker.errors.APIError as exc:
            raise SandboxError(f"writing into {parent} in sandbox {self.id} failed: {exc}") from exc

    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        await self._check_running("write")
        p = self._path(path)
        if p == "/":
            raise SandboxPathError("expected a file path, got the root directory")
        data = content.encode() if isinstance(content, str) else bytes(content)
        await self._put_archive(posixpath.dirname(p), one_file_tar(p, data, mode))

    async def _stat(self, path: str) -> tuple[str, dict[str, Any]]:
        """Follow symlinks (Docker resolves them inside the container's root, so a link can
        never reach the host) and return (resolved path, stat) or raise not-found/lost."""
        import docker.errors

        current = path
        for _ in range(16):
            try:
                st = await asyncio.to_thread(
                    self._api.get_archive, self.container_id, current, 65536
                )
            except docker.errors.NotFound as exc:
                lost = await self._lost("read")
                if lost is not None:
                    raise lost from exc
                raise SandboxFileNotFoundError(
                    f"no such file or directory in sandbox {self.id}: {path}"
                ) from exc
            chunks, info = st
            with contextlib.suppress(Exception):
                chunks.close()
            if int(info.get("mode", 0)) & _GO_MODE_SYMLINK and info.get("linkTarget"):
                target = info["linkTarget"]
                current = posixpath.normpath(posixpath.join(posixpath.dirname(current), target))
                continue
            return current, info
        raise SandboxPathError(f"too many levels of symbolic links at {path}")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        await self._check_running("read")
        p = self._path(path)
        resolved, info = await self._stat(p)
        if int(info.get("mode", 0)) & _GO_MODE_DIR:
            raise SandboxPathError(f"expected a file, {p} is a directory in sandbox {self.id}")

        def fetch() -> bytes:
            chunks, _ = self._api.get_archive(self.container_id, resolved, 65536)
            reader = _ChunkReader(chunks)
            try:
                with tarfile.open(fileobj=io.BufferedReader(reader), mode="r|") as tar:
                    for member in tar:
                        f = tar.extractfile(member)
                        if f is None:
                            return b""
                        return f.read() if max_bytes is None else f.read(max_bytes)
                return b""
            finally:
                reader.close()

        return await asyncio.to_thread(fetch)

    async def upload(self, src: Path, dst: str) -> None:
        await self._check_running("upload")
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist on the host")
        p = self._path(dst)
        if p == "/":
            raise SandboxPathError("expected a destination below /, got the root directory")

        def pack() -> Any:
            tmp = tempfile.TemporaryFile()
            with tarfile.open(fileobj=tmp, mode="w") as tar:

                def owned_by_root(ti: tarfile.TarInfo) -> tarfile.TarInfo:
                    ti.uid = ti.gid = 0
                    ti.uname = ti.gname = "root"
                    return ti

                tar.add(str(src), arcname=posixpath.basename(p), filter=owned_by_root)
            return tmp

        tmp = await asyncio.to_thread(pack)
        try:
            await self._put_archive(posixpath.dirname(p), tmp)
        finally:
            tmp.close()

    async def download(self, src: str, dst: Path) -> None:
        await self._check_running("download")
        p = self._path(src)
        resolved, _info = await self._stat(p)
        dst = Path(dst)

        def fetch() -> None:
            chunks, _ = self._api.get_archive(self.container_id, resolved, 65536)
            dst.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=dst.parent) as tmpdir:
                reader = _ChunkReader(chunks)
                try:
                    with tarfile.open(fileobj=io.BufferedReader(reader), mode="r|") as tar:
                        # "data" refuses absolute paths, links out of the tree, device files:
                        # such a member is left out (a tree the agent made may hold them).
                        tar.extractall(tmpdir, filter=_data_or_skip)
                finally:
                    reader.close()
                top = Path(tmpdir) / posixpath.basename(resolved)
                if top.is_dir():
                    shutil.copytree(top, dst, dirs_exist_ok=True, symlinks=True)
                else:
                    shutil.move(str(top), dst)

        await asyncio.to_thread(fetch)


def _data_or_skip(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's `data` filter, skipping (not failing on) the members it refuses."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        log.debug("download: left out %s (%s)", member.name, member.type)
        return None


class DockerBackend(SandboxBackend):
    """Sandboxes as Docker containers (see the module docstring for the isolation settings)."""

    name = "docker"

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 6 * 3600,
        default_image: str = DEFAULT_IMAGE,
        runtime: str | None = None,
        docker_cli: str = "docker",
        client_timeout_s: float = 600.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        bridge_root: str | Path | None = None,
    ) -> None:
        super().__init__(owner_id, lease_s)
        self.max_output_bytes = max_output_bytes
        root = Path(
            bridge_root or os.environ.get("SANDGYM_DOCKER_BRIDGE_ROOT") or DEFAULT_BRIDGE_ROOT
        )
        if not root.is_absolute():
            raise ValueError(f"bridge_root must be an absolute path, got {str(root)!r}")
        longest = len(str(root / "sg-000000000000")) + 1 + _BRIDGE_SOCKET_NAME_MAX
        if longest > _MAX_UNIX_PATH:
            raise ValueError(
                f"bridge_root {str(root)!r} is too long for unix sockets: sockets in it would "
                f"need {longest} bytes, at most {_MAX_UNIX_PATH} fit; choose a shorter directory"
            )
        self.bridge_root = root
        self.default_image = default_image
        self.runtime = runtime
        self.docker_cli = docker_cli
        self.client_timeout_s = client_timeout_s
        self._docker: Any = None
        self._client_lock = threading.Lock()
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._storage_opt_ok: bool | None = None
        self._storage_driver: str | None = None  # `docker info` Driver, asked once
        self._storage_quota_label = ""  # the engine's sandgym.storage-quota label (setup.sh)
        self.builds = 0  # how many images this backend built (the rest were cache hits)

    # -- the client --------------------------------------------------------------------------
    def _client(self) -> Any:
        """(Thread) the shared DockerClient, connected on first use."""
        with self._client_lock:
            if self._docker is None:
                try:
                    import docker
                except ImportError as exc:
                    raise BackendUnavailableError(
                        "the docker backend needs the Docker SDK: pip install 'sandgym[docker]'"
                    ) from exc
                try:
                    client = docker.from_env(timeout=int(self.client_timeout_s), max_pool_size=64)
                    client.ping()
                except Exception as exc:
                    raise BackendUnavailableError(
                        f"no Docker engine answers (expected `docker info` to work; got: {exc})"
                    ) from exc
                self._docker = client
            return self._docker

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless a Docker engine answers."""
        await asyncio.to_thread(self._client)

    async def aclose(self) -> None:
        client, self._docker = self._docker, None
        if client is not None:
            await asyncio.to_thread(client.close)

    # -- images ------------------------------------------------------------------------------
    async def _image_exists(self, ref: str) -> bool:
        import docker.errors

        try:
            await asyncio.to_thread(self._client().api.inspect_image, ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    async def remove_snapshot(self, snapshot: str) -> None:
        import docker.errors

        if not snapshot.startswith(GROUP_SNAPSHOT_REPO + ":"):
            raise SandboxError(f"expected a {GROUP_SNAPSHOT_REPO}:* snapshot, got {snapshot!r}")
        # Not forced: a forced removal of an image a container still uses only untags it, and
        # the untagged image then stays for good. In use, this raises; the caller retries.
        try:
            await asyncio.to_thread(self._client().api.remove_image, snapshot)
        except docker.errors.ImageNotFound:
            pass

    async def prepare(self, spec: SandboxSpec) -> str:
        """Build (once per content hash) the images a sandbox of `spec` and its services run;
        `built` when any was built now, else `reused`."""
        before = self.builds
        await self.image_for(spec)
        for svc in spec.services:
            probe = SandboxSpec(
                image=svc.image or None, build_context=svc.build_context, dockerfile=svc.dockerfile
            )
            try:
                await self.image_for(probe)
            except SandboxCreateError as exc:
                raise SandboxCreateError(f"service {svc.name!r}: {exc}") from exc
        return "built" if self.builds > before else "reused"

    async def image_for(self, spec: SandboxSpec) -> str:
        """The image a sandbox of `spec` runs: by name, or built (once per content hash)."""
        if spec.build_context is None:
            image = spec.image or self.default_image
            if not await self._image_exists(image):
                raise SandboxCreateError(
                    f"image {image!r} is not present in the local Docker engine and no registry "
                    "is used; build it (images/bootstrap-base.sh makes sandgym/terminal:latest)"
                )
            return image
        ctx = Path(spec.build_context)
        if not (ctx / spec.dockerfile).is_file():
            raise SandboxCreateError(
                f"expected a {spec.dockerfile} in build context {ctx}, found none"
            )
        digest = await asyncio.to_thread(spec.context_hash)
        assert digest is not None
        tag = f"{CTX_REPO}:{digest[:16]}"
        lock = self._build_locks.setdefault(digest, asyncio.Lock())
        async with lock:
            if await self._image_exists(tag):
                return tag
            await asyncio.to_thread(self._build, ctx, spec.dockerfile, tag)
            self.builds += 1
        return tag

    def _build(self, ctx: Path, dockerfile: str, tag: str) -> None:
        """(Thread) docker build; the build log's tail goes into the error on failure."""
        api = self._client().api
        tail: list[str] = []
        error: str | None = None
        for item in api.build(
            path=str(ctx),
            dockerfile=dockerfile,
            tag=tag,
            rm=True,
            forcerm=True,
            decode=True,
            labels={LABEL_MANAGED: "1", "sandgym.context": tag},
        ):
            if "stream" in item:
                tail = (tail + [item["stream"]])[-30:]
            if "error" in item:
                error = item["error"]
        if error is not None:
            log_tail = "".join(tail).strip()
            raise SandboxCreateError(
                f"building {ctx}/{dockerfile} failed: {error.strip()}\n--- build log tail ---\n{log_tail}"
            )

    # -- create / remove ---------------------------------------------------------------------
    def _confinement(self, spec: SandboxSpec, image_mb: int = 0) -> dict[str, Any]:
        """Host-config options every container of a sandbox gets (the sandbox's own and its
        verifier's): Docker's init, the reduced capabilities, `no-new-privileges`, and the
        spec's CPU, memory, pids and storage limits. `image_mb`: what the storage quota must
        leave for the image's own files on top of `storage_mb` (see `_quota_image_mb`)."""
        host: dict[str, Any] = dict(
            init=True,
            cap_drop=["ALL"],
            cap_add=CAP_ADD,
            security_opt=["no-new-privileges"],
        )
        if spec.cpus:
            # A 10 ms CFS period (Docker's --cpus uses 100 ms): see cgroups.CPU_PERIOD_US.
            host["cpu_period"] = CPU_PERIOD_US
            host["cpu_quota"] = int(spec.cpus * CPU_PERIOD_US)
        if spec.memory_mb:
            host["mem_limit"] = f"{spec.memory_mb}m"
            host["memswap_limit"] = f"{spec.memory_mb}m"  # equal: no swap on top
        if spec.pids_limit:
            host["pids_limit"] = spec.pids_limit
        if spec.storage_mb:
            # A per-file size cap (RLIMIT_FSIZE, bytes; execs inherit it): the storage quota
            # below works only on an engine that supports `--storage-opt size` (btrfs driver;
            # overlay2 over xfs with pquota), and without it one `dd` could fill the host's
            # disk. The cap holds on any filesystem; many files can still add up past
            # storage_mb where the quota is unsupported.
            import docker.types

            size = spec.storage_mb * 2**20
            host["ulimits"] = [docker.types.Ulimit(name="fsize", soft=size, hard=size)]
        if self.runtime:
            host["runtime"] = self.runtime
        if spec.storage_mb and self._storage_opt_ok is not False:
            host["storage_opt"] = {"size": f"{spec.storage_mb + image_mb}M"}
        return host

    def _driver(self) -> str:
        """(Thread) the engine's storage driver (`docker info` Driver), asked once, with the
        engine label `sandgym.storage-quota` (`simple`/`full`) that scripts/setup.sh sets on
        the btrfs engine it makes."""
        if self._storage_driver is None:
            try:
                info = self._client().api.info()
            except Exception as exc:  # the create that follows reports an engine that is gone
                log.debug("docker: could not read the storage driver: %s", exc)
                return ""
            for label in info.get("Labels") or []:
                key, _, value = str(label).partition("=")
                if key == "sandgym.storage-quota":
                    self._storage_quota_label = value
            self._storage_driver = str(info.get("Driver") or "")
        return self._storage_driver

    def _quota_counts_image(self) -> bool:
        """Whether the engine's storage quota also counts the image's own files: the btrfs
        driver under full qgroups (a snapshot references its image's data), not under simple
        quotas (kernel >= 6.7; usage counts only what the container writes)."""
        return self._driver() == "btrfs" and self._storage_quota_label != "simple"

    def _quota_image_mb(self, image: str) -> int:
        """(Thread) MiB the storage quota leaves for the image's own files.

        overlay2 (over xfs with pquota) limits only the container's upper dir, and the btrfs
        driver under simple quotas counts only what the container writes: 0. Under full
        qgroups the btrfs driver limits the container's whole subvolume (a qgroup's
        referenced bytes), which starts out holding the image: its size is added, by 8 % more
        than `docker image inspect` says, since the subvolume counts whole blocks (measured:
        1.07x the inspected size for the bookworm base image, 1.05x for sandgym/terminal,
        0.95x for sandgym/desktop, whose layers overwrite files). So a sandbox gets at least
        about `storage_mb` of room for new data, at most `storage_mb` plus ~13 % of its image;
        deleting the image's files frees room for more."""
        if not self._quota_counts_image():
            return 0
        size = int(self._client().api.inspect_image(image).get("Size") or 0)
        return -(-size * 108 // (100 * 2**20))

    def check_network(self, spec: SandboxSpec) -> None:
        """Every policy, and any switch between them: public is the engine's bridge network
        (attached and detached per phase), the others loopback only, an allowlist with its
        proxy in the container's namespace (which needs the engine's host: checked at create)."""

    def check_services(self, spec: SandboxSpec) -> None:
        """Any group: the services run beside the sandbox (`sandboxes.docker_group`)."""

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        import docker.errors

        from sandboxes.health import ensure_healthy

        await self.ensure_available()
        image = spec.snapshot or await self.image_for(spec)
        labels = await asyncio.to_thread(self.labels_for, spec)
        sandbox_id = "sg-" + uuid.uuid4().hex[:12]
        bridge_dir = self.bridge_root / sandbox_id
        labels[LABEL_BRIDGE_DIR] = str(bridge_dir)
        image_mb = 0
        if spec.storage_mb and self._storage_opt_ok is not False:
            image_mb = await asyncio.to_thread(self._quota_image_mb, image)
        self.check_network(spec)
        group = DockerGroup(self, spec, sandbox_id, labels) if spec.services else None
        host: dict[str, Any] = dict(
            # A sandbox that is public in some phase starts on the bridge and is disconnected
            # from it for its restricted phases (a container made with `none` can never join
            # a network); one that never is public has loopback only, from the start. One
            # with services is on its group's network in every phase (docker_group).
            network_mode=group.network
            if group is not None
            else ("bridge" if spec.ever_public else "none"),
            binds={str(bridge_dir): {"bind": BRIDGE_MOUNT, "mode": "ro"}},
            **self._confinement(spec, image_mb),
        )
        api = self._client().api
        pids: dict[str, int] = {}
        has_health: set[str] = set()  # containers whose image has a HEALTHCHECK

        def create_and_start() -> str:
            # Low-level calls: create + start (+ one inspect, for the fast liveness check).
            _make_bridge_dir(bridge_dir)
            extra = group.main_create_kwargs() if group is not None else {}
            resp = api.create_container(
                image,
                entrypoint=["/bin/sh", "-c", MAIN_BOOT, HELPER_SCRIPT],
                command=[],
                name=sandbox_id,
                hostname=sandbox_id,
                labels=labels,
                environment={**(proxy_env() if spec.needs_proxy else {}), **spec.env},
                working_dir=spec.workdir,  # Docker creates it when missing
                host_config=api.create_host_config(**host),
                **extra,
            )
            if group is not None and spec.ever_public:
                api.connect_container_to_network(resp["Id"], "bridge")
            api.start(resp["Id"])
            container_id: str = resp["Id"]
            with contextlib.suppress(Exception):
                state = api.inspect_container(container_id)["State"]
                pids[container_id] = int(state["Pid"])
                if state.get("Health") is not None:
                    has_health.add(container_id)
            return container_id

        try:
            if group is not None:
                await group.start()
            try:
                container_id = await asyncio.to_thread(create_and_start)
            except docker.errors.APIError as exc:
                await self._remove_container(sandbox_id)
                if "storage_opt" in host and "qgroup" in str(exc).lower():
                    # btrfs: the image alone already holds more than the quota allows
                    raise SandboxCreateError(
                        f"docker could not start {image}: its storage quota "
                        f"({host['storage_opt']['size']}B, storage_mb={spec.storage_mb} plus "
                        f"{image_mb} MiB for the image) is below what the image itself holds "
                        f"on this btrfs engine; raise storage_mb ({exc})"
                    ) from exc
                if "storage_opt" not in host or "storage" not in str(exc).lower():
                    raise SandboxCreateError(f"docker could not start {image}: {exc}") from exc
                # Only the btrfs driver and overlay2 on xfs with pquota (and a few others)
                # support a size limit.
                self._storage_opt_ok = False
                log.warning(
                    "docker: storage bound in force: a per-file cap (RLIMIT_FSIZE) at storage_mb "
                    "only; this engine (storage driver %r) refuses a total quota (%s), so many "
                    "files can add up past storage_mb (scripts/setup.sh: "
                    "SANDGYM_DOCKER_STORAGE=btrfs-quota makes an engine that has one)",
                    self._storage_driver,
                    exc,
                )
                host.pop("storage_opt")
                try:
                    container_id = await asyncio.to_thread(create_and_start)
                except docker.errors.APIError as exc2:
                    await self._remove_container(sandbox_id)
                    raise SandboxCreateError(f"docker could not start {image}: {exc2}") from exc2
        except BaseException:
            # Cancelled or failed mid-create: the container may exist already; do not leak it.
            await asyncio.shield(self._remove_container(sandbox_id))
            if group is not None:
                await asyncio.shield(group.remove())
            await asyncio.shield(asyncio.to_thread(_remove_bridge_dir, bridge_dir))
            raise
        if "storage_opt" in host and self._storage_opt_ok is None:
            self._storage_opt_ok = True
            log.info(
                "docker: storage bound in force: a total quota per sandbox (`--storage-opt "
                "size`, storage driver %r: %s) and a per-file cap at storage_mb",
                self._storage_driver,
                "image + storage_mb, a btrfs qgroup"
                if self._quota_counts_image()
                else "storage_mb of the sandbox's own writes",
            )
        sb = DockerSandbox(spec, self, container_id, sandbox_id)
        sb._bridge_dir = bridge_dir
        sb._watch_host_pid(pids.get(container_id))
        sb._on_bridge = spec.ever_public
        sb._group = group
        try:
            await sb._start_network(pids.get(container_id))
            if container_id in has_health:  # the image's HEALTHCHECK: Docker's own status
                await wait_docker_health(api, container_id, f"sandbox {sandbox_id}")
        except BaseException:
            await asyncio.shield(sb.close())
            raise
        await ensure_healthy(sb)  # spec.healthcheck (Harbor's), run inside; closes on failure
        return sb

    async def _remove_container(self, ref: str) -> None:
        import docker.errors

        try:
            await asyncio.to_thread(self._client().api.remove_container, ref, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            # "removal already in progress" means someone else is doing our job.
            if "already in progress" not in str(exc):
                raise

    # -- reaping -----------------------------------------------------------------------------
    async def managed_containers(self) -> list[dict[str, Any]]:
        """Every container (running or not) carrying `sandgym.managed=1`."""
        api = (await asyncio.to_thread(self._client)).api
        found: list[dict[str, Any]] = await asyncio.to_thread(
            api.containers, all=True, filters={"label": f"{LABEL_MANAGED}=1"}
        )
        return found

    async def owned_sandbox_ids(self) -> list[str]:
        """Names (= sandbox ids) of every container, in any state, labelled with this backend's
        owner id: one filtered list call."""
        api = (await asyncio.to_thread(self._client)).api
        found: list[dict[str, Any]] = await asyncio.to_thread(
            api.containers,
            all=True,
            filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_OWNER}={self.owner_id}"]},
        )
        ids = [
            # a service container stands for its group's sandbox (docker_group)
            (c.get("Labels") or {}).get(LABEL_GROUP_OF)
            or (c.get("Names") or [c["Id"]])[0].lstrip("/")
            for c in found
            if LABEL_VERIFIER_OF not in (c.get("Labels") or {})  # a verify's, removed by it
        ]
        owner = [f"{LABEL_MANAGED}=1", f"{LABEL_OWNER}={self.owner_id}"]
        ids += await asyncio.to_thread(owned_group_ids, api, owner)
        return list(dict.fromkeys(i for i in ids if i))

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Remove container `sandbox_id` and its bridge directory; only a container labelled
        with this backend's owner id (SandboxError for any other), none when it is gone."""
        import docker.errors

        api = (await asyncio.to_thread(self._client)).api
        owner = {LABEL_MANAGED: "1", LABEL_OWNER: self.owner_id}
        try:
            info = await asyncio.to_thread(api.inspect_container, sandbox_id)
        except docker.errors.NotFound:
            await asyncio.to_thread(remove_group, api, sandbox_id, owner)  # a group's rest
            return
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_MANAGED) != "1" or labels.get(LABEL_OWNER) != self.owner_id:
            raise SandboxError(
                f"expected container {sandbox_id!r} to be labelled {LABEL_OWNER}={self.owner_id}"
                f", found {LABEL_OWNER}={labels.get(LABEL_OWNER)!r}: not removing it"
            )
        await self._remove_container(info["Id"])
        await asyncio.to_thread(remove_group, api, sandbox_id, owner)
        bridge = labels.get(LABEL_BRIDGE_DIR)
        if bridge and Path(bridge).name == sandbox_id:  # only ever a directory named for it
            await asyncio.to_thread(_remove_bridge_dir, Path(bridge))

    async def prune_context_images(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Remove the `sandgym/ctx:*` images (built from task build contexts) that no
        container uses, running or stopped. They are rebuilt on the next episode that needs
        them. Returns (removed tags, [(tag, error)])."""
        await self.ensure_available()

        def go() -> tuple[list[str], list[tuple[str, str]]]:
            api = self._client().api
            in_use = {c.get("ImageID") for c in api.containers(all=True)}
            removed: list[str] = []
            errors: list[tuple[str, str]] = []
            for img in api.images(name=CTX_REPO):
                if img["Id"] in in_use:
                    continue
                for tag in img.get("RepoTags") or []:
                    if not tag.startswith(CTX_REPO + ":"):
                        continue
                    try:
                        api.remove_image(tag, noprune=False)
                    except Exception as exc:
                        errors.append((tag, str(exc)))
                    else:
                        removed.append(tag)
            return removed, errors

        return await asyncio.to_thread(go)

    async def reap_matching(
        self, *, everything: bool = False, owner_id: str | None = None
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Remove the managed containers `reaper.should_reap` selects.

        Returns (removed names, [(name, error)]).
        """
        from sandboxes.reaper import should_reap

        removed: list[str] = []
        errors: list[tuple[str, str]] = []
        containers = await self.managed_containers()
        for c in containers:
            labels = c.get("Labels") or {}
            name = (c.get("Names") or [c["Id"]])[0].lstrip("/")
            if not should_reap(labels, owner_id=owner_id, everything=everything):
                continue
            try:
                await self._remove_container(c["Id"])
            except Exception as exc:
                errors.append((name, str(exc)))
            else:
                removed.append(name)
                bridge = labels.get(LABEL_BRIDGE_DIR)
                if bridge and Path(bridge).name == name:  # only ever a directory named for it
                    await asyncio.to_thread(_remove_bridge_dir, Path(bridge))
        await asyncio.to_thread(
            reap_group_networks,
            self._client().api,
            lambda labels: should_reap(labels, owner_id=owner_id, everything=everything),
            removed,
            errors,
        )
        live = {(c.get("Names") or [c["Id"]])[0].lstrip("/") for c in containers} - set(removed)
        await asyncio.to_thread(_sweep_bridge_root, self.bridge_root, live)
        await self._reap_snapshots(removed, errors, owner_id=owner_id, everything=everything)
        return removed, errors

    async def _reap_snapshots(
        self,
        removed: list[str],
        errors: list[tuple[str, str]],
        *,
        everything: bool,
        owner_id: str | None,
    ) -> None:
        """Remove the verifier snapshot images (`DockerSandbox.exec_private`) that
        `reaper.should_reap` selects by their labels (those of the sandbox they were taken
        of): what a server that died mid-verify left. Their containers went first."""
        from sandboxes.reaper import should_reap

        api = self._client().api
        images = await asyncio.to_thread(api.images, filters={"label": LABEL_VERIFIER_OF})
        images += await asyncio.to_thread(api.images, filters={"label": LABEL_SNAPSHOT_OF})
        for img in images:
            labels = img.get("Labels") or {}
            if not should_reap(labels, owner_id=owner_id, everything=everything):
                continue
            tags = [t for t in img.get("RepoTags") or [] if t != "<none>:<none>"]
            for tag in tags or [img["Id"]]:  # an untagged one by its id
                try:
                    await asyncio.to_thread(api.remove_image, tag)
                except Exception as exc:
                    errors.append((tag, str(exc)))
                else:
                    removed.append(tag)

    async def reap(self, only_expired: bool = True) -> list[str]:
        removed, errors = await self.reap_matching(owner_id=None if only_expired else self.owner_id)
        for name, err in errors:
            log.warning("docker reap: could not remove %s: %s", name, err)
        return removed

"""The `local` backend, the embedded default: bubblewrap sandboxes, no Docker needed.

Each sandbox is a private directory tree `<root>/<id>/fs` that becomes `/` inside a bubblewrap
namespace set (own user, pid, net, ipc, uts, cgroup namespaces). The host's system directories
(`/usr`, `/etc`, the `/bin`-style links) are bound read-only; everything else (`/app`, `/logs`,
`/tests`, `/tmp`, `/root`, the workdir...) is private and writable, and visible to the host, so
the file API is plain file I/O. One long-lived init process holds the namespaces; `exec` and the
shell join them with `nsenter`, so a service started by the agent is visible to the verifier.

Limits: a cgroup per sandbox (memory, pids, CPU) when cgroups are writable, and a sub-cgroup per
`exec` so a timeout kills the whole tree, daemons included. Without cgroups: rlimits (weaker;
logged). Without bwrap at all: a plain-directory mode with no isolation, which says so loudly.
Network follows the spec's policy (`sandboxes.network`): public shares the host's network,
no-network keeps the namespace's loopback only, allowlist adds an egress proxy listening inside
it (`sandboxes.egress`). `sandbox.close()` kills the cgroup and deletes the
tree; if the server dies, `--die-with-parent` ends the sandbox and `sandgym reap` removes the
tree (each holds a `labels.json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import posixpath
import shlex
import shutil
import signal
import time
import uuid
from pathlib import Path

from sandboxes import cgroups
from sandboxes.base import (
    LABEL_OWNER,
    SandboxBackend,
    normalize_sandbox_path,
    owner_is_gone,
)
from sandboxes.common.files import remove_tree
from sandboxes.common.lazy_shell import ShellSandbox
from sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES, CappedBuffer
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
from sandboxes.reaper import local_root
from sandboxes.shell import PexpectShell
from sandboxes.spec import ExecResult, SandboxSpec

log = logging.getLogger(__name__)

#: Host directories bound read-only into every sandbox (links like /bin -> usr/bin are copied).
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Private writable directories every sandbox has.
PRIVATE_DIRS = (
    "app",
    "logs/verifier",
    "logs/agent",
    "tests",
    "tmp",
    "root",
    "home",
    "workspace",
    "testbed",
    "var/tmp",
    "run",
    "opt",
    "srv",
    "mnt",
)
#: directories of the verifier (tests copied in at scoring time, its reward files): fixed mount
#: points in the sandbox, see `LocalSandbox.exec_private`
VERIFIER_MOUNTS = ("logs", "logs/verifier", "tests")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class _Capture:
    """Reads one stream in the background into a capped buffer (the rest is counted)."""

    def __init__(self, stream: asyncio.StreamReader | None, limit: int) -> None:
        self.out = CappedBuffer(limit)
        self.task = asyncio.ensure_future(self._pump(stream))

    async def _pump(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            self.out.add(chunk)

    async def finish(self, grace_s: float) -> tuple[str, bool]:
        """Wait up to `grace_s` for EOF (a background child may hold the pipe), then stop."""
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self.task), grace_s)
        self.task.cancel()
        return self.out.text()


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes) -> None:
    """Write `data` to a child's stdin and close it (a child that stops reading is fine)."""
    if pipe is None:
        return
    with contextlib.suppress(ConnectionError, OSError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(Exception):
        pipe.close()


class LocalSandbox(ShellSandbox):
    backend_name = "local"

    def __init__(self, spec: SandboxSpec, backend: LocalBackend, sandbox_id: str) -> None:
        super().__init__(spec, sandbox_id)
        self.backend = backend
        self.dir = backend.root / sandbox_id
        self.fs = self.dir / "fs"
        self.cg: cgroups.CgroupSet | None = None
        self.init_proc: asyncio.subprocess.Process | None = None
        self.init_pid: int | None = None  # host pid of the namespace init (bwrap's child)
        self.env = {"PATH": DEFAULT_PATH, "HOME": "/root", "TERM": "xterm", "LANG": "C.UTF-8"}
        if spec.needs_proxy:
            self.env.update(proxy_env())
        self.env.update(spec.env)
        self._proxy: EgressProxy | None = None

    @property
    def bridge_dir(self) -> Path:
        """`/run/sandgym` of the sandbox's root tree (the root is a host directory)."""
        return self.fs / "run" / "sandgym"

    # -- lifecycle ---------------------------------------------------------------------------
    async def _start(self) -> None:
        b = self.backend
        await asyncio.to_thread(self._make_tree)
        if b.use_cgroups:
            self.cg = cgroups.CgroupSet(self.id)
            await asyncio.to_thread(
                self.cg.create, self.spec.memory_mb, self.spec.pids_limit, self.spec.cpus
            )
        if not b.use_bwrap:
            return
        info_r, info_w = os.pipe()
        argv = self._join_prefix() + self._bwrap_argv(info_fd=info_w)
        try:
            self.init_proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(info_w,),
                start_new_session=True,
            )
        finally:
            os.close(info_w)
        try:
            raw = await asyncio.wait_for(asyncio.to_thread(_read_all, info_r), 10)
            self.init_pid = int(json.loads(raw)["child-pid"])
            # The info fd is written before the mounts are done; the init's "ready" line is not.
            assert self.init_proc.stdout is not None
            ready = await asyncio.wait_for(self.init_proc.stdout.readline(), 10)
            if ready.strip() != b"ready":
                raise RuntimeError(f"init printed {ready!r} instead of 'ready'")
        except Exception as exc:
            err = b""
            if self.init_proc.stderr is not None:
                with contextlib.suppress(Exception):
                    err = await asyncio.wait_for(self.init_proc.stderr.read(4096), 1)
            raise SandboxCreateError(
                f"bwrap did not start: expected its child pid on the info fd, got {exc!r}; "
                f"stderr: {err.decode(errors='replace').strip()}"
            ) from exc
        if self.spec.needs_proxy:
            # The allowlist's proxy listens inside the sandbox's own network namespace.
            self._proxy = EgressProxy(self.id, self.network)
            await self._proxy.start(f"/proc/{self.init_pid}/ns/net")

    def _make_tree(self) -> None:
        # Labels first: a reaper (another server starting up) skips a directory without them,
        # so a tree being created here is never taken for an orphan.
        self.dir.mkdir(parents=True)
        (self.dir / "labels.json").write_text(json.dumps(self.backend.labels_for(self.spec)))
        if self.spec.snapshot is not None:  # a copy of a prepared sandbox's tree
            src = self.backend.snapshot_dir(self.spec.snapshot) / "fs"
            if not src.is_dir():
                raise SandboxCreateError(f"local snapshot {self.spec.snapshot!r} does not exist")
            _copy_tree(src, self.fs)
        else:
            self.fs.mkdir()
        for d in PRIVATE_DIRS + VERIFIER_MOUNTS:
            (self.fs / d).mkdir(parents=True, exist_ok=True)
        for d in ("tmp", "var/tmp"):
            os.chmod(self.fs / d, 0o1777)
        os.chmod(self.fs / "logs/verifier", 0o777)
        (self.fs / self.spec.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def _bwrap_argv(self, info_fd: int) -> list[str]:
        argv = ["bwrap", "--bind", str(self.fs), "/"]
        for name in SYSTEM_DIRS:
            host = Path("/") / name
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), "/" + name]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), "/" + name]
        # The host's /etc is shared read-only, but its secrets are not: sandbox root is host
        # root (user namespace) when the server runs as root, and could read them.
        for secret in _host_secret_files():
            argv += ["--ro-bind", "/dev/null", secret]
        # The verifier's directories are mount points (bound onto themselves), so the agent
        # can neither remove nor rename them (EBUSY): `exec_private` stacks private mounts on
        # them, and a directory swapped underneath would detach those.
        for d in VERIFIER_MOUNTS:
            argv += ["--bind", str(self.fs / d), "/" + d]
        argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/dev/shm"]
        argv += [
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
        ]
        if self.spec.network.mode != "public":  # check_network: then no phase is public
            argv += ["--unshare-net"]
        else:
            for f in ("/etc/resolv.conf",):
                if Path(f).exists():
                    argv += ["--ro-bind", f, f]
        argv += ["--die-with-parent", "--info-fd", str(info_fd), "--chdir", self.spec.workdir]
        argv += ["--clearenv"]
        for k, v in self.env.items():
            argv += ["--setenv", k, v]
        argv += ["sh", "-c", "echo ready; exec sleep infinity"]
        return argv

    def _join_prefix(self, cg: cgroups.CgroupSet | None = None) -> list[str]:
        """argv prefix that joins the cgroups (or sets rlimits), then execs the rest.

        A tiny `sh` does it instead of a `preexec_fn`, so the server never forks its own (big)
        process on the event loop: without preexec_fn, Python spawns with vfork.
        """
        group = cg or self.cg
        steps = ["ulimit -c 0"]
        if self.spec.storage_mb:
            # No quota on the sandbox tree: a per-file size cap (sh counts 512-byte blocks) at
            # least keeps one runaway file from filling the host's disk.
            steps.append(f"ulimit -f {self.spec.storage_mb * 2048}")
        if group is not None:
            targets = " ".join(shlex.quote(p) for p in group.join_paths())
            steps.append(f'for f in {targets}; do echo $$ > "$f"; done')
        elif self.spec.memory_mb:
            steps.append(f"ulimit -v {self.spec.memory_mb * 1024 * 4} 2>/dev/null")
        return ["sh", "-c", "; ".join(steps) + '; exec "$@"', "sh"]

    async def _destroy(self) -> None:
        await asyncio.shield(self._teardown())

    async def snapshot(self) -> str:
        """A copy of this sandbox's tree (regular files, directories, links; no sockets or
        FIFOs) under the backend's root, labelled like it."""
        await self._check_live()
        snap = "snap-" + uuid.uuid4().hex[:12]
        dest = self.backend.snapshot_dir(snap)

        def copy() -> None:
            dest.mkdir(parents=True)
            labels = {**self.backend.labels_for(self.spec), "sandgym.snapshot_of": self.id}
            (dest / "labels.json").write_text(json.dumps(labels))
            _copy_tree(self.fs, dest / "fs")

        try:
            await asyncio.to_thread(copy)
        except BaseException:
            await asyncio.to_thread(_rmtree, dest)
            raise
        return snap

    async def _apply_network(self, policy: NetworkPolicy) -> None:
        """Between no-network and allowlist phases (`check_network` allows no other switch):
        the namespace stays loopback-only, the proxy's policy changes."""
        assert self._proxy is not None
        self._proxy.set_policy(policy)

    async def _teardown(self) -> None:
        if self._proxy is not None:
            with contextlib.suppress(Exception):
                await self._proxy.close()
        await self._close_shell()
        if self.init_proc is not None and self.init_proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.init_proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.init_proc.wait(), 5)
        if self.cg is not None:
            await asyncio.to_thread(self.cg.remove)
        await asyncio.to_thread(_rmtree, self.dir)
        self.backend.live.discard(self.id)

    async def is_alive(self) -> bool:
        if self._closed or not self.fs.is_dir():
            return False
        if self.init_proc is None:
            return True  # no-bwrap mode: alive while the tree exists
        if self.init_proc.returncode is not None or self.init_pid is None:
            return False
        try:
            os.kill(self.init_pid, 0)
        except ProcessLookupError:
            return False
        return True

    async def _check_live(self) -> None:
        self._check_open()
        if not await self.is_alive():
            raise SandboxLostError(f"local sandbox {self.id} is gone (its init process died)")

    # -- commands ----------------------------------------------------------------------------
    def _enter_argv(self, cwd: str, env: dict[str, str], caps: bool = False) -> list[str]:
        """argv prefix entering the sandbox's namespaces. Entering its user namespace would give
        every capability in it; unless `caps`, they are all dropped (the agent is root of the
        sandbox without capabilities: it owns its files but cannot mount, join other mount
        namespaces, or read /proc entries of processes that hold capabilities)."""
        envv = [f"{k}={v}" for k, v in env.items()]
        if self.init_pid is None:  # no-bwrap mode: a chdir into the tree, no isolation
            return ["env", "-i", *envv]
        argv = ["nsenter", "-t", str(self.init_pid), "-a", "-r", f"--wdns={cwd}"]
        if not caps:
            argv += [
                "setpriv",
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
        return [*argv, "env", "-i", *envv]

    async def exec(self, cmd, timeout_s=60.0, cwd=None, env=None, user=None) -> ExecResult:
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        switch = user not in (None, "root", "0")
        if switch:  # setpriv needs the capabilities to switch; the new uid has none after it
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        return await self._exec(argv, timeout_s, cwd, env, caps=switch)

    @property
    def supports_private_exec(self) -> bool:
        return self.init_pid is not None

    async def exec_private(
        self,
        cmd: list[str],
        stdin: bytes,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """`cmd` in a mount namespace of its own (`unshare -m`, private propagation), as root
        of the sandbox *with* its capabilities, so it may mount tmpfs over the fixed mount
        points of VERIFIER_MOUNTS. The agent's processes have no capabilities: they can
        neither join that namespace nor reach its files through /proc/PID/root, and cannot
        detach its mounts by removing or renaming the directories under them."""
        if not self.supports_private_exec:
            raise SandboxError(f"local sandbox {self.id} runs without bwrap: no private exec")
        argv = ["unshare", "-m", "--propagation", "private", *cmd]
        return await self._exec(argv, timeout_s, cwd, env, caps=True, stdin=stdin)

    async def _exec(
        self,
        argv: list[str],
        timeout_s: float,
        cwd: str | None,
        env: dict[str, str] | None,
        caps: bool,
        stdin: bytes | None = None,
    ) -> ExecResult:
        await self._check_live()
        start = time.perf_counter()
        workdir = normalize_sandbox_path(cwd or self.spec.workdir, self.spec.workdir)
        full_env = {**self.env, **(env or {})}
        cg = self.cg.child("x" + uuid.uuid4().hex[:8]) if self.cg is not None else None
        host_cwd = None if self.init_pid is not None else str(self.fs / workdir.lstrip("/"))
        proc = await asyncio.create_subprocess_exec(
            *self._join_prefix(cg),
            *self._enter_argv(workdir, full_env, caps=caps),
            *argv,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            cwd=host_cwd,
        )
        feeder = None
        if stdin is not None:
            feeder = asyncio.ensure_future(_feed(proc.stdin, stdin))
        limit = self.backend.max_output_bytes
        out, err = _Capture(proc.stdout, limit), _Capture(proc.stderr, limit)
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
            # The whole tree dies: the exec's own cgroup holds every process it started.
            if cg is not None:
                await asyncio.to_thread(cg.kill_all)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            if feeder is not None:
                feeder.cancel()
        stdout, t1 = await out.finish(0.2)
        stderr, t2 = await err.finish(0.05)
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=t1 or t2,
            duration_s=time.perf_counter() - start,
        )

    # -- shell -------------------------------------------------------------------------------
    async def _before_shell(self) -> None:
        await self._check_live()

    async def _start_shell(self) -> PexpectShell:
        argv = self._join_prefix() + self._enter_argv(self.spec.workdir, self.env)
        argv += ["bash", "--noprofile", "--norc", "-i"]
        shell = PexpectShell(
            argv,
            env={"PATH": os.environ.get("PATH", DEFAULT_PATH)},
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.backend.max_output_bytes,
        )
        await shell.start()
        return shell

    async def _run_helper(self, script: str) -> str:
        return (await self.exec(script, timeout_s=10)).stdout

    async def _shell_error(self, exc: SandboxLostError) -> SandboxLostError:
        await self._check_live()  # distinguish a dead sandbox from a dead shell
        return exc

    # -- files -------------------------------------------------------------------------------
    def _host_path(self, path: str, for_write: bool) -> Path:
        """Map a sandbox path to the host, refusing escapes (also through symlinks)."""
        p = _resolve_in_root(self.fs, normalize_sandbox_path(path, self.spec.workdir))
        if p is None:
            raise SandboxPathError(f"path {path!r}: too many levels of symbolic links")
        top = p.strip("/").split("/", 1)[0]
        if top in SYSTEM_DIRS:
            if for_write:
                raise SandboxPathError(f"path {path!r} ({p}) is read-only in a local sandbox")
            return Path(p)  # the host's own read-only system file, exactly what the sandbox sees
        if top in ("proc", "dev", "sys"):
            raise SandboxPathError(f"path {path!r} ({p}) is not a file the file API serves")
        return self.fs / p.lstrip("/")

    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        await self._check_live()
        host = self._host_path(path, for_write=True)
        data = content.encode() if isinstance(content, str) else content

        def _write() -> None:
            host.parent.mkdir(parents=True, exist_ok=True)
            if host.is_dir():
                raise SandboxPathError(f"path {path!r} is a directory")
            host.write_bytes(data)
            os.chmod(host, mode)

        await asyncio.to_thread(_write)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        await self._check_live()
        host = self._host_path(path, for_write=False)

        def _read() -> bytes:
            if not host.is_file():
                raise SandboxFileNotFoundError(f"no such file in sandbox: {path}")
            with open(host, "rb") as f:
                return f.read() if max_bytes is None else f.read(max_bytes)

        return await asyncio.to_thread(_read)

    async def upload(self, src: Path, dst: str) -> None:
        await self._check_live()
        host = self._host_path(dst, for_write=True)
        src = Path(src)

        def _copy() -> None:
            if src.is_dir():
                shutil.copytree(src, host, symlinks=True, dirs_exist_ok=True)
            else:
                host.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, host)

        await asyncio.to_thread(_copy)

    async def download(self, src: str, dst: Path) -> None:
        await self._check_live()
        host = self._host_path(src, for_write=False)
        dst = Path(dst)

        def _copy() -> None:
            if host.is_dir():
                shutil.copytree(host, dst, symlinks=True, dirs_exist_ok=True)
            elif host.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(host, dst)
            else:
                raise SandboxFileNotFoundError(f"no such file or directory in sandbox: {src}")

        await asyncio.to_thread(_copy)


#: Host files under the shared /etc that a sandbox must not read (hidden behind /dev/null).
SECRET_GLOBS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private/*", "/etc/docker/key.json",
)  # fmt: skip


def _host_secret_files() -> list[str]:
    import glob

    return sorted(p for pattern in SECRET_GLOBS for p in glob.glob(pattern) if os.path.isfile(p))


def _resolve_in_root(root: Path, path: str, depth: int = 0) -> str | None:
    """Resolve `path` component by component as the sandbox sees it (a symlink's absolute
    target is relative to the sandbox's /), returning the sandbox-absolute result; None when
    the links nest too deep. A link can never lead out of `root`: `..` stops at /."""
    if depth > 40:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    cur: list[str] = []
    for i, part in enumerate(parts):
        if part == "..":
            if cur:
                cur.pop()
            continue
        if cur and cur[0] in SYSTEM_DIRS:  # beyond this point the host's read-only tree
            cur.append(part)
            continue
        candidate = root.joinpath(*cur, part)
        if candidate.is_symlink():
            target = os.readlink(candidate)
            base = "/" if target.startswith("/") else "/" + "/".join(cur)
            rest = "/".join(parts[i + 1 :])
            joined = posixpath.normpath(posixpath.join(base, target)) if target else "/"
            return _resolve_in_root(root, joined + ("/" + rest if rest else ""), depth + 1)
        cur.append(part)
    return "/" + "/".join(cur)


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _copy_tree(src: Path, dst: Path) -> None:
    """`src` copied to `dst` (new) with modes, owners and links; sockets, FIFOs and devices
    (a gateway bridge's socket, what the agent made) are left out."""

    def ignore(dirpath: str, names: list[str]) -> set[str]:
        # bwrap's mount points at the top (the host's system directories, /dev, /proc) are
        # not the sandbox's files; copied, they would stop the copy's bwrap from starting
        out = set(SYSTEM_DIRS + ("dev", "proc")) & set(names) if dirpath == str(src) else set()
        for n in names:
            p = os.path.join(dirpath, n)
            if not (os.path.islink(p) or os.path.isfile(p) or os.path.isdir(p)):
                out.add(n)
        return out

    shutil.copytree(src, dst, symlinks=True, ignore=ignore)
    for dirpath, dirnames, filenames in os.walk(dst):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(src, os.path.relpath(p, dst)))
                os.lchown(p, st.st_uid, st.st_gid)


def _rmtree(path: Path) -> None:
    # Files the sandbox made read-only (chmod 000 dirs) must not stop the cleanup.
    remove_tree(path, ignore_errors=True)


class LocalBackend(SandboxBackend):
    """bubblewrap sandboxes under `root` (default: `sandboxes.reaper.local_root()`, in memory
    at /dev/shm/sandgym-local where possible)."""

    name = "local"

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 6 * 3600,
        root: Path | str | None = None,
        require_isolation: bool = False,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        super().__init__(owner_id, lease_s)
        self.root = Path(root) if root else local_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_output_bytes = max_output_bytes
        self.use_bwrap = shutil.which("bwrap") is not None and shutil.which("nsenter") is not None
        self.use_cgroups = os.geteuid() == 0 and cgroups.available()
        self.live: set[str] = set()
        if not self.use_bwrap:
            if require_isolation:
                raise BackendUnavailableError(
                    "local backend: bubblewrap (bwrap) and nsenter are required for isolation "
                    "but were not found; install the 'bubblewrap' package"
                )
            log.warning(
                "local backend: bwrap not found: sandboxes are plain directories with NO "
                "isolation (commands see the host filesystem and network). Install bubblewrap."
            )
        if not self.use_cgroups:
            log.warning(
                "local backend: cgroups are not writable here: falling back to rlimits; "
                "memory and process limits are weaker (no pids limit, no tree kill of daemons)"
            )

    def check_network(self, spec: SandboxSpec) -> None:
        """A sandbox shares the host's network (public) or has its own loopback-only namespace
        (no-network; allowlist through `sandboxes.egress`), fixed when it starts: a public
        phase beside a restricted one cannot be enforced, nor an allowlist without bwrap."""
        modes = {p.mode for p in spec.network_policies}
        if "public" in modes and len(modes) > 1:
            raise NetworkPolicyUnsupportedError(
                "the local backend cannot switch a sandbox between the host's network and a "
                f"restricted one ({[p.describe() for p in spec.network_policies]}); use docker"
            )
        if "allowlist" in modes and not self.use_bwrap:
            raise NetworkPolicyUnsupportedError(
                "the local backend without bubblewrap cannot enforce an allowlist network "
                "(install the 'bubblewrap' package)"
            )

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        from sandboxes.health import ensure_healthy

        self.check_network(spec)
        self.check_services(spec)
        if spec.user not in (None, "root", "0"):
            log.debug("local backend: spec.user=%s: exec(user=...) uses setpriv", spec.user)
        sb = LocalSandbox(spec, self, "sg-" + uuid.uuid4().hex[:12])
        self.live.add(sb.id)
        try:
            await sb._start()
        except BaseException:
            await asyncio.shield(sb.close())
            raise
        await ensure_healthy(sb)
        return sb

    async def owned_sandbox_ids(self) -> list[str]:
        """Names (= sandbox ids) of the trees under `root` whose labels.json names this
        backend's owner id (a tree without labels yet is being created: not listed)."""

        def scan() -> list[str]:
            found = []
            for d in self.root.glob("sg-*"):
                try:
                    labels = json.loads((d / "labels.json").read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(labels, dict) and labels.get(LABEL_OWNER) == self.owner_id:
                    found.append(d.name)
            return found

        return await asyncio.to_thread(scan)

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Kill what runs in the tree `sandbox_id` under `root`, drop its cgroups, remove it;
        only a tree labelled with this backend's owner id (SandboxError for any other)."""
        if not sandbox_id.startswith("sg-") or "/" in sandbox_id or "\0" in sandbox_id:
            raise SandboxError(f"expected a local sandbox id like sg-<hex>, got {sandbox_id!r}")
        d = self.root / sandbox_id
        try:
            labels = json.loads(await asyncio.to_thread((d / "labels.json").read_text))
        except FileNotFoundError:
            return  # gone already (or never labelled: then not known to be ours either)
        except (OSError, ValueError) as exc:
            raise SandboxError(
                f"local sandbox {sandbox_id}: unreadable labels.json: {exc}"
            ) from exc
        owner = labels.get(LABEL_OWNER) if isinstance(labels, dict) else None
        if owner != self.owner_id:
            raise SandboxError(
                f"expected local sandbox {sandbox_id} to be labelled {LABEL_OWNER}="
                f"{self.owner_id}, found {owner!r}: not removing it"
            )
        await asyncio.to_thread(cgroups.CgroupSet(sandbox_id).remove)
        await asyncio.to_thread(_rmtree, d)
        self.live.discard(sandbox_id)

    def snapshot_dir(self, snapshot: str) -> Path:
        if not snapshot.startswith("snap-") or "/" in snapshot or ".." in snapshot:
            raise SandboxError(f"expected a local snapshot id snap-..., got {snapshot!r}")
        return self.root / snapshot

    async def remove_snapshot(self, snapshot: str) -> None:
        await asyncio.to_thread(_rmtree, self.snapshot_dir(snapshot))

    async def reap(self, only_expired: bool = True) -> list[str]:
        """Remove sandbox trees (and snapshots) whose owner is gone (or all of ours with
        only_expired=False)."""
        removed: list[str] = []
        for d in [*self.root.glob("sg-*"), *self.root.glob("snap-*")]:
            try:
                labels = json.loads((d / "labels.json").read_text())
            except (OSError, ValueError):
                # No labels (yet): a tree another server is creating right now. Treating it
                # as an orphan (no lease = expired) deleted live sandboxes of other servers.
                continue
            mine = labels.get("sandgym.owner") == self.owner_id
            if d.name in self.live and mine:
                continue
            if owner_is_gone(labels) or (not only_expired and mine):
                await asyncio.to_thread(cgroups.CgroupSet(d.name).remove)
                await asyncio.to_thread(_rmtree, d)
                removed.append(d.name)
        return removed

"""`LocalSandbox`: a bubblewrap namespace set over a private root tree: its start (bwrap,
cgroups), commands through `nsenter` with each exec in a sub-cgroup of its own (a timeout kills
the whole tree), the private verifier exec, the lazily started shell, and plain file I/O."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sandgym.sandboxes import cgroups
from sandgym.sandboxes.base import SandboxCapabilities
from sandgym.sandboxes.common.files import checked_upload
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES
from sandgym.sandboxes.common.users import is_root_user
from sandgym.sandboxes.egress import EgressProxy, proxy_env
from sandgym.sandboxes.errors import (
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
    UserUnsupportedError,
)
from sandgym.sandboxes.lazy_shell import ShellSandbox
from sandgym.sandboxes.lifetime import first_deadline, write_deadline_file
from sandgym.sandboxes.local.changes import (
    diff_manifest,
    path_fingerprint,
    read_links,
    tree_manifest,
)
from sandgym.sandboxes.local.root import snapshot_path
from sandgym.sandboxes.local.spawn import Spawned, spawn
from sandgym.sandboxes.local.streams import _Capture, _feed, _read_all
from sandgym.sandboxes.local.tree import (
    PRIVATE_DIRS,
    SYSTEM_DIRS,
    VERIFIER_MOUNTS,
    _copy_tree,
    _host_secret_files,
    _resolve_in_root,
    _rmtree,
)
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.shell import PtyShell
from sandgym.sandboxes.spec import ExecResult, PathChanges, SandboxSpec
from sandgym.sandboxes.usage import SandboxUsage, tree_bytes

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


#: Where the sandbox sees its deadline (`sandgym.sandboxes.lifetime`): a read-only bind of the host
#: directory `<sandbox dir>/life`, which the server writes and the agent cannot.
LIFE_MOUNT = "/run/sandgym-life"

#: The sandbox's pid 1 (bwrap's `--as-pid-1` child): the host's bash, bound read-only, that says
#: it is up and then keeps the deadline with builtins alone, forking nothing and waiting on no
#: child. The kernel shields a namespace's pid 1 from the signals sent inside it (SIGKILL and
#: SIGSTOP never arrive, others only when it has a handler, and it ignores the terminating ones),
#: so no process in the sandbox can stop or kill it, and stopping or killing any other process
#: cannot block it; it needs no new pid, memory or disk, so neither a fork bomb nor a full disk
#: holds it. It holds LIFE_MOUNT as its working directory and, once a second (`read -t 1` on a
#: pipe it holds both ends of), reads `deadline` there; past it, it exits, which ends the
#: sandbox. As pid 1 it reaps the namespace's orphans (bash's SIGCHLD handler waits for any pid).
INIT_SCRIPT = (
    "trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE VTALRM PROF XCPU XFSZ TSTP TTIN TTOU; "
    "cd %s 2>/dev/null || cd /; exec 3<> <(:); echo ready; "
    "while :; do printf -v n '%%(%%s)T' -1; "
    "if read -r d 2>/dev/null < deadline && [[ $d =~ ^[0-9]+$ ]] && ((n > d)); then "
    "exit 0; fi; read -t 1 -u 3; done"
) % LIFE_MOUNT


def local_user_refusal(user: object) -> str:
    """Why the local backend refuses to run a command as `user` (not root)."""
    return (
        f"the local backend runs every command as root (its user namespace maps uid 0 alone); "
        f"user {user!r} needs the docker backend"
    )


class LocalSandbox(ShellSandbox):
    backend_name = "local"
    #: + private exec under bwrap; root alone (bwrap's user namespace maps uid 0 only)
    capabilities = SandboxCapabilities(lists_changes=True, other_users=False)

    def __init__(
        self,
        spec: SandboxSpec,
        sandbox_id: str,
        *,
        root: Path,
        labels: Callable[[], dict[str, str]],
        live: set[str],
        use_bwrap: bool,
        use_cgroups: bool,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        """Made by `LocalBackend.create`, which hands it what it uses: the backend's `root`
        (its tree goes under it), its `labels` (made afresh for each write: the lease moves
        on), the set of `live` sandbox ids (closing removes its own), whether bubblewrap
        isolates and cgroups limit it, and the output cap per stream."""
        super().__init__(spec, sandbox_id)
        self.root = root
        self._labels = labels
        self._live = live
        self.use_bwrap, self.use_cgroups = use_bwrap, use_cgroups
        self.max_output_bytes = max_output_bytes
        self.dir = root / sandbox_id
        self.fs = self.dir / "fs"
        self.cg: cgroups.CgroupSet | None = None
        self.init_proc: Spawned | None = None
        self.init_pid: int | None = None  # host pid of the namespace init (bwrap's child)
        self.env = {"PATH": DEFAULT_PATH, "HOME": "/root", "TERM": "xterm", "LANG": "C.UTF-8"}
        if spec.needs_proxy:
            self.env.update(proxy_env())
        self.env.update(spec.env)
        self._proxy: EgressProxy | None = None
        #: the tree as it was made (`changed_paths` compares with it)
        self._manifest: dict[str, str] = {}

    @property
    def bridge_dir(self) -> Path:
        """`/run/sandgym` of the sandbox's root tree (the root is a host directory)."""
        return self.fs / "run" / "sandgym"

    # -- lifecycle ---------------------------------------------------------------------------
    async def _start(self) -> None:
        await asyncio.to_thread(self._make_tree)
        if self.use_cgroups:
            self.cg = cgroups.CgroupSet(self.id)
            await asyncio.to_thread(
                self.cg.create, self.spec.memory_mb, self.spec.pids_limit, self.spec.cpus
            )
        if not self.use_bwrap:
            return
        info_r, info_w = os.pipe()
        argv = self._join_prefix() + self._bwrap_argv(info_fd=info_w)
        try:
            # started off the loop (spawn.py): a fork on the loop grows with the number held
            self.init_proc = await spawn(argv, pass_fds=(info_w,))
        finally:
            os.close(info_w)
        try:
            raw = await asyncio.wait_for(asyncio.to_thread(_read_all, info_r), 10)
            self.init_pid = int(json.loads(raw)["child-pid"])
            # a namespace init of its own: `exec_private` can enter a mount namespace apart
            self.capabilities = self.capabilities.model_copy(update={"private_exec": True})
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
        (self.dir / "labels.json").write_text(json.dumps(self._labels()))
        deadline = first_deadline()  # the pool's: a sandbox nobody will refresh gets none
        if deadline is not None:
            write_deadline_file(self.dir / "life", deadline)
            self.deadline = deadline
        else:
            (self.dir / "life").mkdir()
        if self.spec.snapshot is not None:  # a copy of a prepared sandbox's tree
            src = snapshot_path(self.root, self.spec.snapshot) / "fs"
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
        self._manifest = tree_manifest(self.fs)

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
        argv += ["--ro-bind", str(self.dir / "life"), LIFE_MOUNT]
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
        # The init is the namespace's pid 1 itself (--as-pid-1: no bwrap reaper above it). From
        # inside, pid 1 only gets the signals it has a handler for, and this one has none but
        # SIGCHLD's (the terminating ones it ignores, INIT_SCRIPT): the
        # agent's `kill -9 -1` (or `kill 1`) ends its own processes, never the sandbox, so it
        # cannot turn its episode into a lost sandbox (masked as infrastructure). As pid 1 it
        # reaps the namespace's orphans; it also keeps the deadline (INIT_SCRIPT).
        argv += ["--as-pid-1", "bash", "-c", INIT_SCRIPT]
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

    async def _write_deadline(self, deadline: float) -> None:
        """Into `<sandbox dir>/life`, which the sandbox sees read-only at LIFE_MOUNT."""
        await asyncio.to_thread(write_deadline_file, self.dir / "life", deadline)

    async def usage(self) -> SandboxUsage:
        """CPU seconds and peak memory from the sandbox's cgroups (None without them), and
        the bytes of the files in its tree."""

        def read() -> SandboxUsage:
            used = self.cg.usage() if self.cg is not None else SandboxUsage()
            used.bytes_written = tree_bytes(self.fs)
            return used

        return await asyncio.to_thread(read)

    async def snapshot(self) -> str:
        """A copy of this sandbox's tree (regular files, directories, links; no sockets or
        FIFOs) under the backend's root, labelled like it."""
        await self._check_live()
        snap = "snap-" + uuid.uuid4().hex[:12]
        dest = snapshot_path(self.root, snap)

        def copy() -> None:
            dest.mkdir(parents=True)
            labels = {**self._labels(), "sandgym.snapshot_of": self.id}
            (dest / "labels.json").write_text(json.dumps(labels))
            _copy_tree(self.fs, dest / "fs")

        try:
            await asyncio.to_thread(copy)
        except BaseException:
            await asyncio.to_thread(_rmtree, dest)
            raise
        return snap

    async def changed_paths(self) -> PathChanges:
        """The tree now against the tree as it was made (sandgym/sandboxes/local/changes.py)."""
        await self._check_live()
        now = await asyncio.to_thread(tree_manifest, self.fs)
        return diff_manifest(self._manifest, now)

    async def path_fingerprints(self, paths: list[str]) -> dict[str, str | None]:
        await self._check_live()
        return await asyncio.to_thread(lambda: {p: path_fingerprint(self.fs, p) for p in paths})

    async def read_links(self, paths: list[str]) -> dict[str, str]:
        await self._check_live()
        return await asyncio.to_thread(read_links, self.fs, paths)

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
        self._live.discard(self.id)

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
        if not is_root_user(user):
            raise UserUnsupportedError(local_user_refusal(user))
        return await self._exec(argv, timeout_s, cwd, env, caps=False)

    async def exec_private(
        self,
        cmd: list[str],
        stdin: bytes,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        see_processes: bool = True,
    ) -> ExecResult:
        """`cmd` in a mount namespace of its own (`unshare -m`, private propagation), as root
        of the sandbox *with* its capabilities, so it may mount tmpfs over the fixed mount
        points of VERIFIER_MOUNTS. It runs in the sandbox's process namespace, whatever
        `see_processes` says. The agent's processes have no capabilities (not even to switch
        users): they can neither join that namespace nor reach its files through
        /proc/PID/root, and cannot detach its mounts by removing or renaming the directories
        under them."""
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
        proc = await spawn(
            [*self._join_prefix(cg), *self._enter_argv(workdir, full_env, caps=caps), *argv],
            stdin=stdin is not None,
            cwd=host_cwd,
        )
        feeder = None
        if stdin is not None:
            feeder = asyncio.ensure_future(_feed(proc.stdin, stdin))
        limit = self.max_output_bytes
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
        proc.close_pipes()
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

    async def _start_shell(self) -> PtyShell:
        argv = self._join_prefix() + self._enter_argv(self.spec.workdir, self.env)
        argv += ["bash", "--noprofile", "--norc", "-i"]
        shell = PtyShell(
            argv,
            env={"PATH": os.environ.get("PATH", DEFAULT_PATH)},
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.max_output_bytes,
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
        src = checked_upload(src, normalize_sandbox_path(dst, self.spec.workdir))

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
                # sockets, FIFOs and devices the agent made are left out (a FIFO would block,
                # and copytree refuses them), as the docker backend's archive leaves them out
                shutil.copytree(host, dst, symlinks=True, dirs_exist_ok=True, ignore=_special_files)
            elif host.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(host, dst)
            else:
                raise SandboxFileNotFoundError(f"no such file or directory in sandbox: {src}")

        await asyncio.to_thread(_copy)


def _special_files(dirpath: str, names: list[str]) -> set[str]:
    """`copytree`'s ignore: the entries that are neither files, directories nor links."""
    out = set()
    for n in names:
        p = os.path.join(dirpath, n)
        if not (os.path.islink(p) or os.path.isfile(p) or os.path.isdir(p)):
            out.add(n)
    return out

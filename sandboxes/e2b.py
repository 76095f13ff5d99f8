"""The `e2b` backend: one E2B cloud sandbox (a Firecracker micro-VM) per sandgym sandbox.

Driven through the async E2B SDK (`e2b.AsyncSandbox`, verified against e2b 2.63), imported
lazily; tests inject an in-process fake of the same surface (`sandboxes.e2b_fake`) through the
`sdk=` constructor parameter. Every SDK call runs under a timeout, and every SDK failure becomes
one of the named sandbox errors:

- no `E2B_API_KEY` (or a key E2B rejects), or no SDK installed -> `BackendUnavailableError`;
- create failed (unknown template, quota, timeout) -> `SandboxCreateError`;
- the VM is gone (killed, past its E2B timeout) -> `SandboxLostError`;
- a command past its timeout -> `ExecResult(timed_out=True)` (its process tree is killed).

Templates: `spec.image` names an E2B template. An explicit `template_map` entry wins; otherwise
the image reference is turned into a template name by `template_for_image` (drop the registry
and a `:latest` tag, then `/`, `:`, `.` become `-`: `sandgym/terminal:latest` ->
`sandgym-terminal`). A spec without an image (or with a Dockerfile build context, which E2B
cannot build at create time) runs on the backend's default template (`$SANDGYM_E2B_TEMPLATE`,
else `sandgym-terminal`); the task layer then applies the Dockerfile's WORKDIR/ENV/COPY steps,
as on the local backend. CPU and memory are properties of an E2B template (set when it is
built), not of a create call; `pids_limit` and `storage_mb` are not enforceable through E2B.

Commands: `exec` starts the command in the background with a unique `SANDGYM_EXEC_ID` in its
environment and streams its output into capped buffers. On timeout every process in the VM
carrying that marker is stopped and killed (the same /proc walk the docker backend uses), then
the command itself; so `(sleep 300 &); sleep 301` leaves nothing behind. The persistent shell is
the project's sentinel protocol (`sandboxes.shell.PexpectShell`) over an E2B pty: the pty's
bytes are bridged onto a local socketpair, so reading, sentinels, timeouts, resync and the pyte
screen are exactly the code the local and docker backends use.

Lifetimes and reaping: each sandbox is created with an E2B timeout equal to the backend's lease
(capped at E2B's 24 h), so E2B itself ends what a crashed server leaves; its metadata carries
`labels_for(spec)`, and `reap()` lists sandboxes by `sandgym.managed=1` metadata and kills those
`reaper.should_reap` selects (lease expired, owner process dead, or, with
`only_expired=False`, every one this backend's owner created).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import shlex
import socket
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyte

from sandboxes.base import LABEL_MANAGED, SandboxBackend, normalize_sandbox_path
from sandboxes.common.kill import EXEC_MARKER_ENV, kill_marked_bash_script
from sandboxes.common.lazy_shell import ShellSandbox
from sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES, CappedBuffer
from sandboxes.errors import (
    BackendUnavailableError,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
)
from sandboxes.shell import PexpectShell
from sandboxes.spec import ExecResult, SandboxSpec

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "sandgym-terminal"
#: E2B's longest sandbox lifetime (Pro tier); Hobby accounts are capped at 1 h by E2B itself.
MAX_SANDBOX_TIMEOUT_S = 24 * 3600
#: Metadata key holding sandgym's own id of a sandbox: lets a cancelled create find its VM.
LABEL_SANDBOX_ID = "sandgym.sandbox_id"
_TEMPLATE_CHARS = re.compile(r"[^a-z0-9_-]+")


def template_for_image(image: str) -> str:
    """The E2B template name an image reference maps to (see the module docstring).

    >>> template_for_image("sandgym/terminal:latest")
    'sandgym-terminal'
    >>> template_for_image("ghcr.io/acme/py:3.11")
    'acme-py-3-11'
    """
    ref = image.strip().lower()
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        ref = rest  # drop a registry host: templates live in one E2B namespace
    if ref.endswith(":latest"):
        ref = ref[: -len(":latest")]
    name = _TEMPLATE_CHARS.sub("-", ref).strip("-")
    if not name:
        raise SandboxCreateError(f"expected an image name that maps to a template, got {image!r}")
    return name


class _PtyChild:
    """What `PexpectShell` expects of its pexpect child, for a pty that lives in an E2B VM."""

    def __init__(self, shell: _E2BPtyShell) -> None:
        self._shell = shell

    @property
    def pid(self) -> int | None:
        return self._shell.pty_pid

    def isalive(self) -> bool:
        return self._shell.pty_running

    def terminate(self, force: bool = False) -> bool:
        return True  # the VM-side pty is killed by `_E2BPtyShell.close`

    def close(self, force: bool = False) -> None:
        return None


class _E2BPtyShell(PexpectShell):
    """The sentinel shell over an E2B pty.

    `PexpectShell` reads and writes one non-blocking fd; here that fd is one end of a local
    socketpair. Bytes the shell writes are forwarded, in order, to the pty with `send_stdin`;
    bytes the pty prints arrive through the SDK's `on_data` callback and are written to the
    other end. Only spawning and closing differ from the pexpect transport.
    """

    def __init__(self, sandbox: E2BSandbox, **kwargs: Any) -> None:
        super().__init__([], **kwargs)
        self._sb = sandbox
        self._handle: Any = None
        self._ours: socket.socket | None = None
        self._theirs: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.pty_pid: int | None = None
        self.pty_running = False

    async def start(self) -> None:
        sdk = self._sb._sdk
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        self._ours, self._theirs = ours, theirs
        loop = asyncio.get_running_loop()

        async def on_data(data: bytes) -> None:
            # Awaited by the SDK in order, so pty output stays ordered on the socket.
            with contextlib.suppress(OSError):
                await loop.sock_sendall(ours, bytes(data))

        try:
            self._handle = await self._sb._call(
                "start the shell pty",
                self._sb._sbx.pty.create(
                    size=sdk.PtySize(rows=self.rows, cols=self.cols),
                    on_data=on_data,
                    user=self._sb._user(None),
                    cwd=self._sb.spec.workdir,
                    envs=dict(self._sb.spec.env),
                    timeout=0,  # the pty lives as long as the episode
                    request_timeout=self._sb._backend.request_timeout_s,
                ),
            )
        except BaseException:
            ours.close()
            theirs.close()
            raise
        self.pty_pid = int(self._handle.pid)
        self.pty_running = True
        self._tasks = [
            asyncio.create_task(self._forward_input()),
            asyncio.create_task(self._watch_exit()),
        ]
        self._eof = False
        await super().start()  # `_spawn` below only hands PexpectShell our fd
        # An E2B pty starts with echo and a prompt on, so the init line was echoed before
        # `stty -echo` took effect: start the screen blank, as on the other backends.
        self._screen_pending.clear()
        self._screen.reset()
        self._screen.set_mode(pyte.modes.LNM)

    def _spawn(self) -> None:
        assert self._theirs is not None
        self._child = _PtyChild(self)  # type: ignore[assignment]
        self._fd = self._theirs.fileno()

    async def _forward_input(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._ours is not None
        while True:
            try:
                data = await loop.sock_recv(self._ours, 65536)
            except OSError:
                return
            if not data:
                return
            try:
                await self._sb._call(
                    "write to the shell pty",
                    self._sb._sbx.pty.send_stdin(
                        self.pty_pid, data, request_timeout=self._sb._backend.request_timeout_s
                    ),
                )
            except SandboxError as exc:
                log.debug("e2b shell: input lost: %s", exc)
                self._hang_up()
                return

    async def _watch_exit(self) -> None:
        with contextlib.suppress(Exception):
            await self._handle.wait()
        # Let the last output reach the socket before the shell sees EOF.
        await asyncio.sleep(0.05)
        self._hang_up()

    def _hang_up(self) -> None:
        self.pty_running = False
        if self._ours is not None:
            with contextlib.suppress(OSError):
                self._ours.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        await super().close()
        handle, self._handle = self._handle, None
        pid, self.pty_pid = self.pty_pid, None
        self.pty_running = False
        if handle is not None and pid is not None and not self._sb.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._sb._sbx.pty.kill(
                        pid, request_timeout=self._sb._backend.request_timeout_s
                    ),
                    self._sb._backend.request_timeout_s + 5,
                )
        if handle is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.disconnect(), 5)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks = []
        for s in (self._ours, self._theirs):
            if s is not None:
                s.close()
        self._ours = self._theirs = None


class E2BSandbox(ShellSandbox):
    """One E2B micro-VM. Create through `E2BBackend.create`."""

    backend_name = "e2b"

    def __init__(
        self, spec: SandboxSpec, backend: E2BBackend, sbx: Any, sandbox_id: str, template: str
    ) -> None:
        super().__init__(spec, sandbox_id)
        self._backend = backend
        self._sdk = backend.sdk
        self._sbx = sbx
        self.e2b_id: str = sbx.sandbox_id
        self.template = template
        self.max_output_bytes = backend.max_output_bytes

    # -- SDK calls and error mapping ---------------------------------------------------------
    def _user(self, user: str | None) -> str:
        # E2B runs as its unprivileged "user" by default; sandgym's default (spec.user None)
        # is root, as in the docker and local backends.
        return user or self.spec.user or "root"

    async def _call(self, what: str, coro: Any, timeout_s: float | None = None) -> Any:
        """Await one SDK call under a timeout, mapping its failures to named errors."""
        limit = self._backend.request_timeout_s + 5 if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(coro, limit)
        except TimeoutError as exc:
            lost = await self._lost(what)
            if lost is not None:
                raise lost from exc
            raise SandboxError(
                f"e2b sandbox {self.id} ({self.e2b_id}): {what} got no answer within {limit:.0f} s"
            ) from exc
        except SandboxError:
            raise
        except self._sdk.CommandExitException:
            raise  # a non-zero exit is data: the caller decides
        except Exception as exc:
            raise await self._map_error(what, exc) from exc

    async def _map_error(self, what: str, exc: BaseException) -> SandboxError:
        sdk = self._sdk
        if isinstance(exc, sdk.FileNotFoundException):
            return SandboxFileNotFoundError(f"sandbox {self.id}: {what}: no such file ({exc})")
        gone = (sdk.SandboxNotFoundException, sdk.SandboxNotRunningException)
        if isinstance(exc, gone):
            return SandboxLostError(
                f"sandbox {self.id} ({what}): expected a running E2B sandbox {self.e2b_id}, "
                f"E2B says it is gone: {exc}"
            )
        lost = await self._lost(what)
        if lost is not None:
            return lost
        return SandboxError(f"e2b sandbox {self.id} ({self.e2b_id}): {what} failed: {exc}")

    async def _lost(self, what: str) -> SandboxLostError | None:
        """A SandboxLostError when the VM no longer runs, else None (also when unsure)."""
        try:
            running = await asyncio.wait_for(
                self._sbx.is_running(request_timeout=self._backend.request_timeout_s),
                self._backend.request_timeout_s + 5,
            )
        except self._sdk.SandboxNotRunningException:
            running = False
        except Exception:
            return None
        if running:
            return None
        return SandboxLostError(
            f"sandbox {self.id} ({what}): expected a running E2B sandbox {self.e2b_id}, "
            "it no longer runs (killed, or past its E2B timeout)"
        )

    # -- lifecycle ---------------------------------------------------------------------------
    async def is_alive(self) -> bool:
        if self._closed:
            return False
        try:
            return bool(
                await asyncio.wait_for(
                    self._sbx.is_running(request_timeout=self._backend.request_timeout_s),
                    self._backend.request_timeout_s + 5,
                )
            )
        except Exception:
            return False

    async def _destroy(self) -> None:
        # Shielded: a cancelled episode must still not leak a paid-for VM.
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        await self._close_shell()
        await self._backend._kill_sandbox(self.e2b_id, self._sbx)

    # -- exec --------------------------------------------------------------------------------
    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._check_open()
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        workdir = normalize_sandbox_path(cwd, self.spec.workdir) if cwd else self.spec.workdir
        marker = uuid.uuid4().hex
        envs = {**self.spec.env, **(env or {}), EXEC_MARKER_ENV: marker}
        run_user = self._user(user)
        out, err = CappedBuffer(self.max_output_bytes), CappedBuffer(self.max_output_bytes)
        start = time.perf_counter()
        handle = await self._call(
            "start a command",
            self._sbx.commands.run(
                command,
                background=True,
                envs=envs,
                user=run_user,
                cwd=workdir,
                on_stdout=out.add,
                on_stderr=err.add,
                # The SDK's stream bound: a backstop only, our own timeout acts first.
                timeout=timeout_s + 60,
                request_timeout=self._backend.request_timeout_s,
                retain_output=False,
            ),
        )
        waiter = asyncio.create_task(self._exit_code(handle))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            timed_out = True
            await self._kill_command(handle, marker, run_user, waiter)
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_command(handle, marker, run_user, waiter))
            raise
        exit_code: int | None = None
        if not timed_out:
            exc = waiter.exception()
            if exc is not None:
                raise await self._map_error("run a command", exc) from exc
            exit_code = waiter.result()
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

    async def _exit_code(self, handle: Any) -> int:
        try:
            result = await handle.wait()
        except self._sdk.CommandExitException as exc:
            return int(exc.exit_code)
        return int(result.exit_code)

    async def _kill_command(
        self, handle: Any, marker: str, user: str, waiter: asyncio.Task[int]
    ) -> None:
        """Kill every process of one command (by its env marker), then the command itself;
        give the output stream a moment to end, then drop it."""
        with contextlib.suppress(SandboxError):
            await self._raw_run(kill_marked_bash_script(marker), user=user)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(handle.kill(), self._backend.request_timeout_s + 5)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), 2.0)
        except (TimeoutError, Exception):
            # Something escaped the marker (env -i) and holds the stream open: cut it.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(handle.disconnect(), 5)
            waiter.cancel()
            with contextlib.suppress(BaseException):
                await waiter

    async def _raw_run(self, script: str, user: str = "root", timeout_s: float = 20.0) -> str:
        """Run a helper script in the foreground; returns stdout (non-zero exit is an error)."""
        try:
            res = await self._call(
                "run a helper script",
                self._sbx.commands.run(
                    script,
                    user=user,
                    timeout=timeout_s,
                    request_timeout=self._backend.request_timeout_s,
                ),
                timeout_s=timeout_s + 5,
            )
        except self._sdk.CommandExitException as exc:
            raise SandboxError(
                f"sandbox {self.id}: expected exit 0 from {script[:80]!r}, got "
                f"{exc.exit_code}: {str(exc.stderr or '').strip()[-300:]!r}"
            ) from exc
        return str(res.stdout or "")

    # -- the persistent shell ----------------------------------------------------------------
    async def _after_shell_exit(self) -> None:
        lost = await self._lost("shell")
        if lost is not None:
            raise lost

    async def _start_shell(self) -> PexpectShell:
        shell = _E2BPtyShell(
            self,
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.max_output_bytes,
            start_timeout_s=self._backend.request_timeout_s,
        )
        await shell.start()
        return shell

    async def _run_helper(self, script: str) -> str:
        return await self._raw_run(script)

    async def _shell_error(self, exc: SandboxLostError) -> SandboxLostError:
        lost = await self._lost("shell")
        return lost or SandboxLostError(f"sandbox {self.id}: the shell exited")

    # -- files -------------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        # The VM is its own machine: a symlink inside it resolves inside it, so `..` above
        # the root is the only escape to refuse.
        return normalize_sandbox_path(path, self.spec.workdir)

    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        self._check_open()
        p = self._path(path)
        if p == "/":
            raise SandboxPathError("expected a file path, got the root directory")
        data = content.encode() if isinstance(content, str) else bytes(content)
        await self._call(
            f"write {p}",
            self._sbx.files.write(
                p, data, user="root", request_timeout=self._backend.request_timeout_s
            ),
        )
        await self._raw_run(f"chmod {mode:o} {shlex.quote(p)}")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_open()
        p = self._path(path)
        try:
            data = await self._call(
                f"read {p}",
                self._sbx.files.read(
                    p, format="bytes", user="root", request_timeout=self._backend.request_timeout_s
                ),
            )
        except SandboxFileNotFoundError:
            raise SandboxFileNotFoundError(
                f"no such file or directory in sandbox {self.id}: {p}"
            ) from None
        except SandboxLostError:
            raise
        except SandboxError as exc:
            kind = await self._kind(p)
            if kind == "dir":
                raise SandboxPathError(
                    f"expected a file, {p} is a directory in sandbox {self.id}"
                ) from exc
            raise
        blob = bytes(data)
        return blob if max_bytes is None else blob[:max_bytes]

    async def _kind(self, p: str) -> str:
        q = shlex.quote(p)
        out = await self._raw_run(
            f"if [ -d {q} ]; then echo dir; elif [ -e {q} ]; then echo file; else echo none; fi"
        )
        return out.strip()

    async def upload(self, src: Path, dst: str) -> None:
        self._check_open()
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"upload source {src} does not exist on the host")
        p = self._path(dst)
        if p == "/":
            raise SandboxPathError("expected a destination below /, got the root directory")
        if src.is_file():
            await self.write_file(
                p, await asyncio.to_thread(src.read_bytes), src.stat().st_mode & 0o7777
            )
            return

        def pack() -> bytes:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz") as tar:
                tar.add(str(src), arcname=".")
            return buf.getvalue()

        blob = await asyncio.to_thread(pack)
        tmp = f"/tmp/.sg-upload-{uuid.uuid4().hex[:12]}.tgz"
        await self._call(
            "upload an archive",
            self._sbx.files.write(
                tmp, blob, user="root", request_timeout=self._backend.request_timeout_s
            ),
        )
        q = shlex.quote(p)
        await self._raw_run(
            f"mkdir -p {q} && tar -xzf {tmp} -C {q} --no-same-owner; rc=$?; rm -f {tmp}; exit $rc",
            timeout_s=120,
        )

    async def download(self, src: str, dst: Path) -> None:
        self._check_open()
        p = self._path(src)
        dst = Path(dst)
        kind = await self._kind(p)
        if kind == "none":
            raise SandboxFileNotFoundError(f"no such file or directory in sandbox {self.id}: {p}")
        if kind == "file":
            data = await self.read_file(p)
            await asyncio.to_thread(_write_host_file, dst, data)
            return
        tmp = f"/tmp/.sg-download-{uuid.uuid4().hex[:12]}.tgz"
        await self._raw_run(f"tar -czf {tmp} -C {shlex.quote(p)} .", timeout_s=120)
        try:
            blob = await self.read_file(tmp)
        finally:
            with contextlib.suppress(SandboxError):
                await self._raw_run(f"rm -f {tmp}")
        await asyncio.to_thread(_extract_host_tree, blob, dst)


def _write_host_file(dst: Path, data: bytes) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)


def _extract_host_tree(blob: bytes, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        # "data" refuses absolute paths, links out of the tree and device files.
        tar.extractall(dst, filter="data")


class E2BBackend(SandboxBackend):
    """Sandboxes as E2B cloud micro-VMs (see the module docstring).

    `sdk` is the module-like object providing `AsyncSandbox`, `SandboxQuery`, `PtySize` and the
    exception classes; None imports the real `e2b` package on first use.
    """

    name = "e2b"

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 3600,
        api_key: str | None = None,
        default_template: str | None = None,
        template_map: dict[str, str] | None = None,
        request_timeout_s: float = 30.0,
        create_timeout_s: float = 120.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        sdk: Any = None,
    ) -> None:
        super().__init__(owner_id, lease_s)
        self._api_key = api_key
        self.default_template = (
            default_template or os.environ.get("SANDGYM_E2B_TEMPLATE") or DEFAULT_TEMPLATE
        )
        self.template_map = dict(template_map or {})
        self.request_timeout_s = request_timeout_s
        self.create_timeout_s = create_timeout_s
        self.max_output_bytes = max_output_bytes
        self._sdk = sdk

    # -- availability ------------------------------------------------------------------------
    @property
    def sdk(self) -> Any:
        if self._sdk is None:
            try:
                import e2b
            except ImportError as exc:
                raise BackendUnavailableError(
                    "the e2b backend needs the E2B SDK: pip install 'sandgym[e2b]'"
                ) from exc
            self._sdk = e2b
        return self._sdk

    @property
    def api_key(self) -> str:
        key = self._api_key or os.environ.get("E2B_API_KEY", "")
        if not key:
            raise BackendUnavailableError(
                "the e2b backend needs an E2B API key: expected E2B_API_KEY in the environment "
                "(or api_key=...), found none; get one at https://e2b.dev/dashboard"
            )
        return key

    async def ensure_available(self) -> None:
        """Raise BackendUnavailableError unless the SDK is installed and a key is set."""
        _ = self.sdk, self.api_key

    def _api(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "request_timeout": self.request_timeout_s}

    # -- templates ---------------------------------------------------------------------------
    def template_for(self, spec: SandboxSpec) -> str:
        """The E2B template a sandbox of `spec` starts from."""
        if spec.image is None:
            if spec.build_context is not None:
                log.debug(
                    "e2b: %s: no image build on E2B; default template %s, the task layer "
                    "applies the Dockerfile",
                    spec.build_context,
                    self.default_template,
                )
            return self.default_template
        if spec.image in self.template_map:
            return self.template_map[spec.image]
        return template_for_image(spec.image)

    # -- create / kill -----------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        from sandboxes.health import ensure_healthy

        self.check_network(spec)  # public or no-network, for the sandbox's whole life
        self.check_services(spec)
        sdk, api = self.sdk, self._api()
        template = self.template_for(spec)
        sandbox_id = "sg-" + uuid.uuid4().hex[:12]
        metadata = await asyncio.to_thread(self.labels_for, spec)
        metadata[LABEL_SANDBOX_ID] = sandbox_id
        e2b_timeout = int(max(60, min(self.lease_s, MAX_SANDBOX_TIMEOUT_S)))
        try:
            sbx = await asyncio.wait_for(
                sdk.AsyncSandbox.create(
                    template=template,
                    timeout=e2b_timeout,
                    metadata=metadata,
                    envs=dict(spec.env),
                    allow_internet_access=spec.network.mode == "public",
                    **api,
                ),
                self.create_timeout_s,
            )
        except TimeoutError as exc:
            await asyncio.shield(self._kill_by_sandbox_id(sandbox_id))
            raise SandboxCreateError(
                f"e2b: creating a sandbox from template {template!r} took longer than "
                f"{self.create_timeout_s:.0f} s"
            ) from exc
        except asyncio.CancelledError:
            await asyncio.shield(self._kill_by_sandbox_id(sandbox_id))
            raise
        except Exception as exc:
            raise self._create_error(template, exc) from exc
        sb = E2BSandbox(spec, self, sbx, sandbox_id, template)
        try:
            dirs = " ".join(shlex.quote(d) for d in (spec.workdir, "/logs/verifier", "/logs/agent"))
            await sb._raw_run(f"mkdir -p {dirs} && chmod 777 /logs/verifier")
            if spec.user is not None and spec.user not in ("root", "0"):
                await sb._raw_run(f"chown {shlex.quote(spec.user)} {shlex.quote(spec.workdir)}")
        except BaseException as exc:
            await asyncio.shield(sb.close())
            if isinstance(exc, SandboxError) and not isinstance(exc, SandboxLostError):
                raise SandboxCreateError(
                    f"e2b: sandbox from template {template!r} could not be prepared: {exc}"
                ) from exc
            raise
        await ensure_healthy(sb)
        return sb

    def _unavailable(self, exc: Exception) -> BackendUnavailableError | None:
        """The BackendUnavailableError an SDK failure amounts to (refused key, E2B unreachable),
        or None when the failure is about the request itself."""
        import httpx

        if isinstance(exc, self.sdk.AuthenticationException):
            return BackendUnavailableError(f"e2b: the API key was refused: {exc}")
        if isinstance(exc, httpx.TransportError):
            return BackendUnavailableError(
                f"e2b: the E2B API cannot be reached from here (expected a connection to "
                f"{os.environ.get('E2B_DOMAIN', 'e2b.app')}): {exc}"
            )
        return None

    def _create_error(self, template: str, exc: Exception) -> SandboxError:
        sdk = self.sdk
        unavailable = self._unavailable(exc)
        if unavailable is not None:
            return unavailable
        if isinstance(exc, sdk.NotFoundException) or "not found" in str(exc).lower():
            return SandboxCreateError(
                f"e2b: template {template!r} was not found: build it "
                "(`e2b template build`, see docs/e2b.md) or map the image to an existing "
                f"template; E2B said: {exc}"
            )
        return SandboxCreateError(f"e2b: creating a sandbox from {template!r} failed: {exc}")

    async def _kill_sandbox(self, e2b_id: str, sbx: Any = None) -> bool:
        """Kill one E2B sandbox by id; False when it was already gone. Never raises."""
        try:
            if sbx is not None:
                coro = sbx.kill(request_timeout=self.request_timeout_s)
            else:
                coro = self.sdk.AsyncSandbox.kill(e2b_id, **self._api())
            return bool(await asyncio.wait_for(coro, self.request_timeout_s + 5))
        except Exception as exc:
            log.warning("e2b: could not kill sandbox %s: %s", e2b_id, exc)
            return False

    async def _kill_by_sandbox_id(self, sandbox_id: str) -> None:
        """Kill the VM a failed or cancelled create may have left (found by its metadata)."""
        with contextlib.suppress(Exception):
            for info in await self.list_managed({LABEL_SANDBOX_ID: sandbox_id}):
                await self._kill_sandbox(info.sandbox_id)

    # -- reaping -----------------------------------------------------------------------------
    async def list_managed(self, extra: dict[str, str] | None = None) -> list[Any]:
        """Every E2B sandbox (running or paused) whose metadata says sandgym manages it."""
        sdk, api = self.sdk, self._api()
        query = sdk.SandboxQuery(metadata={LABEL_MANAGED: "1", **(extra or {})})
        found: list[Any] = []
        try:
            paginator = sdk.AsyncSandbox.list(query=query, **api)
            while paginator.has_next:
                page = await asyncio.wait_for(paginator.next_items(), self.request_timeout_s + 5)
                found.extend(page)
        except TimeoutError as exc:
            raise BackendUnavailableError(
                f"e2b: listing sandboxes got no answer within {self.request_timeout_s:.0f} s"
            ) from exc
        except Exception as exc:
            unavailable = self._unavailable(exc)
            if unavailable is not None:
                raise unavailable from exc
            raise SandboxError(f"e2b: listing sandboxes failed: {exc}") from exc
        return found

    async def reap_matching(
        self, *, everything: bool = False, owner_id: str | None = None
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Kill the managed sandboxes `reaper.should_reap` selects.

        Returns (killed sandgym ids, [(id, error)]); ids are sandgym's, else E2B's.
        """
        from sandboxes.reaper import should_reap

        removed: list[str] = []
        errors: list[tuple[str, str]] = []
        for info in await self.list_managed():
            labels = dict(info.metadata or {})
            name = labels.get(LABEL_SANDBOX_ID) or info.sandbox_id
            if not should_reap(labels, owner_id=owner_id, everything=everything):
                continue
            try:
                await asyncio.wait_for(
                    self.sdk.AsyncSandbox.kill(info.sandbox_id, **self._api()),
                    self.request_timeout_s + 5,
                )
            except Exception as exc:
                errors.append((name, str(exc) or type(exc).__name__))
            else:
                removed.append(name)
        return removed, errors

    async def reap(self, only_expired: bool = True) -> list[str]:
        removed, errors = await self.reap_matching(owner_id=None if only_expired else self.owner_id)
        for name, err in errors:
            log.warning("e2b reap: could not kill %s: %s", name, err)
        return removed

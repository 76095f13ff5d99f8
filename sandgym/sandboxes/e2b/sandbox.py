"""`E2BSandbox`: one E2B micro-VM: SDK calls under a timeout with their failures
mapped to named errors, `exec` with capped output and a marker kill on timeout, the lazily
started pty shell (`pty`), and files."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import shlex
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from sandgym.sandboxes.common.files import checked_upload
from sandgym.sandboxes.common.kill import EXEC_MARKER_ENV, kill_marked_bash_script
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES, CappedBuffer
from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.e2b.api import E2BApi, e2b_timeout_s
from sandgym.sandboxes.e2b.pty import _E2BPtyShell
from sandgym.sandboxes.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
)
from sandgym.sandboxes.lazy_shell import ShellSandbox
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.shell import PtyShell
from sandgym.sandboxes.spec import ExecResult, SandboxSpec

log = logging.getLogger(__name__)


class E2BSandbox(ShellSandbox):
    """One E2B micro-VM. Create through `E2BBackend.create`."""

    backend_name = "e2b"

    def __init__(
        self,
        spec: SandboxSpec,
        api: E2BApi,
        sbx: Any,
        sandbox_id: str,
        template: str,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        super().__init__(spec, sandbox_id)
        self.api = api
        self._sdk = api.sdk
        self._sbx = sbx
        self.e2b_id: str = sbx.sandbox_id
        self.template = template
        self.max_output_bytes = max_output_bytes  # per stream, exec and shell

    # -- SDK calls and error mapping ---------------------------------------------------------
    def _user(self, user: str | None) -> str:
        # E2B runs as its unprivileged "user" by default; sandgym's default (spec.user None)
        # is root, as in the docker and local backends.
        return user or self.spec.user or "root"

    async def _call(self, what: str, coro: Any, timeout_s: float | None = None) -> Any:
        """Await one SDK call under a timeout, mapping its failures to named errors."""
        limit = self.api.request_timeout_s + 5 if timeout_s is None else timeout_s
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
        """A SandboxLostError when the VM no longer runs, else None. When E2B cannot say (its
        API unreachable, the key refused, another failure of the probe itself), a named error:
        BackendUnavailableError or SandboxError, never a guess that the VM still runs."""
        try:
            running = await asyncio.wait_for(
                self._sbx.is_running(request_timeout=self.api.request_timeout_s),
                self.api.request_timeout_s + 5,
            )
        except self._sdk.SandboxNotRunningException:
            running = False
        except Exception as exc:
            unavailable = self.api.unavailable(exc)
            if unavailable is not None:
                raise unavailable from exc
            raise SandboxError(
                f"sandbox {self.id} ({what}): expected E2B to say whether sandbox {self.e2b_id} "
                f"still runs, asking failed: {type(exc).__name__}: {exc}"
            ) from exc
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
                    self._sbx.is_running(request_timeout=self.api.request_timeout_s),
                    self.api.request_timeout_s + 5,
                )
            )
        except Exception as exc:  # not usable as far as we can tell; the pool replaces it
            tolerate("e2b.is_alive", exc, log, logging.WARNING)
            return False

    async def _write_deadline(self, deadline: float) -> None:
        """E2B's own timeout, counted from now: the provider kills the VM when it runs out."""
        timeout = e2b_timeout_s(deadline - time.time())
        await self._call(
            "set_timeout",
            self._sbx.set_timeout(timeout, request_timeout=self.api.request_timeout_s),
        )

    async def _destroy(self) -> None:
        # Shielded: a cancelled episode must still not leak a paid-for VM.
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        await self._close_shell()
        await self.api.kill(self.e2b_id, self._sbx)

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
                request_timeout=self.api.request_timeout_s,
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
        return ExecResult.from_buffers(
            out, err, exit_code=exit_code, timed_out=timed_out, started=start
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
            await asyncio.wait_for(handle.kill(), self.api.request_timeout_s + 5)
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
                    request_timeout=self.api.request_timeout_s,
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

    async def _start_shell(self) -> PtyShell:
        shell = _E2BPtyShell(
            self._sbx,
            self.api,
            self._call,
            user=self._user(None),
            cwd=self.spec.workdir,
            envs=dict(self.spec.env),
            sandbox_closed=lambda: self.closed,
            kill_tree=self._kill_tree,
            count_children=self._count_children,
            max_output_bytes=self.max_output_bytes,
            start_timeout_s=self.api.request_timeout_s,
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
            self._sbx.files.write(p, data, user="root", request_timeout=self.api.request_timeout_s),
        )
        await self._raw_run(f"chmod {mode:o} {shlex.quote(p)}")

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_open()
        p = self._path(path)
        try:
            data = await self._call(
                f"read {p}",
                self._sbx.files.read(
                    p, format="bytes", user="root", request_timeout=self.api.request_timeout_s
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
        p = self._path(dst)
        src = checked_upload(src, p)
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
                tmp, blob, user="root", request_timeout=self.api.request_timeout_s
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

"""An in-process fake of the E2B SDK surface the `e2b` backend uses, for tests. Not for serving.

E2B cannot be reached from the machines sandgym is built on, so the backend's logic is tested
against this double, whose commands really run. Each fake E2B sandbox ("VM") is a local
bubblewrap sandbox (`sandgym.sandboxes.local`: its own root filesystem, pid namespace and network
namespace); commands, the pty and the file API enter it with `nsenter`, the way E2B's envd
runs them inside the VM:

- `commands.run(cmd, ...)` runs `bash -l -c cmd` with the sandbox's envs plus the call's,
  streams output to `on_stdout`/`on_stderr`, and raises `CommandExitException` from `wait()` on a
  non-zero exit, like the SDK; `kill(pid)` SIGKILLs that one process only (the least any real
  implementation does), so the backend's own tree kill is what gets tested;
- `pty.create` runs `bash -i -l` on a real pty, echo on, delivering bytes to `on_data` in order;
- `files.write` creates parent directories; `files.read` raises `FileNotFoundException`;
- `user=None` means E2B's unprivileged default user, which this fake refuses (its namespace maps
  only root), so a backend that forgets to ask for root fails loudly;
- `AsyncSandbox.list(query=SandboxQuery(metadata=...))` returns a paginator of `SandboxInfo`s;
  `AsyncSandbox.kill` works on an instance and, given an id, on the class;
- a sandbox past its `timeout` (set at create, moved with `set_timeout`), or ended with
  `FakeE2BCloud.expire`, is gone: its calls raise
  `SandboxNotRunningException` and `is_running()` is False;
- a missing or unknown API key raises `AuthenticationException`, an unknown template
  `NotFoundException`; with `offline` set, control-plane calls raise `httpx.ConnectError`.

Every call is recorded in `FakeE2BCloud.calls` so tests can check what the backend asked for.

Example:
    cloud = FakeE2BCloud(root=tmp_path)
    backend = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk)
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import inspect
import os
import signal
import time
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandgym.sandboxes.local import LocalBackend, LocalSandbox
from sandgym.sandboxes.spec import SandboxSpec

FAKE_API_KEY = "e2b_fake_0123456789abcdef"


# -- the SDK's exception tree (names and bases as in e2b.exceptions) ---------------------------
class SandboxException(Exception):
    """Base class for all sandbox errors."""


class TimeoutException(SandboxException):
    """Raised when a timeout occurs."""


class InvalidArgumentException(SandboxException):
    """Raised when an invalid argument is provided."""


class NotFoundException(SandboxException):
    """Raised when a resource is not found."""


class FileNotFoundException(NotFoundException):
    """Raised when a file or directory is not found inside a sandbox."""


class SandboxNotFoundException(NotFoundException):
    """Raised when a sandbox is not found."""


class SandboxNotRunningException(TimeoutException):
    """Raised when the sandbox is not running any more."""


class AuthenticationException(Exception):
    """Raised when authentication fails."""


class CommandExitException(SandboxException):
    """Raised by `wait()` when a command exits with a non-zero exit code."""

    def __init__(self, stdout: str | None, stderr: str | None, exit_code: int, error: str | None):
        super().__init__(f"Command exited with code {exit_code}")
        self.stdout, self.stderr, self.exit_code, self.error = stdout, stderr, exit_code, error


@dataclass
class CommandResult:
    stderr: str | None
    stdout: str | None
    exit_code: int
    error: str | None = None


@dataclass
class PtySize:
    rows: int
    cols: int


@dataclass
class SandboxQuery:
    metadata: dict[str, str] | None = None
    state: list[str] | None = None


@dataclass
class SandboxInfo:
    sandbox_id: str
    template_id: str
    name: str | None
    metadata: dict[str, str]
    started_at: datetime
    end_at: datetime
    state: str = "running"


# -- state of the fake cloud -------------------------------------------------------------------
@dataclass
class _Record:
    e2b_id: str
    template: str
    metadata: dict[str, str]
    envs: dict[str, str]
    local: LocalSandbox
    started_at: float
    end_at: float
    killed: bool = False
    ptys: dict[int, Any] = field(default_factory=dict)


class FakeE2BCloud:
    """The service behind the fake SDK: sandboxes, templates, accepted API keys."""

    def __init__(
        self,
        root: Path | str,
        templates: tuple[str, ...] = ("base", "sandgym-terminal"),
        api_key: str = FAKE_API_KEY,
        page_size: int = 100,
    ) -> None:
        self.local = LocalBackend(owner_id="fake-e2b-cloud", root=Path(root))
        if not self.local.use_bwrap:
            raise RuntimeError("the fake E2B cloud needs bubblewrap (bwrap) and nsenter")
        self.templates = set(templates)
        self.api_key = api_key
        self.page_size = page_size
        self.records: dict[str, _Record] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        #: When set, control-plane calls fail as the SDK does when E2B cannot be reached.
        self.offline = False
        #: Seconds between a VM existing and `create` answering (a slow control plane): a
        #: client that gives up in between leaves a running VM behind, as with the real API.
        self.create_latency_s = 0.0
        self.sdk = _make_sdk(self)

    # -- test controls -----------------------------------------------------------------------
    async def expire(self, e2b_id: str) -> None:
        """End a sandbox the way E2B does at its timeout (or when killed from the dashboard)."""
        rec = self.records[e2b_id]
        rec.end_at = time.time() - 1
        await self._reap(rec)

    def running_ids(self) -> list[str]:
        return [r.e2b_id for r in self.records.values() if self._alive(r)]

    async def aclose(self) -> None:
        for rec in list(self.records.values()):
            await self._reap(rec, force=True)
        await self.local.aclose()

    # -- internals ---------------------------------------------------------------------------
    def _check_key(self, api_key: str | None) -> None:
        if self.offline:
            import httpx

            raise httpx.ConnectError("client error (Connect): dns error: api.e2b.app")
        key = api_key or os.environ.get("E2B_API_KEY")
        if not key:
            raise AuthenticationException(
                "API key is required, please visit https://e2b.dev/docs to get your API key."
            )
        if key != self.api_key:
            raise AuthenticationException("401: Invalid API key")

    def _alive(self, rec: _Record) -> bool:
        return not rec.killed and time.time() < rec.end_at

    async def _reap(self, rec: _Record, force: bool = False) -> None:
        if rec.killed and not force:
            return
        rec.killed = True
        for child in list(rec.ptys.values()):
            with contextlib.suppress(Exception):
                child.terminate(force=True)
        await rec.local.close()

    async def _live(self, e2b_id: str) -> _Record:
        rec = self.records.get(e2b_id)
        if rec is None:
            raise SandboxNotFoundException(f"Sandbox {e2b_id} not found")
        if not self._alive(rec):
            await self._reap(rec)
            raise SandboxNotRunningException(
                f"The sandbox {e2b_id} was not found: it was killed or reached its timeout"
            )
        return rec

    def _enter(self, rec: _Record, cwd: str, env: dict[str, str]) -> list[str]:
        assert rec.local.init_pid is not None
        return [
            "nsenter",
            "-t",
            str(rec.local.init_pid),
            "-a",
            "-r",
            f"--wdns={cwd}",
            "env",
            "-i",
            *[f"{k}={v}" for k, v in env.items()],
        ]


def _require_root(user: str | None, what: str) -> None:
    if user != "root":
        raise InvalidArgumentException(
            f"fake e2b: {what} as user {user or 'user (the SDK default)'}: this fake maps only "
            "root; pass user='root'"
        )


async def _call(cb: Callable[[Any], Any] | None, value: Any) -> None:
    if cb is None:
        return
    res = cb(value)
    if inspect.isawaitable(res):
        await res


# -- commands ----------------------------------------------------------------------------------
class FakeCommandHandle:
    """A running command: `wait()`, `kill()`, `disconnect()`, `pid` (as AsyncCommandHandle)."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        on_stdout: Callable[[str], Any] | None,
        on_stderr: Callable[[str], Any] | None,
        retain_output: bool,
        timeout: float | None,
    ) -> None:
        self._proc = proc
        self.pid = proc.pid
        self._retain = retain_output
        self._out: list[str] = []
        self._err: list[str] = []
        self._disconnected = False
        self._timeout = timeout
        self._pumps = [
            asyncio.create_task(self._pump(proc.stdout, on_stdout, self._out)),
            asyncio.create_task(self._pump(proc.stderr, on_stderr, self._err)),
        ]
        self._done: asyncio.Future[int] = asyncio.create_task(self._finish())

    async def _pump(
        self,
        stream: asyncio.StreamReader | None,
        cb: Callable[[str], Any] | None,
        keep: list[str],
    ) -> None:
        if stream is None:
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            chunk = await stream.read(65536)
            text = decoder.decode(chunk, final=not chunk)
            if text and not self._disconnected:
                if self._retain:
                    keep.append(text)
                await _call(cb, text)
            if not chunk:
                return

    async def _finish(self) -> int:
        code = await self._proc.wait()
        # envd ends the stream when the process exits; output still in flight is delivered,
        # but a background child holding the pipe does not keep the command "running".
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._pumps), 0.2)
        for p in self._pumps:
            p.cancel()
        return code

    async def wait(self) -> CommandResult:
        if self._timeout:
            try:
                code = await asyncio.wait_for(asyncio.shield(self._done), self._timeout)
            except TimeoutError:
                raise TimeoutException(
                    "context deadline exceeded: command stream timed out"
                ) from None
        else:
            code = await asyncio.shield(self._done)
        if self._disconnected:
            raise SandboxException("the command stream was disconnected")
        out = "".join(self._out) if self._retain else None
        err = "".join(self._err) if self._retain else None
        if code != 0:
            # A signal death is reported as -1 with an error text, as envd does.
            exit_code = -1 if code < 0 else code
            raise CommandExitException(out, err, exit_code, "signal: killed" if code < 0 else None)
        return CommandResult(stderr=err, stdout=out, exit_code=0)

    async def kill(self) -> bool:
        if self._proc.returncode is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGKILL)  # this process only, not its children
        return True

    async def disconnect(self) -> None:
        self._disconnected = True
        for p in self._pumps:
            p.cancel()
        if not self._done.done():
            self._done.cancel()
            with contextlib.suppress(BaseException):
                await self._done
            self._done = asyncio.get_running_loop().create_future()
            self._done.set_result(-1)


class FakeCommands:
    def __init__(self, cloud: FakeE2BCloud, e2b_id: str) -> None:
        self._cloud, self._id = cloud, e2b_id
        self._handles: dict[int, FakeCommandHandle] = {}

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,  # noqa: ASYNC109  (the SDK's signature)
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> Any:
        self._cloud.calls.append(
            ("commands.run", {"cmd": cmd, "user": user, "cwd": cwd, "envs": envs})
        )
        rec = await self._cloud._live(self._id)
        _require_root(user, "commands.run")
        env = {**rec.local.env, **rec.envs, **(envs or {})}
        proc = await asyncio.create_subprocess_exec(
            *self._cloud._enter(rec, cwd or "/home/user", env),
            "bash",
            "-l",
            "-c",
            cmd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        handle = FakeCommandHandle(proc, on_stdout, on_stderr, retain_output, timeout)
        self._handles[handle.pid] = handle
        if background:
            return handle
        return await handle.wait()

    async def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        await self._cloud._live(self._id)
        handle = self._handles.get(pid)
        return await handle.kill() if handle is not None else False


# -- pty ---------------------------------------------------------------------------------------
class FakePtyHandle:
    def __init__(self, child: Any, on_data: Callable[[bytes], Any]) -> None:
        import pexpect  # noqa: F401  (the child is a pexpect.spawn)

        self._child = child
        self.pid: int = child.pid
        self._fd: int = child.child_fd
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._on_data = on_data
        self._disconnected = False
        loop = asyncio.get_running_loop()
        os.set_blocking(self._fd, False)
        loop.add_reader(self._fd, self._readable)
        self._consumer = asyncio.create_task(self._consume())

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            self._queue.put_nowait(None)
            return
        self._queue.put_nowait(data)

    async def _consume(self) -> None:
        while True:
            data = await self._queue.get()
            if data is None:
                return
            if not self._disconnected:
                await _call(self._on_data, data)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            view = view[n:]

    async def wait(self) -> CommandResult:
        await asyncio.shield(self._consumer)
        if self._child.isalive():
            await asyncio.to_thread(self._child.wait)
        return CommandResult(stderr="", stdout="", exit_code=self._child.exitstatus or 0)

    async def kill(self) -> bool:
        with contextlib.suppress(Exception):
            self._child.kill(signal.SIGKILL)
        return True

    async def disconnect(self) -> None:
        self._disconnected = True


class FakePty:
    def __init__(self, cloud: FakeE2BCloud, e2b_id: str) -> None:
        self._cloud, self._id = cloud, e2b_id
        self._handles: dict[int, FakePtyHandle] = {}

    async def create(
        self,
        size: PtySize,
        on_data: Callable[[bytes], Any],
        user: str | None = None,
        cwd: str | None = None,
        envs: dict[str, str] | None = None,
        timeout: float | None = 60,  # noqa: ASYNC109  (the SDK's signature)
        request_timeout: float | None = None,
    ) -> FakePtyHandle:
        import pexpect

        self._cloud.calls.append(("pty.create", {"user": user, "cwd": cwd, "envs": envs}))
        rec = await self._cloud._live(self._id)
        _require_root(user, "pty.create")
        env = dict(envs or {})
        env.setdefault("TERM", "xterm-256color")
        env.setdefault("LANG", "C.UTF-8")
        env = {**rec.local.env, **rec.envs, **env}
        argv = [*self._cloud._enter(rec, cwd or "/home/user", env), "bash", "-i", "-l"]
        child = await asyncio.to_thread(
            pexpect.spawn,
            argv[0],
            argv[1:],
            echo=True,
            dimensions=(size.rows, size.cols),
        )
        handle = FakePtyHandle(child, on_data)
        rec.ptys[handle.pid] = child
        self._handles[handle.pid] = handle
        return handle

    async def send_stdin(self, pid: int, data: bytes, request_timeout: float | None = None) -> None:
        await self._cloud._live(self._id)
        handle = self._handles.get(pid)
        if handle is None or not handle._child.isalive():
            raise NotFoundException(f"process with pid {pid} not found")
        handle.write(bytes(data))

    async def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        await self._cloud._live(self._id)
        handle = self._handles.pop(pid, None)
        return await handle.kill() if handle is not None else False


# -- files -------------------------------------------------------------------------------------
class FakeFilesystem:
    def __init__(self, cloud: FakeE2BCloud, e2b_id: str) -> None:
        self._cloud, self._id = cloud, e2b_id

    async def _sh(
        self, rec: _Record, script: str, path: str, data: bytes | None = None
    ) -> tuple[int, bytes]:
        proc = await asyncio.create_subprocess_exec(
            *self._cloud._enter(rec, "/", rec.local.env),
            "sh",
            "-c",
            script,
            "sh",
            path,
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(data)
        assert proc.returncode is not None
        return proc.returncode, out if proc.returncode == 0 else err

    async def write(
        self,
        path: str,
        data: str | bytes,
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
        use_octet_stream: bool | None = None,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, str]:
        self._cloud.calls.append(("files.write", {"path": path, "user": user}))
        rec = await self._cloud._live(self._id)
        _require_root(user, "files.write")
        if not path.startswith("/"):
            path = "/home/user/" + path
        raw = data.encode() if isinstance(data, str) else bytes(data)
        code, err = await self._sh(rec, 'mkdir -p "$(dirname "$1")" && cat > "$1"', path, raw)
        if code != 0:
            raise SandboxException(f"400: cannot write {path}: {err.decode(errors='replace')}")
        return {"name": os.path.basename(path), "path": path}

    async def read(
        self,
        path: str,
        format: str = "text",
        user: str | None = None,
        request_timeout: float | None = None,
        gzip: bool = False,
    ) -> Any:
        self._cloud.calls.append(("files.read", {"path": path, "user": user}))
        rec = await self._cloud._live(self._id)
        _require_root(user, "files.read")
        code, out = await self._sh(
            rec,
            'if [ -d "$1" ]; then exit 21; elif [ ! -e "$1" ]; then exit 44; fi; cat "$1"',
            path,
        )
        if code == 44:
            raise FileNotFoundException(f"404: path '{path}' does not exist")
        if code == 21:
            raise InvalidArgumentException(f"400: path '{path}' is a directory")
        if code != 0:
            raise SandboxException(f"cannot read {path}: {out.decode(errors='replace')}")
        if format == "bytes":
            return bytearray(out)
        return out.decode()


# -- the sandbox class -------------------------------------------------------------------------
class _KillVariant:
    """`kill` on an instance kills it; `AsyncSandbox.kill(sandbox_id)` kills by id (as the SDK)."""

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., Any]:
        if obj is not None:
            # Like the SDK, an instance call reuses the key the sandbox was created with.
            return lambda **opts: obj._cls_kill(obj.sandbox_id, **{"api_key": obj._api_key, **opts})
        return lambda sandbox_id, **opts: objtype._cls_kill(sandbox_id, **opts)


class FakeAsyncSandbox:
    _cloud: FakeE2BCloud  # bound per cloud by `_make_sdk`
    default_template = "base"

    def __init__(self, rec: _Record, api_key: str) -> None:
        self.sandbox_id = rec.e2b_id
        self._api_key = api_key
        self.commands = FakeCommands(self._cloud, rec.e2b_id)
        self.pty = FakePty(self._cloud, rec.e2b_id)
        self.files = FakeFilesystem(self._cloud, rec.e2b_id)

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109  (the SDK's signature)
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        secure: bool | None = None,
        allow_internet_access: bool | None = None,
        **opts: Any,
    ) -> FakeAsyncSandbox:
        cloud = cls._cloud
        cloud.calls.append(
            (
                "create",
                {
                    "template": template,
                    "timeout": timeout,
                    "metadata": dict(metadata or {}),
                    "envs": dict(envs or {}),
                    "allow_internet_access": allow_internet_access,
                    **opts,
                },
            )
        )
        cloud._check_key(opts.get("api_key"))
        template = template or cls.default_template
        if template not in cloud.templates:
            raise NotFoundException(f"404: template '{template}' not found")
        for k, v in (metadata or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgumentException(f"metadata must map str to str, got {k!r}: {v!r}")
        spec = SandboxSpec(
            workdir="/home/user",
            network=True if allow_internet_access is None else allow_internet_access,
            memory_mb=None,
            pids_limit=None,
        )
        local = await cloud.local.create(spec)
        now = time.time()
        rec = _Record(
            e2b_id="i" + uuid.uuid4().hex[:19],
            template=template,
            metadata=dict(metadata or {}),
            envs=dict(envs or {}),
            local=local,
            started_at=now,
            end_at=now + (timeout if timeout is not None else 300),
        )
        cloud.records[rec.e2b_id] = rec
        if cloud.create_latency_s:
            await asyncio.sleep(cloud.create_latency_s)
        return cls(rec, opts.get("api_key") or "")

    async def is_running(self, request_timeout: float | None = None) -> bool:
        rec = self._cloud.records.get(self.sandbox_id)
        if rec is None:
            return False
        if not self._cloud._alive(rec):
            await self._cloud._reap(rec)
            return False
        return await rec.local.is_alive()

    async def set_timeout(self, timeout: int, **opts: Any) -> None:  # noqa: ASYNC109  (the SDK's)
        """E2B's `set_timeout`: the sandbox now ends `timeout` seconds from now."""
        self._cloud.calls.append(
            ("set_timeout", {"sandbox_id": self.sandbox_id, "timeout": timeout})
        )
        self._cloud._check_key(opts.get("api_key") or self._api_key or None)
        rec = await self._cloud._live(self.sandbox_id)
        rec.end_at = time.time() + timeout

    kill = _KillVariant()

    @classmethod
    async def _cls_kill(cls, sandbox_id: str, **opts: Any) -> bool:
        cls._cloud.calls.append(("kill", {"sandbox_id": sandbox_id}))
        cls._cloud._check_key(opts.get("api_key"))
        rec = cls._cloud.records.get(sandbox_id)
        if rec is None or not cls._cloud._alive(rec):
            return False
        await cls._cloud._reap(rec)
        return True

    @classmethod
    def list(
        cls,
        query: SandboxQuery | None = None,
        limit: int | None = None,
        next_token: str | None = None,
        **opts: Any,
    ) -> FakePaginator:
        cls._cloud._check_key(opts.get("api_key"))
        return FakePaginator(cls._cloud, query, limit or cls._cloud.page_size)


class FakePaginator:
    """Pages of `SandboxInfo`: `while p.has_next: await p.next_items()` (as the SDK)."""

    def __init__(self, cloud: FakeE2BCloud, query: SandboxQuery | None, limit: int) -> None:
        self._cloud, self._query, self._limit = cloud, query, limit
        self._offset = 0
        self.has_next = True

    async def next_items(self) -> list[SandboxInfo]:
        if not self.has_next:
            raise Exception("No more items to fetch")
        want = (self._query.metadata if self._query else None) or {}
        matching = [
            r
            for r in self._cloud.records.values()
            if self._cloud._alive(r) and all(r.metadata.get(k) == v for k, v in want.items())
        ]
        page = matching[self._offset : self._offset + self._limit]
        self._offset += len(page)
        self.has_next = self._offset < len(matching)
        return [
            SandboxInfo(
                sandbox_id=r.e2b_id,
                template_id=r.template,
                name=r.template,
                metadata=dict(r.metadata),
                started_at=datetime.fromtimestamp(r.started_at, UTC),
                end_at=datetime.fromtimestamp(r.end_at, UTC),
            )
            for r in page
        ]


def _make_sdk(cloud: FakeE2BCloud) -> types.SimpleNamespace:
    bound = type("AsyncSandbox", (FakeAsyncSandbox,), {"_cloud": cloud})
    return types.SimpleNamespace(
        AsyncSandbox=bound,
        SandboxQuery=SandboxQuery,
        PtySize=PtySize,
        CommandExitException=CommandExitException,
        SandboxException=SandboxException,
        TimeoutException=TimeoutException,
        InvalidArgumentException=InvalidArgumentException,
        NotFoundException=NotFoundException,
        FileNotFoundException=FileNotFoundException,
        SandboxNotFoundException=SandboxNotFoundException,
        SandboxNotRunningException=SandboxNotRunningException,
        AuthenticationException=AuthenticationException,
    )

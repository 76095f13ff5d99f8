"""The `null` backend: in-memory sandboxes for unit tests and protocol benchmarks.

Commands are interpreted by a tiny fake shell (`echo`, `printf`, `cat`, `pwd`, `cd`, `export`,
`true`, `false`, `exit N`, `sleep S`, redirection with `>` of echo output); files live in a dict.
Fault injection knobs (`create_delay_s`, `fail_creates`, `kill`) let pool and server tests
exercise slow creation, failing keys and dead sandboxes without any real process.
"""

from __future__ import annotations

import asyncio
import shlex
import time
import uuid
from pathlib import Path

from sandgym.sandboxes.base import Sandbox, SandboxBackend, SandboxCapabilities
from sandgym.sandboxes.errors import (
    SandboxCreateError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from sandgym.sandboxes.health import ensure_healthy
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.spec import ExecResult, SandboxSpec, ShellResult


class NullSandbox(Sandbox):
    backend_name = "null"
    # a fake shell (no mkdir/chmod/chown); files live in a dict
    capabilities = SandboxCapabilities(runs_real_commands=False)

    def __init__(self, spec: SandboxSpec, backend: NullBackend) -> None:
        super().__init__(spec)
        self._backend = backend
        self.files: dict[str, bytes] = {}
        self.cwd = spec.workdir
        self.env = dict(spec.env)
        self.dead = False
        self.keys: list[str] = []

    def kill(self) -> None:
        """Simulate the sandbox dying underneath its user."""
        self.dead = True

    async def snapshot(self) -> str:
        self._check_open()
        snap = "nullsnap-" + uuid.uuid4().hex[:12]
        self._backend.snapshots[snap] = dict(self.files)
        return snap

    async def _apply_network(self, policy: NetworkPolicy) -> None:
        """No network exists here: a switch is only recorded (`self.network`)."""

    def _check_live(self) -> None:
        self._check_open()
        if self.dead:
            raise SandboxLostError(f"sandbox {self.id} is dead")

    async def _destroy(self) -> None:
        self._backend.live.discard(self.id)
        self._backend.destroyed += 1

    async def is_alive(self) -> bool:
        return not self._closed and not self.dead

    def _interpret(self, command: str) -> tuple[str, int, float]:
        """Return (output, exit_code, sleep_s) for a fake command line."""
        try:
            # No quote or escape: shlex would only split on whitespace, 20x slower.
            simple = not any(c in command for c in "'\"\\")
            argv = command.split() if simple else shlex.split(command)
        except ValueError as exc:
            return f"bash: syntax error: {exc}\n", 2, 0.0
        if not argv:
            return "", 0, 0.0
        redirect = None
        if len(argv) >= 2 and argv[-2] == ">":
            redirect, argv = argv[-1], argv[:-2]
        prog, args = argv[0], argv[1:]
        out, code, sleep = "", 0, 0.0
        if prog == "echo":
            out = " ".join(self.env.get(a[1:], "") if a.startswith("$") else a for a in args)
            out += "\n"
        elif prog == "printf":
            out = args[0] if args else ""
        elif prog == "true" or prog == ":":
            pass
        elif prog == "false":
            code = 1
        elif prog == "exit":
            code = int(args[0]) if args else 0
        elif prog == "pwd":
            out = self.cwd + "\n"
        elif prog == "cd":
            self.cwd = normalize_sandbox_path(args[0] if args else "/", self.cwd)
        elif prog == "export":
            for a in args:
                k, _, v = a.partition("=")
                self.env[k] = v
        elif prog == "sleep":
            sleep = float(args[0]) if args else 0.0
        elif prog == "cat":
            for a in args:
                p = normalize_sandbox_path(a, self.cwd)
                if p not in self.files:
                    return f"cat: {a}: No such file or directory\n", 1, 0.0
                out += self.files[p].decode(errors="replace")
        else:
            return f"bash: {prog}: command not found\n", 127, 0.0
        if redirect is not None:
            self.files[normalize_sandbox_path(redirect, self.cwd)] = out.encode()
            out = ""
        return out, code, sleep

    async def _run_line(self, command: str, timeout_s: float) -> tuple[str, int | None, float]:
        """(output, exit code or None on timeout, seconds) of one fake command line."""
        self._check_live()
        start = time.perf_counter()
        out, code, sleep = self._interpret(command)
        if sleep:
            if sleep > timeout_s:
                await asyncio.sleep(timeout_s)
                return "", None, time.perf_counter() - start
            await asyncio.sleep(sleep)
        return out, code, time.perf_counter() - start

    async def exec(self, cmd, timeout_s=60.0, cwd=None, env=None, user=None) -> ExecResult:
        command = cmd if isinstance(cmd, str) else shlex.join(cmd)
        out, code, duration_s = await self._run_line(command, timeout_s)
        if code is None:
            return ExecResult(exit_code=None, timed_out=True, duration_s=duration_s)
        stderr = out if code not in (0, 1) or "not found" in out else ""
        stdout = "" if stderr else out
        return ExecResult(exit_code=code, stdout=stdout, stderr=stderr, duration_s=duration_s)

    async def run(self, command: str, timeout_s: float = 60.0) -> ShellResult:
        out, code, duration_s = await self._run_line(command, timeout_s)
        return ShellResult(
            output=out, exit_code=code, timed_out=code is None, duration_s=duration_s
        )

    async def send_keys(self, keys: str) -> None:
        self._check_live()
        self.keys.append(keys)

    async def screen(self) -> str:
        self._check_live()
        return "".join(self.keys)

    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        self._check_live()
        data = content.encode() if isinstance(content, str) else content
        self.files[normalize_sandbox_path(path, self.spec.workdir)] = data

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check_live()
        p = normalize_sandbox_path(path, self.spec.workdir)
        if p not in self.files:
            raise SandboxFileNotFoundError(f"no such file in sandbox: {p}")
        data = self.files[p]
        return data if max_bytes is None else data[:max_bytes]

    async def upload(self, src: Path, dst: str) -> None:
        self._check_live()
        src = Path(src)
        base = normalize_sandbox_path(dst, self.spec.workdir)
        if src.is_file():
            self.files[base] = src.read_bytes()
            return
        for p in src.rglob("*"):
            if p.is_file():
                self.files[base + "/" + p.relative_to(src).as_posix()] = p.read_bytes()

    async def download(self, src: str, dst: Path) -> None:
        self._check_live()
        base = normalize_sandbox_path(src, self.spec.workdir)
        dst = Path(dst)
        if base in self.files:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(self.files[base])
            return
        found = False
        for p, data in self.files.items():
            if p.startswith(base + "/"):
                out = dst / p[len(base) + 1 :]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
                found = True
        if not found:
            raise SandboxFileNotFoundError(f"no such file or directory in sandbox: {base}")


class NullBackend(SandboxBackend):
    """In-memory backend. `create_delay_s` simulates slow creation; `fail_creates` makes the
    next N creations fail (or every one, with -1)."""

    name = "null"

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 6 * 3600,
        create_delay_s: float = 0.0,
        fail_creates: int = 0,
    ) -> None:
        super().__init__(owner_id, lease_s)
        self.create_delay_s = create_delay_s
        self.fail_creates = fail_creates
        self.created = 0
        self.destroyed = 0
        self.live: set[str] = set()
        #: snapshot id -> the files it holds
        self.snapshots: dict[str, dict[str, bytes]] = {}

    async def remove_snapshot(self, snapshot: str) -> None:
        self.snapshots.pop(snapshot, None)

    def check_network(self, spec: SandboxSpec) -> None:
        """Any policy: nothing in a null sandbox can reach anything."""

    async def create(self, spec: SandboxSpec) -> NullSandbox:
        self.check_services(spec)
        if self.create_delay_s:
            await asyncio.sleep(self.create_delay_s)
        if self.fail_creates:
            if self.fail_creates > 0:
                self.fail_creates -= 1
            raise SandboxCreateError("null backend: creation failure injected")
        sb = NullSandbox(spec, self)
        if spec.snapshot is not None:
            if spec.snapshot not in self.snapshots:
                raise SandboxCreateError(f"null backend: no snapshot {spec.snapshot!r}")
            sb.files = dict(self.snapshots[spec.snapshot])
        self.created += 1
        self.live.add(sb.id)
        await ensure_healthy(sb)
        return sb

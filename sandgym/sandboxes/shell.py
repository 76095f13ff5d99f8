"""The persistent interactive shell of a sandbox: bash on a pty, sentinel-delimited output.

One `PtyShell` lives for a whole episode, so a `command` step costs one write and one read
on a pty instead of a new process, and the shell keeps its state (cwd, exported variables,
functions) between commands. Output is read from the pty fd by the event loop (no thread per
read). `send_keys` writes raw keys for full-screen programs, and `screen()` renders what the
terminal shows with pyte.

The pty is made in the server and the shell spawned without forking the server (`setsid --ctty`,
see `_PtyChild`; pexpect's fork is used only when a `preexec_fn` is given).

How a command runs: its text travels as ANSI-C quoted chunks (no line over the tty's 4096-byte
limit, no extra process) and is `eval`ed by the shell with stdin from /dev/null (so a command that reads stdin cannot hang the episode; interactive programs are driven
with `send_keys`), then a sentinel carrying the exit status is printed. On timeout the shell is
sent ^C, every descendant of the shell is killed through the backend's `kill_tree` hook, and a
fresh sentinel re-synchronises the shell, which stays usable. If it does not answer, it is
restarted (state lost, and the result says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import termios
import time
import uuid
from collections.abc import Awaitable, Callable

import pexpect
import pyte

from sandgym.sandboxes.common.kill import count_children_script as count_children_script
from sandgym.sandboxes.common.kill import kill_tree_script as kill_tree_script
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES, CappedBuffer, mark_truncated
from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.errors import SandboxLostError, ShellExitedError
from sandgym.sandboxes.spec import ShellResult

log = logging.getLogger(__name__)

KillTree = Callable[[int], Awaitable[None]]
CountChildren = Callable[[int], Awaitable[int]]

#: Named keys accepted inside `<...>` by `send_keys`, besides raw characters and escapes.
NAMED_KEYS: dict[str, str] = {
    "enter": "\r",
    "return": "\r",
    "esc": "\x1b",
    "escape": "\x1b",
    "tab": "\t",
    "space": " ",
    "backspace": "\x7f",
    "bs": "\x7f",
    "delete": "\x1b[3~",
    "del": "\x1b[3~",
    "up": "\x1b[A",
    "down": "\x1b[B",
    "right": "\x1b[C",
    "left": "\x1b[D",
    "home": "\x1b[H",
    "end": "\x1b[F",
    "pageup": "\x1b[5~",
    "pagedown": "\x1b[6~",
}
_SENTINELS = re.compile(rb"\n?__SG_(?:[0-9a-f]+_RC_\d+|SYNC_[0-9a-f]+|READY_[0-9a-f]+_\d+)__\n?")
# One compiled pattern for every command's end sentinel: compiling a pattern per command (its
# nonce inside) was ~15% of the server's CPU with 64 local sessions stepping.
_RC_SENTINEL = re.compile(rb"\n?__SG_([0-9a-f]{10})_RC_(\d+)__\n")


class _RcSentinel:
    """Finds the end sentinel of one command (its nonce), ignoring any other command's."""

    def __init__(self, nonce: str) -> None:
        self._nonce = nonce.encode()

    def search(self, data: bytes) -> re.Match[bytes] | None:
        for m in _RC_SENTINEL.finditer(data):
            if m.group(1) == self._nonce:
                return m
        return None


_KEY_TOKEN = re.compile(r"<([A-Za-z]+|[CcMm]-.)>")


def translate_keys(keys: str) -> str:
    """Turn `<Enter>`, `<Esc>`, `<C-c>`, `<M-x>`, `<Up>`... into terminal bytes; the rest is raw."""

    def sub(m: re.Match[str]) -> str:
        tok = m.group(1)
        low = tok.lower()
        if low in NAMED_KEYS:
            return NAMED_KEYS[low]
        if len(tok) == 3 and tok[1] == "-":
            if low[0] == "c":
                return chr(ord(tok[2].lower()) & 0x1F)
            if low[0] == "m":
                return "\x1b" + tok[2]
        return m.group(0)

    return _KEY_TOKEN.sub(sub, keys)


def ansi_c_quote(text: str) -> str:
    """Quote `text` as a bash $'...' string using only printable ASCII (safe on a tty)."""
    out = ["$'"]
    for ch in text:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        else:
            out.append("".join(f"\\x{b:02x}" for b in ch.encode()))
    out.append("'")
    return "".join(out)


class _Screen(pyte.Screen):
    """pyte's Screen, tolerant of private SGR sequences (vim sends `CSI > 4;2 m`)."""

    def select_graphic_rendition(self, *attrs: int, **kwargs: object) -> None:
        if kwargs.get("private"):
            return
        super().select_graphic_rendition(*attrs)


def _resolve(fut: asyncio.Future[bool], value: bool = True) -> None:
    if not fut.done():
        fut.set_result(value)


class _PtyChild:
    """A process on a fresh pty, spawned without forking the server.

    pexpect forks the server process to set the pty up in the child; with a server of a
    hundred MiB that fork (and the copy-on-write faults after it) cost 5-13 ms of CPU per
    shell. Here the pty is made in the server and the child is spawned the way subprocess does
    without a preexec_fn (vfork + exec): `setsid --ctty` makes it a session leader whose
    controlling terminal is the pty, which is what bash's job control and ^C need.
    """

    def __init__(self, argv: list[str], env: dict[str, str] | None, rows: int, cols: int):
        master, slave = os.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
            attrs = termios.tcgetattr(slave)
            attrs[3] &= ~termios.ECHO  # as pexpect's echo=False
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            self.proc = subprocess.Popen(
                ["setsid", "--ctty", *argv],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=env,
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.child_fd = master
        self.pid = self.proc.pid

    def isalive(self) -> bool:
        return self.proc.poll() is None

    @property
    def exitstatus(self) -> int | None:
        """The exit status once it has ended (as pexpect's), None while it runs or when a
        signal ended it."""
        code = self.proc.returncode
        return code if code is not None and code >= 0 else None

    def terminate(self, force: bool = False) -> bool:
        """Hang up (as a closing terminal would), then kill what is left."""
        for sig in (signal.SIGHUP, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
        try:
            self.proc.wait(0.1)
        except subprocess.TimeoutExpired:
            if not force:
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.proc.wait()
        return True

    def close(self, force: bool = False) -> None:
        with contextlib.suppress(OSError):
            os.close(self.child_fd)
        if self.proc.poll() is None:
            self.terminate(force)


class PtyShell:
    """A persistent bash on a pty. Not safe for concurrent `run` calls (one at a time)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        kill_tree: KillTree | None = None,
        count_children: CountChildren | None = None,
        rows: int = 24,
        cols: int = 80,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        preexec_fn: Callable[[], None] | None = None,
        start_timeout_s: float = 15.0,
    ) -> None:
        self.argv = argv
        self.env = env
        self.kill_tree = kill_tree
        self.count_children = count_children
        self.rows, self.cols = rows, cols
        self.max_output_bytes = max_output_bytes
        self.preexec_fn = preexec_fn
        self.start_timeout_s = start_timeout_s
        self.inner_pid: int | None = None
        self.restarts = 0
        self._child: pexpect.spawn | _PtyChild | None = None
        self._fd: int = -1
        self._out = CappedBuffer(max_output_bytes)  # output of the current command
        self._tail = bytearray()  # last bytes seen, for sentinel matching past the cap
        self._screen_pending = bytearray()
        self._waiter: asyncio.Future[bool] | None = None  # a `_next_data` waiting for output
        self._eof = False
        self._lock = asyncio.Lock()
        self._keys_dirty = False
        self._screen = _Screen(cols, rows)
        self._screen.set_mode(pyte.modes.LNM)
        self._stream = pyte.ByteStream(self._screen)

    # -- process lifecycle -------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Host pid of the spawned process (bwrap/nsenter/docker client)."""
        return self._child.pid if self._child is not None else None

    async def start(self) -> None:
        await asyncio.to_thread(self._spawn)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._fd, self._on_readable)
        marker = "__SG_READY_" + uuid.uuid4().hex[:8]
        init = (
            "stty -echo -onlcr cols %d rows %d 2>/dev/null; set +m; export PS1='' PS2='' PS0='' "
            "PROMPT_COMMAND='' HISTFILE=/dev/null TERM=xterm; "
            "bind 'set enable-bracketed-paste off' 2>/dev/null; unset HISTFILE; "
            "printf '%s_%%d__\\n' $$\n" % (self.cols, self.rows, marker)
        )
        self._write(init.encode())
        pattern = re.compile(rb"%s_(\d+)__" % marker.encode())
        m = await self._wait_for(pattern, self.start_timeout_s)
        if m is None:
            out = bytes(self._out.data[-500:]).decode(errors="replace")
            await self.close()
            raise SandboxLostError(f"shell did not start: expected a ready marker, got {out!r}")
        self.inner_pid = int(m.group(1))
        self._reset_buffers()
        # The init line may have been echoed before `stty -echo` took effect: start blank.
        self._screen_pending.clear()
        self._screen.reset()

    def _spawn(self) -> None:
        if self.preexec_fn is None and shutil.which("setsid"):
            self._child = _PtyChild(self.argv, self.env, self.rows, self.cols)
        else:  # pexpect forks the whole server (with a preexec_fn, that is needed)
            self._child = pexpect.spawn(
                self.argv[0],
                self.argv[1:],
                env=self.env,
                echo=False,
                dimensions=(self.rows, self.cols),
                preexec_fn=self.preexec_fn,
            )
        self._fd = self._child.child_fd
        os.set_blocking(self._fd, False)

    async def close(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._fd)

        def _kill() -> None:
            with contextlib.suppress(Exception):
                child.terminate(force=True)
            with contextlib.suppress(Exception):
                child.close(force=True)

        await asyncio.to_thread(_kill)

    def is_alive(self) -> bool:
        return self._child is not None and not self._eof and self._child.isalive()

    async def _exit_status(self, wait_s: float = 2.0) -> int | None:
        """The ended shell's exit status: its output has ended, its process follows within
        moments (polled up to `wait_s`); None when it cannot be had."""
        child = self._child
        deadline = time.monotonic() + wait_s
        try:
            while child is not None and child.isalive():
                if time.monotonic() > deadline:
                    return None
                await asyncio.sleep(0.02)
        except Exception:  # noqa: BLE001 - a child we cannot poll has no status to give
            return None
        status = getattr(child, "exitstatus", None)
        return status if isinstance(status, int) else None

    # -- reading -----------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._eof = True
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._fd)
            self._wake()
            return
        self._out.add(data)
        self._tail = (self._tail + data)[-256:]
        self._screen_pending += data
        if len(self._screen_pending) > 262144:
            del self._screen_pending[:-131072]
        self._wake()

    def _reset_buffers(self) -> None:
        self._out.clear()
        self._tail.clear()

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter)

    async def _wait_for(
        self, pattern: re.Pattern[bytes] | _RcSentinel, timeout_s: float
    ) -> re.Match[bytes] | None:
        deadline = time.monotonic() + timeout_s
        while True:
            m = pattern.search(bytes(self._tail)) or pattern.search(bytes(self._out.data[-4096:]))
            if m:
                return m
            if self._eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._next_data(remaining)

    async def _next_data(self, timeout_s: float) -> bool:
        """Wait until more output arrives (or EOF), at most `timeout_s`; False on timeout. A
        bare future and a timer, not `wait_for(event.wait())`: that made a task per wait, a
        tenth of a step's CPU on the local backend."""
        loop = asyncio.get_running_loop()
        fut = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()
            self._waiter = None

    def _write(self, data: bytes) -> None:
        if self._child is None or self._eof:
            raise SandboxLostError("the sandbox shell has exited")
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                time.sleep(0.001)  # pty buffer full: only for very long commands
                continue
            view = view[n:]

    # -- commands ----------------------------------------------------------------------------
    async def run(self, command: str, timeout_s: float = 60.0) -> ShellResult:
        async with self._lock:
            if not self.is_alive():
                raise SandboxLostError("the sandbox shell has exited")
            if self._keys_dirty:
                busy = await self._foreground_busy()
                if busy:
                    return ShellResult(
                        output="[sandgym: a program started with keys is still running in the "
                        "foreground; finish it with keys first]\n",
                        exit_code=None,
                    )
                await self._resync(5.0)
                self._keys_dirty = False
            return await self._run_locked(command, timeout_s)

    async def _run_locked(self, command: str, timeout_s: float) -> ShellResult:
        start = time.perf_counter()
        nonce = uuid.uuid4().hex[:10]
        # The command travels as ANSI-C quoted chunks appended to a variable: no fork (fast),
        # and no line longer than the tty's 4096-byte canonical-mode limit.
        chunks = [ansi_c_quote(command[i : i + 700]) for i in range(0, len(command), 700)] or ["''"]
        lines = "__sg_c=" + chunks[0] + "\n" + "".join(f"__sg_c+={c}\n" for c in chunks[1:])
        lines += f"eval \"$__sg_c\" < /dev/null; printf '\\n__SG_{nonce}_RC_%d__\\n' $?\n"
        self._reset_buffers()
        self._write(lines.encode())
        m = await self._wait_for(_RcSentinel(nonce), timeout_s)
        if m is not None:
            output, truncated = self._take_output(m)
            return ShellResult(
                output=output,
                exit_code=int(m.group(2)),
                truncated=truncated,
                duration_s=time.perf_counter() - start,
            )
        if self._eof:
            output, truncated = self._take_output(None)
            raise ShellExitedError(
                "the sandbox shell exited while running a command",
                ShellResult(
                    output=output,
                    exit_code=await self._exit_status(),
                    truncated=truncated,
                    duration_s=time.perf_counter() - start,
                    shell_exited=True,
                ),
            )
        # Timed out: interrupt, kill the command's process tree, re-synchronise the shell.
        output, truncated = self._take_output(None)
        note = await self._interrupt()
        return ShellResult(
            output=output + note,
            exit_code=None,
            timed_out=True,
            truncated=truncated,
            duration_s=time.perf_counter() - start,
        )

    def _take_output(self, m: re.Match[bytes] | None) -> tuple[str, bool]:
        data = bytes(self._out.data)
        if m is not None:
            idx = data.rfind(m.group(0))
            if idx >= 0:
                data = data[:idx]
            else:  # sentinel only in the tail: output was cut before it
                data = data[: self.max_output_bytes]
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        dropped = self._out.dropped
        self._reset_buffers()
        return mark_truncated(text, dropped)

    async def _interrupt(self) -> str:
        with contextlib.suppress(SandboxLostError):
            self._write(b"\x03")
        await asyncio.sleep(0.05)
        if self.kill_tree is not None and self.inner_pid is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kill_tree(self.inner_pid), 15)
        if await self._resync(5.0):
            return "\n[sandgym: command timed out; its processes were killed]\n"
        await self._restart()
        return "\n[sandgym: command timed out; the shell did not recover and was restarted]\n"

    async def _resync(self, timeout_s: float) -> bool:
        """Clear any half-typed line and wait until the shell answers a fresh sentinel."""
        nonce = uuid.uuid4().hex[:10]
        try:
            self._write(f"\x15\nprintf '__SG_SYNC_{nonce}__\\n'\n".encode())
        except SandboxLostError:
            return False
        ok = await self._wait_for(re.compile(rb"__SG_SYNC_%s__" % nonce.encode()), timeout_s)
        self._reset_buffers()
        return ok is not None

    async def _restart(self) -> None:
        await self.close()
        self._eof = False
        self.restarts += 1
        self._reset_buffers()
        await self.start()

    async def _foreground_busy(self) -> bool:
        if self.count_children is None or self.inner_pid is None:
            return False
        try:
            return await self.count_children(self.inner_pid) > 0
        except Exception as exc:  # keys are still sent; only the wait for output is shorter
            tolerate("shell.foreground_busy", exc, log)
            return False

    # -- raw keys and the screen -------------------------------------------------------------
    async def send_keys(self, keys: str, settle_s: float = 0.05, max_wait_s: float = 1.0) -> None:
        """Write raw keys, then wait until output settles (so `screen()` shows the effect)."""
        async with self._lock:
            self._keys_dirty = True
            self._write(translate_keys(keys).encode())
            deadline = time.monotonic() + max_wait_s
            while time.monotonic() < deadline:
                if not await self._next_data(settle_s):
                    break  # output settled
            self._reset_buffers()

    def screen(self) -> str:
        if self._screen_pending:
            data = _SENTINELS.sub(b"", bytes(self._screen_pending))
            self._screen_pending.clear()
            try:
                self._stream.feed(data)
            except Exception:  # a sequence pyte cannot parse must not break the episode
                self._screen.reset()
        return "\n".join(line.rstrip() for line in self._screen.display).rstrip("\n")

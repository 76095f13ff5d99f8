"""The persistent shell of an E2B sandbox: the project's sentinel shell
(`sandgym.sandboxes.shell.PtyShell`) over an E2B pty, whose bytes are bridged onto a local socketpair,
so reading, sentinels, timeouts, resync and the pyte screen are the code the local and docker
backends use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pyte

from sandgym.sandboxes.e2b.api import E2BApi
from sandgym.sandboxes.errors import SandboxError
from sandgym.sandboxes.shell import PtyShell

log = logging.getLogger(__name__)


class _PtyChild:
    """What `PtyShell` expects of its pexpect child, for a pty that lives in an E2B VM."""

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


class _E2BPtyShell(PtyShell):
    """The sentinel shell over an E2B pty.

    `PtyShell` reads and writes one non-blocking fd; here that fd is one end of a local
    socketpair. Bytes the shell writes are forwarded, in order, to the pty with `send_stdin`;
    bytes the pty prints arrive through the SDK's `on_data` callback and are written to the
    other end. Only spawning and closing differ from the pexpect transport.
    """

    def __init__(
        self,
        sbx: Any,
        api: E2BApi,
        call: Callable[[str, Any], Awaitable[Any]],
        *,
        user: str,
        cwd: str,
        envs: dict[str, str],
        sandbox_closed: Callable[[], bool],
        **kwargs: Any,
    ) -> None:
        """`sbx`: the SDK's sandbox handle; `call`: the sandbox's wrapper for one SDK call
        (its timeout and error mapping); `user`, `cwd`, `envs`: the shell's; `sandbox_closed`:
        whether the sandbox is closed (then its pty is gone with it)."""
        super().__init__([], **kwargs)
        self._sbx, self._api, self._call = sbx, api, call
        self._user, self._cwd, self._envs = user, cwd, envs
        self._sandbox_closed = sandbox_closed
        self._handle: Any = None
        self._ours: socket.socket | None = None
        self._theirs: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.pty_pid: int | None = None
        self.pty_running = False

    async def start(self) -> None:
        sdk = self._api.sdk
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
            self._handle = await self._call(
                "start the shell pty",
                self._sbx.pty.create(
                    size=sdk.PtySize(rows=self.rows, cols=self.cols),
                    on_data=on_data,
                    user=self._user,
                    cwd=self._cwd,
                    envs=dict(self._envs),
                    timeout=0,  # the pty lives as long as the episode
                    request_timeout=self._api.request_timeout_s,
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
        await super().start()  # `_spawn` below only hands PtyShell our fd
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
                await self._call(
                    "write to the shell pty",
                    self._sbx.pty.send_stdin(
                        self.pty_pid, data, request_timeout=self._api.request_timeout_s
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
        if handle is not None and pid is not None and not self._sandbox_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._sbx.pty.kill(pid, request_timeout=self._api.request_timeout_s),
                    self._api.request_timeout_s + 5,
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

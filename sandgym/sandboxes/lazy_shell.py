"""`ShellSandbox`: a `Sandbox` whose persistent shell starts on first use.

The docker, e2b and local backends each run one `sandgym.sandboxes.shell.PtyShell` per sandbox; how
the shell process is spawned differs (`docker exec -it`, an E2B pty, `nsenter`), the rest is
here: start it lazily under a lock, start a new one when the old exited (`exit` typed, client
killed; its state is gone), and the `run` / `send_keys` / `screen` / `warm_up` /
`shell_alive` part of the protocol. A backend supplies `_start_shell` and `_run_helper`, and may
refine what a dead shell means (`_after_shell_exit`, `_shell_error`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from typing import TYPE_CHECKING

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.common.kill import count_children_script, kill_tree_script
from sandgym.sandboxes.errors import SandboxLostError, ShellExitedError
from sandgym.sandboxes.spec import SandboxSpec, ShellResult

if TYPE_CHECKING:
    from sandgym.sandboxes.shell import PtyShell


class ShellSandbox(Sandbox):
    """A sandbox with a lazily started persistent shell (see the module docstring)."""

    def __init__(self, spec: SandboxSpec, sandbox_id: str | None = None) -> None:
        super().__init__(spec, sandbox_id)
        self._shell: PtyShell | None = None
        self._shell_lock = asyncio.Lock()

    # -- what a backend supplies -------------------------------------------------------------
    @abc.abstractmethod
    async def _start_shell(self) -> PtyShell:
        """A new, started shell; its `kill_tree` and `count_children` hooks are normally
        `self._kill_tree` and `self._count_children`."""

    @abc.abstractmethod
    async def _run_helper(self, script: str) -> str:
        """Run a short sh script inside the sandbox to completion; its stdout."""

    async def _before_shell(self) -> None:
        """Raise unless the sandbox can serve its shell now (by default: it is not closed)."""
        self._check_open()

    async def _after_shell_exit(self) -> None:
        """The old shell exited: raise SandboxLostError if the sandbox went with it."""

    async def _shell_error(self, exc: SandboxLostError) -> SandboxLostError:
        """What to raise when the shell died under a command (by default `exc` itself)."""
        return exc

    # -- the shell ---------------------------------------------------------------------------
    async def _get_shell(self) -> PtyShell:
        await self._before_shell()
        async with self._shell_lock:
            if self._shell is not None and not self._shell.is_alive():
                old, self._shell = self._shell, None
                with contextlib.suppress(Exception):
                    await old.close()
                await self._after_shell_exit()
            if self._shell is None:
                self._shell = await self._start_shell()
            return self._shell

    async def _close_shell(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            with contextlib.suppress(Exception):
                await shell.close()

    async def _kill_tree(self, pid: int) -> None:
        await self._run_helper(kill_tree_script(pid))

    async def _count_children(self, pid: int) -> int:
        return int((await self._run_helper(count_children_script(pid))).strip() or 0)

    async def warm_up(self) -> None:
        await self._get_shell()

    def shell_alive(self) -> bool | None:
        return None if self._shell is None else bool(self._shell.is_alive())

    async def run(self, command: str, timeout_s: float = 60.0) -> ShellResult:
        shell = await self._get_shell()
        try:
            return await shell.run(command, timeout_s)
        except SandboxLostError as exc:
            if isinstance(exc, ShellExitedError) and await self._outlived_shell():
                # The sandbox lives: the command itself ended its shell (`exit`, `exec`,
                # `kill $$`). That is the agent's doing, so it is the command's result (scored),
                # never a lost sandbox (masked as infrastructure); the next command gets a new
                # shell, without this one's state.
                return exc.result
            err = await self._shell_error(exc)
            if err is exc:
                raise
            raise err from exc

    async def _outlived_shell(self) -> bool:
        """Whether the sandbox still lives after its shell ended. Asked three times, 0.2 s
        apart: a killed sandbox's shell can end a moment before its engine reports it."""
        for attempt in range(3):
            if attempt:
                await asyncio.sleep(0.2)
            if not await self.is_alive():
                return False
        return True

    async def send_keys(self, keys: str) -> None:
        shell = await self._get_shell()
        await shell.send_keys(keys)

    async def screen(self) -> str:
        shell = await self._get_shell()
        return shell.screen()

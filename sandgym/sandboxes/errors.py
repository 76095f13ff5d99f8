"""The sandbox error tree: every failure of a sandbox or backend is one of these named types.

Each error inherits both `SandboxError` and the builtin it resembles, so callers can catch
either. A non-zero exit code is *not* an error: it is data in `ExecResult.exit_code`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandgym.sandboxes.spec import ShellResult


class SandboxError(Exception):
    """Base class of every error raised by the sandbox layer."""


class BackendUnavailableError(SandboxError, RuntimeError):
    """The backend cannot run here (no Docker engine, no bwrap, no API key, ...)."""


class UnknownBackendError(SandboxError, KeyError):
    """No backend is registered under the requested name."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown backend"


class SandboxCreateError(SandboxError, RuntimeError):
    """Creating the sandbox failed (image missing, build failed, limits refused, ...).

    `cause` names the step that failed, set where it is raised: `build` (an image build failed;
    the message carries the build's output), `healthcheck` (`SandboxHealthcheckError`),
    `image_missing` (a compose service's named image is not in the engine, and no registry is
    used), `subnet_in_use` (a group's fixed subnet is held by another network of the engine),
    `create` (anything else).
    """

    def __init__(self, message: str, cause: str = "create") -> None:
        super().__init__(message)
        self.cause = cause


class SandboxClosedError(SandboxError, RuntimeError):
    """An operation was attempted on a sandbox that has already been closed."""


class SandboxLostError(SandboxError, ConnectionError):
    """The sandbox died underneath us (container killed, process tree gone)."""


class ShellExitedError(SandboxLostError):
    """The persistent shell ended while running a command (`exit`, `exec`, `kill $$`). Raised by
    the shell, which cannot tell whether its sandbox went too: `ShellSandbox.run` asks the
    sandbox, and turns it into the command's result when the sandbox lives (the agent's doing,
    scored) or a plain `SandboxLostError` when it does not. `result`: the command's result as
    far as it got (what it printed, the shell's exit status), with `shell_exited` set."""

    def __init__(self, message: str, result: ShellResult) -> None:
        super().__init__(message)
        self.result = result


class CommandTimeoutError(SandboxError, TimeoutError):
    """A command did not finish within its timeout (its process tree was killed)."""


class SandboxPathError(SandboxError, ValueError):
    """A file path was refused: relative, escaping the sandbox, or through a symlink out."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """A file asked for by the file API does not exist inside the sandbox."""


class SnapshotUnsupportedError(SandboxError, NotImplementedError):
    """The backend cannot snapshot a sandbox (a group's members are then prepared one by one)."""


class ChangesUnsupportedError(SandboxError, NotImplementedError):
    """The backend cannot say which paths of a sandbox changed (no tamper report there)."""


class NetworkPolicyUnsupportedError(SandboxError, ValueError):
    """The backend cannot enforce the network policy asked for (or the switch between two);
    the task is refused rather than run with a more open network than it declares."""


class SandboxGroupUnsupportedError(SandboxError, ValueError):
    """The spec asks for services beside the sandbox (a multi-container group: a compose
    file's other services) and this backend cannot run them; the task is refused."""


class UserUnsupportedError(SandboxError, ValueError):
    """The backend cannot run commands as the user asked for (local: its user namespace maps
    root alone); the task is refused rather than run as root."""


class SandboxHealthcheckError(SandboxCreateError):
    """A healthcheck never passed (the sandbox's own, or a service's Docker health): the
    sandbox was not handed out. `output` holds the last attempt's output."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message, cause="healthcheck")
        self.output = output

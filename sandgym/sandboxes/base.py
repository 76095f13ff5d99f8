"""The sandbox protocol: `SandboxBackend.create(spec) -> Sandbox`, and what a `Sandbox` can do.

The protocol alone: the two classes, their abstract methods and the defaults every backend
shares (network and services checks, reaping through `reap_matching`). Label names live in
`sandgym.sandboxes.labels`, path helpers in `sandgym.sandboxes.paths`; pool policy, reaping loops and task logic
elsewhere. Every method is async and never blocks the event loop.

Example:
    >>> import asyncio
    >>> from sandboxes import get_backend, SandboxSpec
    >>> async def demo():
    ...     backend = get_backend("null")
    ...     sb = await backend.create(SandboxSpec())
    ...     try:
    ...         return (await sb.exec("echo hi")).stdout
    ...     finally:
    ...         await sb.close()
    >>> asyncio.run(demo())
    'hi\\n'
"""

from __future__ import annotations

import abc
import logging
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sandgym.sandboxes.errors import (
    ChangesUnsupportedError,
    NetworkPolicyUnsupportedError,
    SandboxClosedError,
    SandboxError,
    SandboxGroupUnsupportedError,
    SnapshotUnsupportedError,
)
from sandgym.sandboxes.labels import sandbox_labels
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.sandboxes.paths import new_sandbox_id
from sandgym.sandboxes.spec import ExecResult, FileChanges, PathChanges, SandboxSpec, ShellResult
from sandgym.sandboxes.usage import SandboxUsage

log = logging.getLogger(__name__)


class SandboxCapabilities(BaseModel):
    """What a sandbox can do: what the task layer asks of it (never its backend's name)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    builds_images: bool = Field(
        default=False,
        description="the backend builds the spec's Dockerfile into the sandbox's image itself "
        "(else the task layer applies what it can of it)",
    )
    runs_real_commands: bool = Field(
        default=True, description="`exec` runs real commands (mkdir, chmod, chown): no fake shell"
    )
    lists_changes: bool = Field(
        default=False,
        description="`changed_paths`, `path_fingerprints` and `read_links` work (tamper reports)",
    )
    private_exec: bool = Field(
        default=False, description="`exec_private` works (the verifier apart from the agent)"
    )
    other_users: bool = Field(
        default=True,
        description="commands may run as users other than root (`exec(user=...)`, a task's "
        "agent or verifier user)",
    )


class Sandbox(abc.ABC):
    """One isolated environment for one episode. Create via a backend; `close()` when done."""

    backend_name: str = "?"
    #: what sandboxes of this class can do; an instance may set its own once it knows (a local
    #: sandbox has private exec only when it runs under bwrap)
    capabilities: SandboxCapabilities = SandboxCapabilities()

    def __init__(self, spec: SandboxSpec, sandbox_id: str | None = None) -> None:
        self.spec = spec
        self.id = sandbox_id or new_sandbox_id()
        self.created_at = time.time()
        self.from_pool = False  # set by the pool when handed out ready (a hit)
        self._closed = False
        #: the network policy in force now (`set_network` switches it)
        self.network: NetworkPolicy = spec.network
        #: unix time after which the sandbox ends itself (`sandgym.sandboxes.lifetime`); None: never
        self.deadline: float | None = None
        #: unix time its episode's limits end (set by the server when it leases it), or None
        self.episode_end: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    async def set_deadline(self, deadline: float) -> None:
        """Move the time (unix seconds) after which this sandbox ends itself, without any
        server (`sandgym.sandboxes.lifetime`). Only a sandbox created with a deadline has one to move;
        backends without one keep the number only."""
        self._check_open()
        await self._write_deadline(deadline)
        self.deadline = deadline

    async def _write_deadline(self, deadline: float) -> None:
        return None

    async def usage(self) -> SandboxUsage:
        """What this sandbox consumed so far, from its own accounting (`sandgym.sandboxes.usage`);
        every figure None on a backend that cannot read it."""
        return SandboxUsage()

    @property
    def bridge_dir(self) -> Path | None:
        """The host directory that appears as `/run/sandgym` inside this sandbox, where the env
        server may put unix sockets (the gateway bridge); None when the backend has none."""
        return None

    # -- the capabilities under the names the task layer reads -------------------------------
    @property
    def builds_images(self) -> bool:
        """`capabilities.builds_images`."""
        return self.capabilities.builds_images

    @property
    def runs_real_commands(self) -> bool:
        """`capabilities.runs_real_commands`."""
        return self.capabilities.runs_real_commands

    @property
    def lists_changes(self) -> bool:
        """`capabilities.lists_changes`."""
        return self.capabilities.lists_changes

    @property
    def supports_private_exec(self) -> bool:
        """Whether `exec_private` works on this sandbox (`capabilities.private_exec`)."""
        return self.capabilities.private_exec

    async def exec_private(
        self,
        cmd: list[str],
        stdin: bytes,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        see_processes: bool = True,
    ) -> ExecResult:
        """Run `cmd` as root in a mount namespace of its own, allowed to mount (a tmpfs over a
        directory) where no process the agent started can join or reach it, with `stdin` as its
        input. What the verifier uses to keep tests and reward files away from anything the
        agent left running. `see_processes`: whether `cmd` may see the agent's processes (the
        tests of some tasks look for them) where the backend would otherwise hide them; pass
        False when `cmd` drops to a user without capabilities, whom an agent's process could
        become and then reach. Backends without it raise SandboxError."""
        raise SandboxError(f"the {self.backend_name} backend has no private exec")

    async def kill_agent_processes(self) -> None:
        """Kill whatever the agent left running (every process but the sandbox's own), before
        a verifier that must not run beside it. Backends without a safe way raise SandboxError."""
        raise SandboxError(f"the {self.backend_name} backend cannot kill the agent's processes")

    async def snapshot(self) -> str:
        """A snapshot of this sandbox's file system, labelled like it: a sandbox made from a
        spec naming it (`SandboxSpec.snapshot`) starts with a copy of these files (processes
        are not copied). Remove it with `SandboxBackend.remove_snapshot`; the reaper removes
        those of a dead owner. Backends without one raise SnapshotUnsupportedError."""
        raise SnapshotUnsupportedError(f"the {self.backend_name} backend cannot snapshot")

    async def changes(self) -> FileChanges:
        """The files changed since this sandbox was made, to `apply_changes` to a fresh one of
        the same spec: a group's fork without a snapshot (`SandboxBackend.forks_by_changes`).
        SnapshotUnsupportedError where the backend cannot, or the changes are too large."""
        raise SnapshotUnsupportedError(f"the {self.backend_name} backend cannot list changes")

    async def apply_changes(self, changes: FileChanges) -> None:
        """Make this fresh sandbox's files those of the one `changes` came from."""
        raise SnapshotUnsupportedError(f"the {self.backend_name} backend cannot apply changes")

    async def changed_paths(self) -> PathChanges:
        """The paths created, modified and deleted since this sandbox was made, as the backend
        itself sees them (the engine's diff, the host's view of the tree), never through a
        program inside the sandbox: what a tamper report is computed from. Backends without
        one raise ChangesUnsupportedError."""
        raise ChangesUnsupportedError(f"the {self.backend_name} backend cannot list changed paths")

    async def path_fingerprints(self, paths: list[str]) -> dict[str, str | None]:
        """path -> an opaque fingerprint of what is there now (content, mode, owner, link
        target; None when nothing is), read by the backend itself: a path that
        `changed_paths` lists both before and after was changed again when its fingerprint
        differs."""
        raise ChangesUnsupportedError(f"the {self.backend_name} backend cannot fingerprint paths")

    async def read_links(self, paths: list[str]) -> dict[str, str]:
        """path -> link target, for those of `paths` that are symbolic links (not followed),
        read by the backend itself; other paths are left out."""
        raise ChangesUnsupportedError(f"the {self.backend_name} backend cannot read links")

    async def warm_up(self) -> None:
        """Start what the first action would otherwise start (the persistent shell), so that a
        sandbox the pool hands out answers its first command in one round trip. The pool calls
        it as part of creating a sandbox; backends without a shell do nothing."""
        return None

    def shell_alive(self) -> bool | None:
        """Whether the persistent shell answers (None: not started, or none on this backend);
        part of the pool's health check of a ready sandbox."""
        return None

    async def set_network(self, policy: NetworkPolicy) -> None:
        """Switch to `policy` (a phase change: Harbor's agent or verifier network). Only the
        policies the spec named (`network`, `network_later`) can be switched to; the one in
        force is a no-op. Backends that cannot switch raise NetworkPolicyUnsupportedError."""
        if policy == self.network:
            return
        self._check_open()
        if policy not in self.spec.network_policies:
            raise NetworkPolicyUnsupportedError(
                f"sandbox {self.id} was not created for network {policy.describe()}: expected "
                f"one of {[p.describe() for p in self.spec.network_policies]}"
            )
        await self._apply_network(policy)
        self.network = policy

    async def _apply_network(self, policy: NetworkPolicy) -> None:
        raise NetworkPolicyUnsupportedError(
            f"the {self.backend_name} backend cannot switch a sandbox's network "
            f"(from {self.network.describe()} to {policy.describe()})"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one")

    async def close(self) -> None:
        """Destroy the sandbox and everything in it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._destroy()

    @abc.abstractmethod
    async def _destroy(self) -> None: ...

    @abc.abstractmethod
    async def is_alive(self) -> bool:
        """True while the sandbox can still run commands."""

    # -- commands ----------------------------------------------------------------------------
    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | list[str],
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run a command (a string goes through `bash -c`). On timeout the tree is killed."""

    # -- the persistent interactive shell ----------------------------------------------------
    @abc.abstractmethod
    async def run(self, command: str, timeout_s: float = 60.0) -> ShellResult:
        """Run `command` in this sandbox's persistent shell (state kept between calls)."""

    @abc.abstractmethod
    async def send_keys(self, keys: str) -> None:
        """Send raw keys (bytes of a terminal) to the shell's foreground program."""

    @abc.abstractmethod
    async def screen(self) -> str:
        """The rendered terminal screen (rows joined by newlines, trailing spaces stripped)."""

    # -- files -------------------------------------------------------------------------------
    @abc.abstractmethod
    async def write_file(self, path: str, content: bytes | str, mode: int = 0o644) -> None:
        """Write a file (parents created). Paths escaping the sandbox raise SandboxPathError."""

    @abc.abstractmethod
    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a file; SandboxFileNotFoundError when it does not exist."""

    @abc.abstractmethod
    async def upload(self, src: Path, dst: str) -> None:
        """Copy a host file or directory tree to `dst` inside the sandbox."""

    @abc.abstractmethod
    async def download(self, src: str, dst: Path) -> None:
        """Copy a sandbox file or directory tree to `dst` on the host."""


class SandboxBackend(abc.ABC):
    """Creates sandboxes of one kind and finds the ones a dead owner left behind."""

    name: str = "?"
    #: creations a pool runs at once on this backend unless told otherwise (the server's
    #: `pool_max_concurrent_creates`): a creation mostly waits (a process or container
    #: starting), so the rate is this over the creation's latency until the CPU or engine binds
    default_concurrent_creates: int = 4
    #: a group's members start as fresh sandboxes of the task's own spec, made while member 0
    #: prepares, and get its `Sandbox.changes` (else: sandboxes made from its snapshot, after)
    forks_by_changes: bool = False

    def __init__(self, owner_id: str | None = None, lease_s: float = 6 * 3600) -> None:
        self.owner_id = owner_id or ("srv-" + uuid.uuid4().hex[:10])
        self.lease_s = lease_s

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Create and start a sandbox matching `spec`; raise SandboxCreateError on failure."""

    async def remove_snapshot(self, snapshot: str) -> None:
        """Remove a snapshot `Sandbox.snapshot` made (one already gone is no error)."""
        return None

    async def prepare(self, spec: SandboxSpec) -> str:
        """Make what sandboxes of `spec` are created from (an image built from its build
        context), ahead of any episode: `built`, `reused` (already there) or `none` (this
        backend builds nothing). Raises SandboxCreateError when it cannot be made."""
        return "none"

    def check_network(self, spec: SandboxSpec) -> None:
        """Raise NetworkPolicyUnsupportedError unless this backend can enforce every network
        policy of `spec` and the switches between them. By default: public or no-network, one
        policy for the sandbox's whole life."""
        if spec.needs_proxy:
            raise NetworkPolicyUnsupportedError(
                f"the {self.name} backend cannot enforce an allowlist network "
                f"({[p.describe() for p in spec.network_policies]}); use docker or local"
            )
        if any(p != spec.network for p in spec.network_later):
            raise NetworkPolicyUnsupportedError(
                f"the {self.name} backend cannot switch a sandbox's network between phases "
                f"({[p.describe() for p in spec.network_policies]})"
            )

    def check_services(self, spec: SandboxSpec) -> None:
        """Raise SandboxGroupUnsupportedError when `spec` asks for services beside the sandbox
        (a multi-container group), or for container settings of compose's (tmpfs, dns,
        extra_hosts), and this backend cannot honour them: all but docker."""
        if spec.container_settings:
            raise SandboxGroupUnsupportedError(
                f"the {self.name} backend cannot honour the container settings "
                f"{spec.container_settings} a compose file gives the main service; use docker"
            )
        if spec.services:
            raise SandboxGroupUnsupportedError(
                f"the {self.name} backend cannot run a multi-container environment (services "
                f"{[s.name for s in spec.services]} beside the main one); use docker"
            )

    async def reap_matching(
        self, *, everything: bool = False, owner_id: str | None = None, images: bool = False
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Remove this backend's sandboxes (of any owner) that `labels.should_reap` selects,
        and with `images` the cached images no sandbox uses: (removed ids, [(id, error)]). The
        hook `sandgym reap` (`sandgym.sandboxes.reaper`) calls on every backend."""
        return [], []

    async def reap(self, only_expired: bool = True) -> list[str]:
        """Destroy sandboxes whose owner is gone or whose lease expired (and, unless
        `only_expired`, every one of this backend's owner); return their ids."""
        removed, errors = await self.reap_matching(owner_id=None if only_expired else self.owner_id)
        for name, err in errors:
            log.warning("%s reap: could not remove %s: %s", self.name, name, err)
        return removed

    async def owned_sandbox_ids(self) -> list[str] | None:
        """Ids of every sandbox on this backend labelled with this backend's owner id, in any
        state (running, stopped, half-made), including ones no `Sandbox` object stands for (a
        creation whose answer was lost). None when the backend cannot list them; the pool's
        sweep of untracked sandboxes then does nothing."""
        return None

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Remove the sandbox `sandbox_id`, one `owned_sandbox_ids` listed, without a `Sandbox`
        object for it (the pool's sweep of lost creations). One already gone is no error."""
        raise SandboxError(f"the {self.name} backend cannot remove a sandbox by id")

    async def aclose(self) -> None:
        """Release backend-wide resources (clients, threads)."""
        return None

    def labels_for(self, spec: SandboxSpec) -> dict[str, str]:
        """The labels every sandbox of this backend carries (`sandgym.sandboxes.labels`)."""
        return sandbox_labels(spec, backend=self.name, owner_id=self.owner_id, lease_s=self.lease_s)

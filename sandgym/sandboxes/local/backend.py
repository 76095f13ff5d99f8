"""`LocalBackend`: bubblewrap sandboxes under its root (`root.local_root()`), their owner's
listing and removal, snapshots, and reaping."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

from sandgym.sandboxes import cgroups
from sandgym.sandboxes.base import SandboxBackend
from sandgym.sandboxes.common.files import remove_tree
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES
from sandgym.sandboxes.common.users import is_root_user
from sandgym.sandboxes.errors import (
    BackendUnavailableError,
    NetworkPolicyUnsupportedError,
    SandboxError,
    UserUnsupportedError,
)
from sandgym.sandboxes.health import ensure_healthy
from sandgym.sandboxes.labels import LABEL_OWNER, should_reap
from sandgym.sandboxes.local.root import local_root, read_local_labels, snapshot_path
from sandgym.sandboxes.local.sandbox import LocalSandbox, local_user_refusal
from sandgym.sandboxes.local.tree import _rmtree
from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)


class LocalBackend(SandboxBackend):
    """bubblewrap sandboxes under `root` (default: `sandgym.sandboxes.local.root.local_root()`, in memory
    at /dev/shm/sandgym-local where possible)."""

    name = "local"
    #: a local creation waits about 0.25 s on bwrap and the sandbox's init, and costs about
    #: 10 ms of CPU (host_scale): 4 at once held the rate at a sixth of the CPU's bound
    default_concurrent_creates = 32

    def __init__(
        self,
        owner_id: str | None = None,
        lease_s: float = 6 * 3600,
        root: Path | str | None = None,
        require_isolation: bool = False,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        super().__init__(owner_id, lease_s)
        self.root = Path(root) if root else local_root()
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_output_bytes = max_output_bytes
        self.use_bwrap = shutil.which("bwrap") is not None and shutil.which("nsenter") is not None
        self.use_cgroups = os.geteuid() == 0 and cgroups.available()
        self.live: set[str] = set()
        if not self.use_bwrap:
            if require_isolation:
                raise BackendUnavailableError(
                    "local backend: bubblewrap (bwrap) and nsenter are required for isolation "
                    "but were not found; install the 'bubblewrap' package"
                )
            log.warning(
                "local backend: bwrap not found: sandboxes are plain directories with NO "
                "isolation (commands see the host filesystem and network). Install bubblewrap."
            )
        if not self.use_cgroups:
            log.warning(
                "local backend: cgroups are not writable here: falling back to rlimits; "
                "memory and process limits are weaker (no pids limit, no tree kill of daemons)"
            )

    def check_network(self, spec: SandboxSpec) -> None:
        """A sandbox shares the host's network (public) or has its own loopback-only namespace
        (no-network; allowlist through `sandgym.sandboxes.egress`), fixed when it starts: a public
        phase beside a restricted one cannot be enforced, nor an allowlist without bwrap."""
        modes = {p.mode for p in spec.network_policies}
        if "public" in modes and len(modes) > 1:
            raise NetworkPolicyUnsupportedError(
                "the local backend cannot switch a sandbox between the host's network and a "
                f"restricted one ({[p.describe() for p in spec.network_policies]}); use docker"
            )
        if "allowlist" in modes and not self.use_bwrap:
            raise NetworkPolicyUnsupportedError(
                "the local backend without bubblewrap cannot enforce an allowlist network "
                "(install the 'bubblewrap' package)"
            )

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        self.check_network(spec)
        self.check_services(spec)
        if not is_root_user(spec.user):
            raise UserUnsupportedError(local_user_refusal(spec.user))
        sb = LocalSandbox(
            spec,
            "sg-" + uuid.uuid4().hex[:12],
            root=self.root,
            labels=lambda: self.labels_for(spec),
            live=self.live,
            use_bwrap=self.use_bwrap,
            use_cgroups=self.use_cgroups,
            max_output_bytes=self.max_output_bytes,
        )
        self.live.add(sb.id)
        try:
            await sb._start()
        except BaseException:
            await asyncio.shield(sb.close())
            raise
        await ensure_healthy(sb)
        return sb

    async def owned_sandbox_ids(self) -> list[str]:
        """Names (= sandbox ids) of the trees under `root` whose labels.json names this
        backend's owner id (a tree without labels yet is being created: not listed)."""

        def scan() -> list[str]:
            found = []
            for d in self.root.glob("sg-*"):
                labels = read_local_labels(d)
                if labels is not None and labels.get(LABEL_OWNER) == self.owner_id:
                    found.append(d.name)
            return found

        return await asyncio.to_thread(scan)

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Kill what runs in the tree `sandbox_id` under `root`, drop its cgroups, remove it;
        only a tree labelled with this backend's owner id (SandboxError for any other)."""
        if not sandbox_id.startswith("sg-") or "/" in sandbox_id or "\0" in sandbox_id:
            raise SandboxError(f"expected a local sandbox id like sg-<hex>, got {sandbox_id!r}")
        d = self.root / sandbox_id
        try:
            labels = json.loads(await asyncio.to_thread((d / "labels.json").read_text))
        except FileNotFoundError:
            return  # gone already (or never labelled: then not known to be ours either)
        except (OSError, ValueError) as exc:
            raise SandboxError(
                f"local sandbox {sandbox_id}: unreadable labels.json: {exc}"
            ) from exc
        owner = labels.get(LABEL_OWNER) if isinstance(labels, dict) else None
        if owner != self.owner_id:
            raise SandboxError(
                f"expected local sandbox {sandbox_id} to be labelled {LABEL_OWNER}="
                f"{self.owner_id}, found {owner!r}: not removing it"
            )
        await asyncio.to_thread(cgroups.CgroupSet(sandbox_id).remove)
        await asyncio.to_thread(_rmtree, d)
        self.live.discard(sandbox_id)

    def snapshot_dir(self, snapshot: str) -> Path:
        return snapshot_path(self.root, snapshot)

    async def remove_snapshot(self, snapshot: str) -> None:
        await asyncio.to_thread(_rmtree, self.snapshot_dir(snapshot))

    async def reap_matching(
        self,
        *,
        everything: bool = False,
        owner_id: str | None = None,
        images: bool = False,
        now: float | None = None,
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Remove the sandbox trees and snapshots under `root` whose labels `labels.should_reap`
        selects (what runs in them is killed, their cgroups dropped), except this backend's own
        live sandboxes. A directory without a readable labels.json is left alone: a tree being
        created (labels come first), or not ours. No images here: `images` changes nothing."""

        def scan() -> tuple[list[str], list[tuple[str, str]]]:
            removed: list[str] = []
            errors: list[tuple[str, str]] = []
            if not self.root.is_dir():
                return removed, errors
            for d in sorted(self.root.iterdir()):
                if not d.is_dir() or d.is_symlink():
                    continue
                labels = read_local_labels(d)
                if labels is None:
                    # No labels (yet): a tree another server is creating right now. Treating
                    # it as an orphan (no lease = expired) deleted live sandboxes of others.
                    continue
                if d.name in self.live and labels.get(LABEL_OWNER) == self.owner_id:
                    continue
                if not should_reap(labels, owner_id=owner_id, everything=everything, now=now):
                    continue
                try:
                    cgroups.CgroupSet(d.name).remove()
                    remove_tree(d)
                except OSError as exc:
                    errors.append((d.name, str(exc)))
                else:
                    removed.append(d.name)
            return removed, errors

        return await asyncio.to_thread(scan)

"""Stale btrfs qgroups on the Docker engine's data root: find them and clear them.

On the btrfs engine that scripts/setup.sh makes (`SANDGYM_DOCKER_STORAGE=btrfs-quota`), dockerd
logs "Failed to delete btrfs qgroup N for ...: device or resource busy" for every layer it
removes (each container has two: its own and `-init`). Why: dockerd's btrfs driver destroys the
subvolume and, in the same call, the subvolume's qgroup `0/N`. Destroying a subvolume only
unlinks it; the kernel's cleaner thread drops its extents later, and until then the qgroup still
counts them, so the kernel refuses to delete it (EBUSY; kernels that have simple quotas refuse
to delete a qgroup with usage, in both quota modes). Not our storage-quota code (it only passes
`--storage-opt size`, which sets a limit on that same qgroup), no parent qgroup (dockerd makes
none), no rescan (simple quotas have none).

Does the qgroup then leak? On this machine's kernel (6.18) no: once the cleaner has dropped
the subvolume, the kernel deletes its qgroup itself. Measured on the CI engine: after ~10,800
subvolumes made and removed, `btrfs qgroup show` listed 114 qgroups for 113 subvolumes plus
the top level, and none `<stale>`; a removed container's two qgroups were `<stale>` right
after `docker rm` and gone after `btrfs subvolume sync`. Kernels that refuse the early delete
but do not yet delete after the drop leave every one `<stale>`, and a file system carried over
from such a kernel keeps them. A qgroup under simple quotas whose data another subvolume still
shares stays busy until that one goes (a "space holder"); it is kept, not an error.

`clear_stale(root)` waits for the subvolumes deleted so far to be dropped (`btrfs subvolume
sync`), then destroys every level-0 qgroup left without its subvolume. scripts/setup.sh runs it
after building the images and `sandgym reap` after reaping (`python -m sandgym.sandboxes.qgroups [ROOT]`
does it by hand). Needs root and btrfs-progs; the dockerd log line itself stays (it comes from
dockerd), and is harmless where nothing is left afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: how long `clear_stale` waits for the cleaner to drop the subvolumes deleted so far
SYNC_TIMEOUT_S = 300.0


class QgroupError(RuntimeError):
    """A btrfs command on the data root failed (not btrfs, no btrfs-progs, not root)."""


@dataclass
class ClearReport:
    """What one `clear_stale` did: qgroups destroyed, and those still busy (kept)."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _btrfs(*args: str, timeout_s: float = 60.0) -> str:
    if shutil.which("btrfs") is None:
        raise QgroupError("expected the `btrfs` command (apt-get install btrfs-progs); not found")
    r = subprocess.run(
        ["btrfs", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if r.returncode != 0:
        raise QgroupError(f"btrfs {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def qgroups(root: str | Path) -> dict[str, str]:
    """Every qgroup of the file system at `root`: `{"0/257": path}`, where path is the
    subvolume's path, or `<stale>` when its subvolume is gone (btrfs-progs' own marker;
    newer releases also say `<under deletion>` while the cleaner still drops it)."""
    out = _btrfs("qgroup", "show", "--raw", str(root))
    found: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and "/" in parts[0] and parts[0][0].isdigit():
            found[parts[0]] = parts[3].strip()
    return found


def stale_qgroups(root: str | Path) -> list[str]:
    """The level-0 qgroups at `root` whose subvolume no longer exists (or is being dropped)."""
    return [
        q
        for q, path in qgroups(root).items()
        if q.startswith("0/") and path in ("<stale>", "<under deletion>", "<squota space holder>")
    ]


def subvolume_qgroup(path: str | Path) -> str:
    """The level-0 qgroup of the subvolume at `path` (`0/<subvolume id>`)."""
    for line in _btrfs("subvolume", "show", str(path)).splitlines():
        key, _, value = line.strip().partition(":")
        if key.strip() == "Subvolume ID":
            return f"0/{value.strip()}"
    raise QgroupError(f"expected a 'Subvolume ID' in `btrfs subvolume show {path}`; none found")


def clear_stale(root: str | Path, *, sync_timeout_s: float = SYNC_TIMEOUT_S) -> ClearReport:
    """Wait for the subvolumes deleted so far at `root` to be dropped, then destroy every
    level-0 qgroup left without its subvolume. A qgroup still busy (its data is shared with a
    live subvolume under simple quotas) is kept and listed in `kept`."""
    try:
        _btrfs("subvolume", "sync", str(root), timeout_s=sync_timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("qgroups: subvolumes at %s not dropped after %.0f s", root, sync_timeout_s)
    report = ClearReport()
    for q in stale_qgroups(root):
        try:
            _btrfs("qgroup", "destroy", q, str(root))
        except QgroupError as exc:
            # gone meanwhile (the kernel deleted it after the drop), or busy: kept
            if q in qgroups(root):
                log.info("qgroups: %s kept (%s)", q, exc)
                report.kept.append(q)
            continue
        report.removed.append(q)
    return report


def docker_btrfs_root() -> Path | None:
    """The local Docker engine's data root when its storage driver is btrfs and the root is
    on this machine's file system; None otherwise (another driver, a remote engine)."""
    # lazy: the docker backend's package (29 modules, with pexpect and pyte) would load at every
    # `sandgym` command's start (reaper_cli imports this module): +0.05 s CPU, measured
    from sandgym.sandboxes.docker.engine_info import local_engine_info

    return local_engine_info().btrfs_root()


def clear_docker_stale() -> str:
    """`sandgym reap`'s step: clear stale qgroups on the local Docker engine's data root when
    it is on btrfs and we are root; returns one line saying what was done or why not."""
    try:
        root = docker_btrfs_root()
    except Exception as exc:  # no engine, no SDK: nothing of ours to clear
        return f"qgroups: not looked at ({exc})"
    if root is None:
        return "qgroups: the Docker engine is not on btrfs here; nothing to clear"
    if os.geteuid() != 0:
        return f"qgroups: not cleared at {root} (needs root)"
    try:
        report = clear_stale(root)
    except (QgroupError, OSError) as exc:
        return f"qgroups: {exc}"
    return f"qgroups: {root}: {len(report.removed)} stale removed, {len(report.kept)} busy kept"


def main(argv: list[str] | None = None) -> int:
    """`python -m sandgym.sandboxes.qgroups [ROOT]`: clear stale qgroups at ROOT (default: the local
    Docker engine's data root when it is on btrfs). Exit 1 when a btrfs command failed."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else docker_btrfs_root()
    if root is None:
        print("qgroups: the Docker engine is not on btrfs here; nothing to clear")
        return 0
    if os.geteuid() != 0:
        print(f"qgroups: clearing qgroups at {root} needs root", file=sys.stderr)
        return 1
    try:
        report = clear_stale(root)
    except QgroupError as exc:
        print(f"qgroups: {exc}", file=sys.stderr)
        return 1
    print(f"qgroups: {root}: {len(report.removed)} stale removed, {len(report.kept)} busy kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())

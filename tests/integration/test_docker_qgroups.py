"""A removed Docker sandbox leaves no btrfs qgroup behind (sandgym/sandboxes/qgroups.py).

Real engine: a container with a storage quota (`--storage-opt size`, a limit on its layer's
qgroup) is made and removed; dockerd's own attempt to delete the layer's qgroups fails
("busy", the subvolume is not dropped yet), and `clear_stale` (what setup and `sandgym reap`
run) must leave neither of its two qgroups (the layer and its `-init` layer). Needs the btrfs
engine that `SANDGYM_DOCKER_STORAGE=btrfs-quota scripts/setup.sh --docker` makes, root and
btrfs-progs; elsewhere it skips, saying so (and fails in CI, which has that engine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandgym.sandboxes import qgroups
from tests.docker_engine import bootstrap_terminal_image, engine_answers

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
IMAGE = "sandgym/terminal:latest"


if not engine_answers():
    pytest.skip("no Docker engine answers", allow_module_level=True)


@pytest.fixture(scope="module")
def btrfs_root() -> Path:
    bootstrap_terminal_image()
    root = qgroups.docker_btrfs_root()
    if root is None or os.geteuid() != 0 or shutil.which("btrfs") is None:
        pytest.skip(
            "needs a local Docker engine on the btrfs storage driver, root and btrfs-progs "
            "(SANDGYM_DOCKER_STORAGE=btrfs-quota scripts/setup.sh --docker makes one)"
        )
    return root


def test_a_removed_container_with_a_quota_leaves_no_qgroup(btrfs_root: Path) -> None:
    import docker

    client = docker.from_env(timeout=120)
    container = client.containers.create(
        IMAGE,
        ["sleep", "60"],
        name="sandgym-test-qgroup-" + os.urandom(4).hex(),
        storage_opt={"size": "64M"},
    )
    try:
        container.start()
        mount_id = (
            btrfs_root / "image" / "btrfs" / "layerdb" / "mounts" / container.id / "mount-id"
        ).read_text()
        layers = btrfs_root / "btrfs" / "subvolumes"
        mine = [
            qgroups.subvolume_qgroup(layers / mount_id),
            qgroups.subvolume_qgroup(layers / f"{mount_id}-init"),
        ]
        # the quota is a limit on the layer's own qgroup: it exists while the container does
        present = qgroups.qgroups(btrfs_root)
        assert all(q in present for q in mine), (mine, present.get(mine[0]))
        subprocess.run(
            ["docker", "exec", container.id, "sh", "-c", "head -c 4194304 /dev/zero > /w"],
            check=True,
            timeout=120,
        )
    finally:
        container.remove(force=True)
        client.close()

    report = qgroups.clear_stale(btrfs_root)

    left = {q: p for q, p in qgroups.qgroups(btrfs_root).items() if q in mine}
    assert left == {}, (left, report)

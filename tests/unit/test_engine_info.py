"""`EngineInfo` (sandgym/sandboxes/docker/engine_info.py): the one reading of `docker info` that the
docker backend's storage quota, `sandgym reap`'s qgroup clearing and the benchmarks share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandgym.sandboxes.docker.engine_info import EngineInfo
from sandgym.sandboxes.docker.quota import StorageQuota

INFO = {
    "DockerRootDir": "/var/lib/sandgym-docker",
    "Driver": "btrfs",
    "ServerVersion": "28.2.2",
    "Labels": ["sandgym.storage-quota=simple", "other=x=y"],
}


def test_from_info_reads_the_fields_sandgym_uses() -> None:
    info = EngineInfo.from_info(INFO)
    assert info.root == Path("/var/lib/sandgym-docker")
    assert (info.driver, info.server_version) == ("btrfs", "28.2.2")
    assert info.quota_mode == "simple"
    assert info.label("other") == "x=y"  # only the first `=` splits
    assert info.label("absent") is None
    bare = EngineInfo.from_info({"DockerRootDir": "relative/dir", "Labels": None})
    assert (bare.root, bare.driver, bare.quota_mode, bare.labels) == (None, "", "", ())


def test_btrfs_root_needs_the_driver_and_the_subvolumes_here(tmp_path: Path) -> None:
    on_btrfs = {**INFO, "DockerRootDir": str(tmp_path)}
    assert EngineInfo.from_info(on_btrfs).btrfs_root() is None  # no btrfs/subvolumes here
    (tmp_path / "btrfs" / "subvolumes").mkdir(parents=True)
    assert EngineInfo.from_info(on_btrfs).btrfs_root() == tmp_path
    assert EngineInfo.from_info({**on_btrfs, "Driver": "overlay2"}).btrfs_root() is None


class _Api:
    def __init__(self, info: dict[str, Any]) -> None:
        self._info = info

    def info(self) -> dict[str, Any]:
        return self._info


class _Engine:
    def __init__(self, info: dict[str, Any]) -> None:
        self.api = _Api(info)


def test_the_storage_quota_reads_driver_and_label_through_it() -> None:
    simple = StorageQuota(_Engine(INFO))  # type: ignore[arg-type]
    assert simple.driver() == "btrfs" and not simple.counts_image()
    full = StorageQuota(_Engine({**INFO, "Labels": ["sandgym.storage-quota=full"]}))  # type: ignore[arg-type]
    assert full.driver() == "btrfs" and full.counts_image()
    overlay = StorageQuota(_Engine({**INFO, "Driver": "overlay2"}))  # type: ignore[arg-type]
    assert overlay.driver() == "overlay2" and not overlay.counts_image()

"""`EngineInfo`: what a Docker engine says of itself in `docker info` (its data root, storage
driver, version and labels), read in one place for the backend's quota, `sandgym reap`'s
qgroup clearing and the benchmarks' records of the engine they ran on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the engine label scripts/setup.sh sets on the btrfs engine it starts: `simple` or `full`
QUOTA_LABEL = "sandgym.storage-quota"


@dataclass(frozen=True)
class EngineInfo:
    """The fields of `docker info` (the engine API's /info) that sandgym reads."""

    root: Path | None  # DockerRootDir; None where the engine names no absolute path
    driver: str  # the storage driver (Driver), "" when not said
    server_version: str  # ServerVersion, "" when not said
    labels: tuple[str, ...]  # the engine's labels, `key=value` each

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> EngineInfo:
        """From the engine API's /info document (the SDK's `info()`, or `docker info --format
        '{{json .}}'`, which has the same keys)."""
        root = str(info.get("DockerRootDir") or "")
        return cls(
            root=Path(root) if root.startswith("/") else None,
            driver=str(info.get("Driver") or ""),
            server_version=str(info.get("ServerVersion") or ""),
            labels=tuple(str(x) for x in info.get("Labels") or []),
        )

    def label(self, key: str) -> str | None:
        """The value of the engine label `key`, or None when the engine has no such label."""
        for label in self.labels:
            k, _, value = label.partition("=")
            if k == key:
                return value
        return None

    @property
    def quota_mode(self) -> str:
        """The engine's `sandgym.storage-quota` label (`simple`/`full`), "" when unset."""
        return self.label(QUOTA_LABEL) or ""

    def btrfs_root(self) -> Path | None:
        """The data root when the driver is btrfs and the root is on this machine's file system
        (its `btrfs/subvolumes` folder is here); None otherwise (another driver, a remote
        engine)."""
        if self.driver != "btrfs" or self.root is None:
            return None
        return self.root if (self.root / "btrfs" / "subvolumes").is_dir() else None


def local_engine_info(timeout_s: int = 30) -> EngineInfo:
    """(Blocking) the local engine's `docker info`, through the Docker SDK (the docker extra).
    Raises what the SDK raises where no engine answers or the SDK is not installed."""
    import docker  # the docker extra; only asked for here

    client = docker.from_env(timeout=timeout_s)
    try:
        return EngineInfo.from_info(client.info())
    finally:
        client.close()

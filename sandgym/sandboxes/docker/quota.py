"""`StorageQuota`: whether the engine enforces a total storage quota per container
(`--storage-opt size`), decided by the first create that asks for one, and what that quota must
also hold for the image's own files, which depends on the engine's storage driver."""

from __future__ import annotations

import logging

from sandgym.sandboxes.common.tolerated import tolerate
from sandgym.sandboxes.docker.client import DockerEngine
from sandgym.sandboxes.docker.engine_info import EngineInfo

log = logging.getLogger(__name__)


class StorageQuota:
    """The engine's storage quota, as the docker backend's creates find it."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine
        #: whether the engine accepts `--storage-opt size`: None until a create has asked
        self.supported: bool | None = None
        self._driver: str | None = None  # `docker info` Driver, asked once
        self._label = ""  # the engine's sandgym.storage-quota label (setup.sh)

    @property
    def known_driver(self) -> str | None:
        """The storage driver if `driver()` has asked already (no engine call), else None."""
        return self._driver

    def driver(self) -> str:
        """(Thread) the engine's storage driver (`docker info` Driver), asked once, with the
        engine label `sandgym.storage-quota` (`simple`/`full`) that scripts/setup.sh sets on
        the btrfs engine it makes."""
        if self._driver is None:
            try:
                info = EngineInfo.from_info(self.engine.api.info())
            except Exception as exc:  # the create that follows reports an engine that is gone
                tolerate("docker.storage_driver", exc, log)
                return ""
            self._label = info.quota_mode
            self._driver = info.driver
        return self._driver

    def counts_image(self) -> bool:
        """Whether the engine's storage quota also counts the image's own files: the btrfs
        driver under full qgroups (a snapshot references its image's data), not under simple
        quotas (kernel >= 6.7; usage counts only what the container writes)."""
        return self.driver() == "btrfs" and self._label != "simple"

    def image_mb(self, image: str) -> int:
        """(Thread) MiB the storage quota leaves for the image's own files.

        overlay2 (over xfs with pquota) limits only the container's upper dir, and the btrfs
        driver under simple quotas counts only what the container writes: 0. Under full
        qgroups the btrfs driver limits the container's whole subvolume (a qgroup's
        referenced bytes), which starts out holding the image: its size is added, by 8 % more
        than `docker image inspect` says, since the subvolume counts whole blocks (measured:
        1.07x the inspected size for the bookworm base image, 1.05x for sandgym/terminal,
        0.95x for sandgym/desktop, whose layers overwrite files). So a sandbox gets at least
        about `storage_mb` of room for new data, at most `storage_mb` plus ~13 % of its image;
        deleting the image's files frees room for more."""
        if not self.counts_image():
            return 0
        size = int(self.engine.api.inspect_image(image).get("Size") or 0)
        return -(-size * 108 // (100 * 2**20))

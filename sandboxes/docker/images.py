"""The docker backend's images and storage quota: images come by name (default
`sandgym/terminal:latest`) or are built from `spec.build_context` once per content hash
(`sandgym/ctx:<hash16>`, reused while it exists; concurrent creates of one context share one
build); the engine's storage driver decides what a sandbox's storage quota must also hold."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sandboxes.common.tolerated import tolerate
from sandboxes.docker.client import DockerBackendBase
from sandboxes.docker.names import CTX_REPO, GROUP_SNAPSHOT_REPO
from sandboxes.errors import (
    SandboxCreateError,
    SandboxError,
)
from sandboxes.labels import LABEL_MANAGED
from sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)


class DockerImages(DockerBackendBase):
    """Images by name or built once per content hash, and what the storage quota must hold."""

    async def _image_exists(self, ref: str) -> bool:
        import docker.errors

        try:
            await asyncio.to_thread(self.engine.api.inspect_image, ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    async def remove_snapshot(self, snapshot: str) -> None:
        import docker.errors

        if not snapshot.startswith(GROUP_SNAPSHOT_REPO + ":"):
            raise SandboxError(f"expected a {GROUP_SNAPSHOT_REPO}:* snapshot, got {snapshot!r}")
        # Not forced: a forced removal of an image a container still uses only untags it, and
        # the untagged image then stays for good. In use, this raises; the caller retries.
        try:
            await asyncio.to_thread(self.engine.api.remove_image, snapshot)
        except docker.errors.ImageNotFound:
            pass

    async def prepare(self, spec: SandboxSpec) -> str:
        """Build (once per content hash) the images a sandbox of `spec` and its services run;
        `built` when any was built now, else `reused`."""
        before = self.builds
        await self.image_for(spec)
        for svc in spec.services:
            probe = SandboxSpec(
                image=svc.image or None, build_context=svc.build_context, dockerfile=svc.dockerfile
            )
            try:
                await self.image_for(probe)
            except SandboxCreateError as exc:
                raise SandboxCreateError(f"service {svc.name!r}: {exc}", exc.cause) from exc
        return "built" if self.builds > before else "reused"

    async def image_for(self, spec: SandboxSpec) -> str:
        """The image a sandbox of `spec` runs: by name, or built (once per content hash)."""
        if spec.build_context is None:
            image = spec.image or self.default_image
            if not await self._image_exists(image):
                raise SandboxCreateError(
                    f"image {image!r} is not present in the local Docker engine and no registry "
                    "is used; build it (images/bootstrap-base.sh makes sandgym/terminal:latest)"
                )
            return image
        ctx = Path(spec.build_context)
        if not (ctx / spec.dockerfile).is_file():
            raise SandboxCreateError(
                f"expected a {spec.dockerfile} in build context {ctx}, found none"
            )
        digest = await asyncio.to_thread(spec.context_hash)
        assert digest is not None
        tag = f"{CTX_REPO}:{digest[:16]}"
        lock = self._build_locks.setdefault(digest, asyncio.Lock())
        async with lock:
            if await self._image_exists(tag):
                return tag
            await asyncio.to_thread(self._build, ctx, spec.dockerfile, tag)
            self.builds += 1
        return tag

    def _build(self, ctx: Path, dockerfile: str, tag: str) -> None:
        """(Thread) docker build; the build log's tail goes into the error on failure."""
        api = self.engine.api
        tail: list[str] = []
        error: str | None = None
        for item in api.build(
            path=str(ctx),
            dockerfile=dockerfile,
            tag=tag,
            rm=True,
            forcerm=True,
            decode=True,
            labels={LABEL_MANAGED: "1", "sandgym.context": tag},
        ):
            if "stream" in item:
                tail = (tail + [item["stream"]])[-30:]
            if "error" in item:
                error = item["error"]
        if error is not None:
            log_tail = "".join(tail).strip()
            raise SandboxCreateError(
                f"building {ctx}/{dockerfile} failed: {error.strip()}\n--- build log tail ---\n{log_tail}",
                cause="build",
            )

    def _driver(self) -> str:
        """(Thread) the engine's storage driver (`docker info` Driver), asked once, with the
        engine label `sandgym.storage-quota` (`simple`/`full`) that scripts/setup.sh sets on
        the btrfs engine it makes."""
        if self._storage_driver is None:
            try:
                info = self.engine.api.info()
            except Exception as exc:  # the create that follows reports an engine that is gone
                tolerate("docker.storage_driver", exc, log)
                return ""
            for label in info.get("Labels") or []:
                key, _, value = str(label).partition("=")
                if key == "sandgym.storage-quota":
                    self._storage_quota_label = value
            self._storage_driver = str(info.get("Driver") or "")
        return self._storage_driver

    def _quota_counts_image(self) -> bool:
        """Whether the engine's storage quota also counts the image's own files: the btrfs
        driver under full qgroups (a snapshot references its image's data), not under simple
        quotas (kernel >= 6.7; usage counts only what the container writes)."""
        return self._driver() == "btrfs" and self._storage_quota_label != "simple"

    def _quota_image_mb(self, image: str) -> int:
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
        if not self._quota_counts_image():
            return 0
        size = int(self.engine.api.inspect_image(image).get("Size") or 0)
        return -(-size * 108 // (100 * 2**20))

"""`ImageStore`: the docker backend's images. They come by name (default
`sandgym/terminal:latest`) or are built from `spec.build_context` once per content hash
(`sandgym/ctx:<hash16>`, reused while it exists; concurrent creates of one context share one
build); group snapshots are removed here too.

A failed build leaves nothing behind: the engine's legacy builder commits each step as an image,
and when a later step fails, the last committed one stays as an untagged image (gigabytes, for a
step that installed torch) that no prune of tagged images reaches. The store removes it, with
the step images only it used, once no other build of the store is running (a running build may
have just taken it as its cache). A build counts as running until its thread ends, even when the
create that waited for it gave up (a timeout cancels the wait, not the engine's build)."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import threading
from pathlib import Path
from typing import Any

from sandgym.sandboxes.docker.client import DockerEngine
from sandgym.sandboxes.docker.names import CTX_REPO, GROUP_SNAPSHOT_REPO
from sandgym.sandboxes.errors import SandboxCreateError, SandboxError
from sandgym.sandboxes.labels import LABEL_MANAGED
from sandgym.sandboxes.spec import SandboxSpec

log = logging.getLogger(__name__)

#: the legacy builder's line for a step's committed (or cached) image: ` ---> 0123456789ab`
_STEP_IMAGE_RE = re.compile(r"^ ---> ([0-9a-f]{12,64})\s*$", re.MULTILINE)


class ImageStore:
    """Images by name or built once per content hash, on one engine."""

    def __init__(self, engine: DockerEngine, default_image: str) -> None:
        self.engine = engine
        self.default_image = default_image
        self.builds = 0  # how many images this store built (the rest were cache hits)
        self._build_locks: dict[str, asyncio.Lock] = {}
        # builds of this store whose threads are running now, and the step images failed builds
        # left, to remove when none runs; both guarded by `_running` (worker threads only)
        self._running = threading.Condition()
        self._building = 0
        self._failed_leftovers: list[str] = []
        # the latest image ids removed so (newest last; bounded, for a server that runs for weeks)
        self.leftovers_removed: collections.deque[str] = collections.deque(maxlen=64)

    async def exists(self, ref: str) -> bool:
        import docker.errors

        try:
            await asyncio.to_thread(self.engine.api.inspect_image, ref)
            return True
        except docker.errors.ImageNotFound:
            return False

    def config(self, ref: str) -> dict[str, Any]:
        """The image's Config (`docker image inspect`: Env, WorkingDir, User, Entrypoint,
        Cmd); blocking, call it from a thread. Raises SandboxCreateError when it is missing."""
        import docker.errors

        try:
            return dict(self.engine.api.inspect_image(ref).get("Config") or {})
        except docker.errors.ImageNotFound as exc:
            raise SandboxCreateError(f"docker: image {ref!r} not found: {exc}") from exc

    async def remove_snapshot(self, snapshot: str) -> None:
        """Remove a group snapshot (`sandgym/group-snapshot:*`); one in use raises (the caller
        retries), one already gone is no error."""
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
        """The image a sandbox of `spec` runs: by name, or built (once per content hash and
        Dockerfile name: `SandboxSpec.build_key`)."""
        if spec.build_context is None:
            image = spec.image or self.default_image
            if not await self.exists(image):
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
        digest = await asyncio.to_thread(spec.build_key)
        assert digest is not None
        tag = f"{CTX_REPO}:{digest[:16]}"
        lock = self._build_locks.setdefault(digest, asyncio.Lock())
        async with lock:
            if await self.exists(tag):
                return tag
            await asyncio.to_thread(self._build_counted, ctx, spec.dockerfile, tag)
            self.builds += 1
        return tag

    def wait_idle(self, timeout_s: float) -> bool:
        """(Thread) Wait until no build of this store runs (builds whose waits were cancelled
        included) and what failed builds left is removed; False if `timeout_s` passed first."""
        with self._running:
            return self._running.wait_for(lambda: self._building == 0, timeout_s)

    def _build_counted(self, ctx: Path, dockerfile: str, tag: str) -> None:
        """(Thread) `_build`, counted as running for as long as this thread builds. The last
        build to end removes what failed builds left, holding the count, so no build starts
        from a step image while it goes."""
        with self._running:
            self._building += 1
        try:
            self._build(ctx, dockerfile, tag)
        finally:
            with self._running:
                self._building -= 1
                if self._building == 0:
                    leftovers, self._failed_leftovers = self._failed_leftovers, []
                    if leftovers:
                        self._remove_leftovers(leftovers)
                    self._running.notify_all()

    def _build(self, ctx: Path, dockerfile: str, tag: str) -> None:
        """(Thread) docker build; the build log's tail goes into the error on failure."""
        api = self.engine.api
        tail: list[str] = []
        error: str | None = None
        step_image: str | None = None
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
                step_image = ([step_image] + _STEP_IMAGE_RE.findall(item["stream"]))[-1]
            if "error" in item:
                error = item["error"]
        if error is not None:
            if step_image is not None:
                with self._running:
                    self._failed_leftovers.append(step_image)
            log_tail = "".join(tail).strip()
            raise SandboxCreateError(
                f"building {ctx}/{dockerfile} failed: {error.strip()}\n--- build log tail ---\n{log_tail}",
                cause="build",
            )

    def _remove_leftovers(self, image_ids: list[str]) -> None:
        """(Thread) Remove the last step image each failed build left, and its untagged parents
        nothing else uses (the engine's own pruning). A named image (the `FROM` base of a build
        that failed at its first step) is skipped; one a container or another image builds on
        (a cached step of a tagged image) is kept because the engine refuses, as expected."""
        import docker.errors

        api = self.engine.api
        for image_id in image_ids:
            try:
                info = api.inspect_image(image_id)
                if info.get("RepoTags") or info.get("RepoDigests"):
                    continue
                api.remove_image(info["Id"], noprune=False)
                self.leftovers_removed.append(info["Id"])
            except docker.errors.ImageNotFound:
                pass
            except docker.errors.APIError as exc:  # in use, or has child images: kept
                log.debug("failed build's step image %s kept: %s", image_id, exc)

    async def prune_context_images(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Remove the `sandgym/ctx:*` images (built from task build contexts) that no
        container uses, running or stopped. They are rebuilt on the next episode that needs
        them. Returns (removed tags, [(tag, error)])."""
        await self.engine.ensure_available()

        def go() -> tuple[list[str], list[tuple[str, str]]]:
            api = self.engine.api
            in_use = {c.get("ImageID") for c in api.containers(all=True)}
            removed: list[str] = []
            errors: list[tuple[str, str]] = []
            for img in api.images(name=CTX_REPO):
                if img["Id"] in in_use:
                    continue
                for tag in img.get("RepoTags") or []:
                    if not tag.startswith(CTX_REPO + ":"):
                        continue
                    try:
                        api.remove_image(tag, noprune=False)
                    except Exception as exc:
                        errors.append((tag, str(exc)))
                    else:
                        removed.append(tag)
            return removed, errors

        return await asyncio.to_thread(go)

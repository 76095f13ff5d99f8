"""`DockerReaper`: reaping on the docker backend. `reap(only_expired=True)` removes containers
of any owner whose lease expired or whose owning process on this host is dead;
`reap(only_expired=False)` also every container this backend's owner created. A group's network and services, bridge
directories and verifier/group snapshot images go by the same labels (`labels.should_reap`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from sandgym.sandboxes.docker.bridge import _remove_bridge_dir, _sweep_bridge_root
from sandgym.sandboxes.docker.client import DockerEngine
from sandgym.sandboxes.docker.group import (
    LABEL_GROUP_OF,
    owned_group_ids,
    reap_group_networks,
    remove_group,
)
from sandgym.sandboxes.docker.images import ImageStore
from sandgym.sandboxes.docker.names import LABEL_BRIDGE_DIR, LABEL_SNAPSHOT_OF, LABEL_VERIFIER_OF
from sandgym.sandboxes.errors import SandboxError
from sandgym.sandboxes.labels import LABEL_MANAGED, LABEL_OWNER, should_reap

log = logging.getLogger(__name__)


class DockerReaper:
    """Listing, removing and reaping the containers (and snapshots) of sandgym's labels, for
    one owner id, on one engine."""

    def __init__(
        self, engine: DockerEngine, owner_id: str, bridge_root: Path, images: ImageStore
    ) -> None:
        self.engine = engine
        self.owner_id = owner_id
        self.bridge_root = bridge_root
        self.images = images

    async def managed_containers(self) -> list[dict[str, Any]]:
        """Every container (running or not) carrying `sandgym.managed=1`."""
        api = (await asyncio.to_thread(self.engine.client)).api
        found: list[dict[str, Any]] = await asyncio.to_thread(
            api.containers, all=True, filters={"label": f"{LABEL_MANAGED}=1"}
        )
        return found

    async def owned_sandbox_ids(self) -> list[str]:
        """Names (= sandbox ids) of every container, in any state, labelled with this backend's
        owner id: one filtered list call."""
        api = (await asyncio.to_thread(self.engine.client)).api
        found: list[dict[str, Any]] = await asyncio.to_thread(
            api.containers,
            all=True,
            filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_OWNER}={self.owner_id}"]},
        )
        ids = [
            # a service container stands for its group's sandbox (docker.group)
            (c.get("Labels") or {}).get(LABEL_GROUP_OF)
            or (c.get("Names") or [c["Id"]])[0].lstrip("/")
            for c in found
            if LABEL_VERIFIER_OF not in (c.get("Labels") or {})  # a verify's, removed by it
        ]
        owner = [f"{LABEL_MANAGED}=1", f"{LABEL_OWNER}={self.owner_id}"]
        ids += await asyncio.to_thread(owned_group_ids, api, owner)
        return list(dict.fromkeys(i for i in ids if i))

    async def remove_sandbox(self, sandbox_id: str) -> None:
        """Remove container `sandbox_id` and its bridge directory; only a container labelled
        with this backend's owner id (SandboxError for any other), none when it is gone."""
        import docker.errors

        api = (await asyncio.to_thread(self.engine.client)).api
        owner = {LABEL_MANAGED: "1", LABEL_OWNER: self.owner_id}
        try:
            info = await asyncio.to_thread(api.inspect_container, sandbox_id)
        except docker.errors.NotFound:
            await asyncio.to_thread(remove_group, api, sandbox_id, owner)  # a group's rest
            return
        labels = (info.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_MANAGED) != "1" or labels.get(LABEL_OWNER) != self.owner_id:
            raise SandboxError(
                f"expected container {sandbox_id!r} to be labelled {LABEL_OWNER}={self.owner_id}"
                f", found {LABEL_OWNER}={labels.get(LABEL_OWNER)!r}: not removing it"
            )
        await self.engine.remove_container(info["Id"])
        await asyncio.to_thread(remove_group, api, sandbox_id, owner)
        bridge = labels.get(LABEL_BRIDGE_DIR)
        if bridge and Path(bridge).name == sandbox_id:  # only ever a directory named for it
            await asyncio.to_thread(_remove_bridge_dir, Path(bridge))

    async def reap_matching(
        self, *, everything: bool = False, owner_id: str | None = None, images: bool = False
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """Remove the managed containers `labels.should_reap` selects (with their groups,
        bridge directories and snapshots); with `images`, then the task-context images
        (`sandgym/ctx:*`) no container uses.

        Returns (removed names, [(name, error)]).
        """
        removed: list[str] = []
        errors: list[tuple[str, str]] = []
        containers = await self.managed_containers()
        for c in containers:
            labels = c.get("Labels") or {}
            name = (c.get("Names") or [c["Id"]])[0].lstrip("/")
            if not should_reap(labels, owner_id=owner_id, everything=everything):
                continue
            try:
                await self.engine.remove_container(c["Id"])
            except Exception as exc:
                errors.append((name, str(exc)))
            else:
                removed.append(name)
                bridge = labels.get(LABEL_BRIDGE_DIR)
                if bridge and Path(bridge).name == name:  # only ever a directory named for it
                    await asyncio.to_thread(_remove_bridge_dir, Path(bridge))
        await asyncio.to_thread(
            reap_group_networks,
            self.engine.api,
            lambda labels: should_reap(labels, owner_id=owner_id, everything=everything),
            removed,
            errors,
        )
        live = {(c.get("Names") or [c["Id"]])[0].lstrip("/") for c in containers} - set(removed)
        await asyncio.to_thread(_sweep_bridge_root, self.bridge_root, live)
        await self._reap_snapshots(removed, errors, owner_id=owner_id, everything=everything)
        if images:
            tags, img_errors = await self.images.prune_context_images()
            removed += tags
            errors += img_errors
        return removed, errors

    async def _reap_snapshots(
        self,
        removed: list[str],
        errors: list[tuple[str, str]],
        *,
        everything: bool,
        owner_id: str | None,
    ) -> None:
        """Remove the verifier snapshot images (`DockerSandbox.exec_private`) that
        `labels.should_reap` selects by their labels (those of the sandbox they were taken
        of): what a server that died mid-verify left. Their containers went first."""
        api = self.engine.api
        images = await asyncio.to_thread(api.images, filters={"label": LABEL_VERIFIER_OF})
        images += await asyncio.to_thread(api.images, filters={"label": LABEL_SNAPSHOT_OF})
        for img in images:
            labels = img.get("Labels") or {}
            if not should_reap(labels, owner_id=owner_id, everything=everything):
                continue
            tags = [t for t in img.get("RepoTags") or [] if t != "<none>:<none>"]
            for tag in tags or [img["Id"]]:  # an untagged one by its id
                try:
                    await asyncio.to_thread(api.remove_image, tag)
                except Exception as exc:
                    errors.append((tag, str(exc)))
                else:
                    removed.append(tag)

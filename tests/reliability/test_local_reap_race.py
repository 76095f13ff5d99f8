"""Regression: a server starting up (reap at startup) must not delete the local sandboxes
another live server is creating or running.

Found by `bench reliability`: neighbour sessions on the local backend failed while other
servers started on the machine. `LocalBackend.reap` took a sandbox directory without a
`labels.json` for an orphan (no lease = expired), and `_make_tree` wrote the labels last, so a
tree being created was fair game for every other server's startup reap.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from sandgym.sandboxes.labels import LABEL_LEASE_EXPIRY, LABEL_MANAGED, LABEL_OWNER, LABEL_OWNER_PID
from sandgym.sandboxes.local import LocalBackend
from sandgym.sandboxes.spec import SandboxSpec
from tests.reliability.conftest import needs_local


async def test_startup_reap_spares_unlabelled_and_live_trees(tmp_path: Path) -> None:
    creating = tmp_path / "sg-creating00"
    (creating / "fs").mkdir(parents=True)  # labels not written (yet)
    dead = tmp_path / "sg-deadowner0"
    dead.mkdir()
    (dead / "labels.json").write_text(
        json.dumps({LABEL_MANAGED: "1", LABEL_OWNER: "gone", LABEL_LEASE_EXPIRY: "1"})
    )
    live = tmp_path / "sg-liveowner0"
    live.mkdir()
    (live / "labels.json").write_text(
        json.dumps(
            {
                LABEL_MANAGED: "1",
                LABEL_OWNER: "other-server",
                LABEL_OWNER_PID: str(os.getpid()),
                LABEL_LEASE_EXPIRY: str(int(time.time() + 3600)),
            }
        )
    )
    removed = await LocalBackend(root=tmp_path).reap(only_expired=True)
    assert removed == ["sg-deadowner0"]
    assert creating.is_dir() and live.is_dir() and not dead.exists()


@needs_local
async def test_labels_exist_before_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every moment a local sandbox directory exists, its labels do (the reaper's contract)."""
    backend = LocalBackend(root=tmp_path)
    seen: list[bool] = []
    real_mkdir = Path.mkdir

    def spy(self: Path, *a: object, **kw: object) -> None:
        if self.parent.name.startswith("sg-") and self.name == "fs":
            seen.append((self.parent / "labels.json").is_file())
        real_mkdir(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", spy)
    sb = await backend.create(SandboxSpec(memory_mb=128))
    monkeypatch.undo()
    try:
        assert seen == [True]
    finally:
        await sb.close()
        await backend.aclose()

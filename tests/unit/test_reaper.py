"""Unit tests of the reaper's decision logic and of local-tree reaping (no Docker needed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandgym.sandboxes.labels import (
    LABEL_LEASE_EXPIRY,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
    should_reap,
)
from sandgym.sandboxes.local import local_root
from sandgym.sandboxes.reaper import reap
from sandgym.sandboxes.reaper_cli import add_arguments
from sandgym.sandboxes.reaper_cli import run as cli_run

NOW = 1_800_000_000.0


def dead_pid() -> int:
    """A pid that certainly belonged to a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def labels(
    *,
    managed: bool = True,
    owner: str = "srv-a",
    pid: int | None = None,
    host: str | None = None,
    expiry: float = NOW + 3600,
) -> dict[str, str]:
    out = {
        LABEL_OWNER: owner,
        LABEL_OWNER_PID: str(os.getpid() if pid is None else pid),
        LABEL_OWNER_HOST: socket.gethostname() if host is None else host,
        LABEL_LEASE_EXPIRY: str(int(expiry)),
    }
    if managed:
        out[LABEL_MANAGED] = "1"
    return out


def test_live_owner_with_valid_lease_is_kept() -> None:
    assert not should_reap(labels(), now=NOW)


def test_expired_lease_is_reaped_even_with_live_owner() -> None:
    assert should_reap(labels(expiry=NOW - 1), now=NOW)


def test_dead_owner_pid_on_this_host_is_reaped() -> None:
    assert should_reap(labels(pid=dead_pid()), now=NOW)


def test_dead_pid_on_another_host_is_not_judged_by_pid() -> None:
    # The pid means nothing on another host; only the lease decides there.
    assert not should_reap(labels(pid=dead_pid(), host="some-other-host"), now=NOW)
    assert should_reap(labels(pid=dead_pid(), host="some-other-host", expiry=NOW - 5), now=NOW)


def test_unmanaged_is_never_reaped() -> None:
    lbl = labels(managed=False, expiry=NOW - 100, pid=dead_pid())
    assert not should_reap(lbl, now=NOW)
    assert not should_reap(lbl, everything=True, now=NOW)
    assert not should_reap(lbl, owner_id="srv-a", now=NOW)


def test_garbage_labels_count_as_orphaned() -> None:
    lbl = labels()
    lbl[LABEL_LEASE_EXPIRY] = "not-a-number"
    assert should_reap(lbl, now=NOW)
    lbl = labels()
    lbl[LABEL_OWNER_PID] = "x"
    assert should_reap(lbl, now=NOW)


def test_owner_mode_takes_own_live_sandboxes_only() -> None:
    mine, theirs = labels(owner="srv-me"), labels(owner="srv-other")
    assert should_reap(mine, owner_id="srv-me", now=NOW)
    assert not should_reap(theirs, owner_id="srv-me", now=NOW)


def test_everything_mode_takes_live_sandboxes_too() -> None:
    assert should_reap(labels(), everything=True, now=NOW)


def make_local(root: Path, name: str, lbl: dict[str, str] | None) -> Path:
    d = root / name
    (d / "rootfs" / "app").mkdir(parents=True)
    (d / "rootfs" / "app" / "f.txt").write_text("x")
    if lbl is not None:
        (d / "labels.json").write_text(json.dumps(lbl))
    return d


async def test_local_reap_removes_only_orphans(tmp_path: Path) -> None:
    live = make_local(tmp_path, "sg-live", labels(expiry=time.time() + 3600))
    dead = make_local(tmp_path, "sg-dead", labels(pid=dead_pid(), expiry=time.time() + 3600))
    expired = make_local(tmp_path, "sg-expired", labels(expiry=time.time() - 10))
    unlabelled = make_local(tmp_path, "sg-creating", None)
    # A read-only directory inside must not stop the removal.
    (expired / "rootfs" / "app").chmod(0o500)
    report = await reap(["local"], local_root_dir=tmp_path)
    assert sorted(r["id"] for r in report.removed) == ["sg-dead", "sg-expired"]
    assert all(r["backend"] == "local" for r in report.removed)
    assert report.errors == []
    assert live.exists() and unlabelled.exists()
    assert not dead.exists() and not expired.exists()


async def test_local_reap_everything_keeps_unlabelled(tmp_path: Path) -> None:
    make_local(tmp_path, "sg-live", labels(expiry=time.time() + 3600))
    make_local(tmp_path, "sg-creating", None)
    report = await reap(["local"], local_root_dir=tmp_path, everything=True)
    assert [r["id"] for r in report.removed] == ["sg-live"]
    assert sorted(os.listdir(tmp_path)) == ["sg-creating"]


async def test_local_reap_of_missing_root_is_a_noop(tmp_path: Path) -> None:
    report = await reap(["local"], local_root_dir=tmp_path / "absent")
    assert report.to_json() == {"removed": [], "errors": []}


def test_local_root_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SANDGYM_LOCAL_ROOT", str(tmp_path))
    assert local_root() == tmp_path
    monkeypatch.delenv("SANDGYM_LOCAL_ROOT")
    assert local_root() in (Path("/dev/shm/sandgym-local"), Path("/tmp/sandgym-local"))
    monkeypatch.setattr("sandgym.sandboxes.local.root._memory_root_usable", lambda: False)
    assert local_root() == Path("/tmp/sandgym-local")


async def test_reap_rejects_unknown_backend() -> None:
    with pytest.raises(ValueError, match="expected a backend"):
        await reap(["nope"])


def test_cli_json_local(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    monkeypatch.setenv("SANDGYM_LOCAL_ROOT", str(tmp_path))
    make_local(tmp_path, "sg-old", labels(expiry=time.time() - 1))
    make_local(tmp_path, "sg-new", labels(expiry=time.time() + 3600))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    rc = cli_run(parser.parse_args(["--backend", "local", "--json"]))
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc == {"removed": [{"backend": "local", "id": "sg-old"}], "errors": []}
    assert (tmp_path / "sg-new").exists()

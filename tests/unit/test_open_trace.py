"""The inotify trace (sandgym/sandboxes/open_trace.py) on this kernel: a program executed, a
script run by its interpreter, a module imported and a file read through a bind mount in another
mount namespace are each seen opened; a file nobody opens is not; a link's absolute target is
resolved inside the sandbox's root, not the host's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandgym.sandboxes.open_trace import OpenTrace, resolve_in_root


def test_opened_files_are_seen(tmp_path: Path) -> None:
    (tmp_path / "prog").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "prog").chmod(0o755)
    shutil.copy("/bin/true", tmp_path / "truebin")
    (tmp_path / "mod_traced.py").write_text("X = 1\n")
    (tmp_path / "unused.txt").write_text("never opened\n")
    paths = {n: str(tmp_path / n) for n in ("prog", "truebin", "mod_traced.py", "unused.txt")}
    trace = OpenTrace(paths)
    trace.start()
    subprocess.run([str(tmp_path / "prog")], check=True)
    subprocess.run([str(tmp_path / "truebin")], check=True)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import mod_traced"
    subprocess.run([sys.executable, "-B", "-c", code], check=True)
    result = trace.stop()
    assert result.opened == ["mod_traced.py", "prog", "truebin"]
    assert result.watched == 4 and not result.unwatched and not result.overflow


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root")
def test_read_through_a_bind_mount_elsewhere_is_seen(tmp_path: Path) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "data.txt").write_text("x\n")
    trace = OpenTrace({"/data.txt": str(src / "data.txt")})
    trace.start()
    script = f"mount --bind {src} {mnt} && cat {mnt}/data.txt"
    subprocess.run(["unshare", "-m", "sh", "-c", script], check=True, capture_output=True)
    assert trace.stop().opened == ["/data.txt"]


def test_watch_cap_lists_the_rest(tmp_path: Path) -> None:
    for n in ("a", "b", "c"):
        (tmp_path / n).write_text(n)
    trace = OpenTrace({n: str(tmp_path / n) for n in ("a", "b", "c")}, max_watches=2)
    trace.start()
    result = trace.stop()
    assert result.watched == 2 and result.unwatched == ["c"]


def test_links_resolve_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").write_text("#!/bin/sh\n")
    (root / "opt/venv/bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", root / "opt/venv/bin/python")
    os.symlink("usr/bin", root / "bin")
    assert resolve_in_root(str(root), "/opt/venv/bin/python") == str(root / "usr/bin/python3")
    assert resolve_in_root(str(root), "/bin/python3") == str(root / "usr/bin/python3")
    assert resolve_in_root(str(root), "/opt/missing") is None

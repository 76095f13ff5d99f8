"""Peak memory where the engine gives none (cgroup v2) and the reasons a ledger names when it
cannot be read (sandgym.sandboxes.usage, sandgym.server.cost), on a cgroup tree laid out in a
temporary directory as the kernel lays it out; the creation limits read from the environment
(sandgym.sandboxes.createlimit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.sandboxes import cgroups
from sandgym.sandboxes.createlimit import (
    LIMITS_ENV,
    CreateLimitsEnvError,
    limits_from_env,
    shared_limiter,
)
from sandgym.sandboxes.usage import (
    SandboxUsage,
    VerifierCgroup,
    cgroup_usage,
    container_peak_memory,
)
from sandgym.server.cost import _why

CID = "c0ffee" * 10


def _v2(root: Path, rel: str, peak: int | None) -> Path:
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    group = root / rel
    group.mkdir(parents=True)
    (group / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    if peak is not None:
        (group / "memory.peak").write_text(f"{peak}\n")
    return group


def test_v2_peak_from_the_container_group_its_init_names(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc"
    root.mkdir()
    _v2(root, f"nested/engine/{CID}", 123456789)  # an engine under a parent of its own
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cgroup").write_text(f"0::/nested/engine/{CID}\n")
    assert container_peak_memory(CID, 4242, root, proc) == (123456789, None)
    assert container_peak_memory(CID, None, root, proc) == (None, "cgroup_not_visible")
    # without the pid, where the systemd driver puts it
    _v2(root, f"system.slice/docker-{CID}.scope", 987654321)
    assert container_peak_memory(CID, None, root, proc) == (987654321, None)


def test_v2_reasons_when_the_peak_cannot_be_read(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    _v2(root, f"docker/{CID}", None)  # a kernel before 5.19: no memory.peak
    assert container_peak_memory(CID, None, root) == (None, "no_memory_peak")
    assert container_peak_memory("other", None, root) == (None, "cgroup_not_visible")


def test_v1_parent_group_outlives_its_child_then_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    vc = VerifierCgroup("sg-1-verifier-ab", root)
    for ctl in ("memory", "cpuacct", "pids"):
        (root / ctl / vc.rel).mkdir(parents=True)
    (root / "memory" / vc.rel / "memory.max_usage_in_bytes").write_text("50331648\n")
    (root / "cpuacct" / vc.rel / "cpuacct.usage").write_text("1500000000\n")
    assert vc.parent == "/sandgym-verifier-sg-1-verifier-ab"
    used = vc.read_and_remove()
    assert (used.peak_memory_bytes, used.cpu_s) == (50331648, 1.5)
    # files in the fake tree keep rmdir from working there; the kernel's groups hold none
    assert cgroup_usage("gone", root)[0].peak_memory_unavailable == "cgroup_not_visible"


def test_the_ledger_names_why_a_peak_is_missing() -> None:
    assert _why(SandboxUsage(peak_memory_bytes=1)) is None
    assert _why(SandboxUsage(peak_memory_unavailable="no_memory_peak")) == "no_memory_peak"
    assert _why(SandboxUsage()) == "unsupported"  # a backend that keeps no such figure


def test_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    raw = f'{{"e2b": {{"max_starting": 2, "directory": "{tmp_path}"}}}}'
    monkeypatch.setenv(LIMITS_ENV, raw)
    limiter = shared_limiter("e2b")
    assert limiter is not None and limiter.settings.max_starting == 2
    assert shared_limiter("e2b") is limiter and shared_limiter("docker") is None
    monkeypatch.setenv(LIMITS_ENV, "")
    assert shared_limiter("e2b") is None
    with pytest.raises(CreateLimitsEnvError, match="expected JSON of backend name -> limits"):
        limits_from_env('{"e2b": {"max_starting": 0}}')


def test_local_cgroup_set_names_a_missing_v2_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend's groups on a v2 kernel without memory.peak: the reason, not a null."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    cg = cgroups.CgroupSet("sb-1")
    cg.dirs["unified"].mkdir(parents=True)
    (cg.dirs["unified"] / "cpu.stat").write_text("usage_usec 1000000\n")
    used = cg.usage()
    assert used.cpu_s == 1.0 and used.peak_memory_unavailable == "no_memory_peak"
    (cg.dirs["unified"] / "memory.peak").write_text("4096\n")
    used = cg.usage()
    assert used.peak_memory_bytes == 4096 and used.peak_memory_unavailable is None

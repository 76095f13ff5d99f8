"""lab/bench/host_load.py: the host's busy and stolen CPU shares over a check, and the check's line
carrying them (`host_load`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.bench import harbor_compat as hc
from lab.bench.host_load import DiskSpace, HostLoad

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def _proc(root: Path, cpu: str, load: str) -> None:
    (root / "stat").write_text(f"cpu  {cpu}\ncpu0 1 2 3 4\nintr 5\n", encoding="ascii")
    (root / "loadavg").write_text(f"{load} 0.50 0.40 1/200 12345\n", encoding="ascii")


def test_shares_are_over_the_span_between_start_and_finish(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    _proc(tmp_path, "100 0 50 800 50 0 0 0 0 0", "0.25")
    load = HostLoad(tmp_path)
    _proc(tmp_path, "180 20 100 880 70 0 0 50 0 0", "1.75")
    out = load.finish()
    assert out is not None
    # over the span: busy 80+20+50+50 = 200 of 200+80+20 = 300 ticks; stolen 50
    assert out["busy_share"] == pytest.approx(0.667, abs=1e-3)
    assert out["steal_share"] == pytest.approx(0.167, abs=1e-3)
    assert out["loadavg_1m"] == [0.25, 1.75]


def test_unreadable_counters_give_none(tmp_path: Path) -> None:
    assert HostLoad(tmp_path / "absent").finish() is None
    (tmp_path / "stat").write_text("intr 5\n", encoding="ascii")
    assert HostLoad(tmp_path).finish() is None


async def test_check_one_puts_the_host_load_on_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    spans: list[str] = []

    class Load:
        def __init__(self) -> None:
            spans.append("start")

        def finish(self) -> dict[str, Any]:
            spans.append("finish")
            return {"busy_share": 0.5}

    monkeypatch.setattr(hc, "HostLoad", Load)
    monkeypatch.setattr(hc, "_stand_ins", lambda bases, image_map: {b: None for b in bases})

    class Backend:
        async def image_for(self, spec: Any) -> str:
            raise RuntimeError("stop after the build")

    from sandgym.tasks.loaders import load_task_dir

    entry = await hc._check_one(load_task_dir(FIXTURES / "harbor-legacy"), Backend(), {}, 60.0, 0)
    assert spans == ["start", "finish"]
    assert entry["host_load"] == {"busy_share": 0.5}


def test_disk_space_is_read_at_start_and_finish(tmp_path: Path) -> None:
    space = DiskSpace(tmp_path).finish()
    assert space is not None and space["path"] == str(tmp_path)
    assert space["total_gb"] > 0 and len(space["free_gb"]) == 2
    assert 0 <= space["free_gb"][0] <= space["total_gb"]
    assert DiskSpace(tmp_path / "absent").finish() is None


async def test_check_one_puts_the_engine_disk_on_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hc, "_stand_ins", lambda bases, image_map: {b: None for b in bases})

    class Backend:
        async def image_for(self, spec: Any) -> str:
            raise RuntimeError("stop after the build")

    from sandgym.tasks.loaders import load_task_dir

    task = load_task_dir(FIXTURES / "harbor-legacy")
    entry = await hc._check_one(task, Backend(), {}, 60.0, 0, engine_root=tmp_path)
    assert entry["engine_disk"]["path"] == str(tmp_path)
    assert entry["engine_disk"]["total_gb"] > 0
    # another backend than docker has no engine root, and its lines no such field
    assert hc._engine_root("null") is None
    assert "engine_disk" not in await hc._check_one(task, Backend(), {}, 60.0, 0)

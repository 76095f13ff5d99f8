"""The Terminal-Bench 2.0 part of `sandgym bench harbor_provider`: the selection rule over a
compat record and the one prepared copy both environments run (lab/bench/harbor_provider_tb2.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench.harbor_provider_tb2 import Tb2SelectionError, prepare, select_tasks

UV = {"name": "uv-installer-from-pypi", "original": "curl ...", "file": "tests/test.sh"}
COPY = {"name": "copy-dest-dir-for-classic-builder", "original": "COPY a b /d", "file": "x"}


def _line(task: str, duration: float, **kw: object) -> dict[str, object]:
    base = {
        "task_id": task,
        "dataset": "terminal-bench-2.0",
        "oracle_shipped": True,
        "reasons": [],
        "duration_s": duration,
        "build_s": 1.0,
        "base_image": "ubuntu:24.04",
        "substitutions": [],
        "code_commit": "abc",
    }
    return {**base, **kw}


def _task(root: Path, name: str, network: str | None = None) -> None:
    (root / name / "tests").mkdir(parents=True)
    (root / name / "environment").mkdir()
    net = f'network_mode = "{network}"\n' if network else ""
    (root / name / "task.toml").write_text(f'version = "1.0"\n[environment]\n{net}cpus = 1\n')
    (root / name / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    (root / name / "tests" / "test.sh").write_text(
        "#!/bin/bash\ncurl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\n"
    )


@pytest.fixture
def record(tmp_path: Path) -> tuple[Path, Path]:
    lines = [
        _line("slow-clean", 90.0),
        _line("fast-clean", 20.0, substitutions=[UV]),
        _line("mapped", 5.0, base_image="debian:13.0-slim"),
        _line("classic-copy", 6.0, substitutions=[COPY]),
        _line("no-oracle", 7.0, oracle_shipped=False),
        _line("failing", 8.0, reasons=["oracle_failed"]),
        _line("later-failing", 9.0),
        _line("later-failing", 9.0, reasons=["verifier_error"]),  # the last line counts
        _line("tie-b", 30.0, base_image="python:3.13-slim-bookworm"),
        _line("tie-a", 30.0, network_mode="x"),
        {**_line("other-set", 1.0), "dataset": "termigen"},
    ]
    jsonl = tmp_path / "compat.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    tasks = tmp_path / "tb2"
    for name in ("slow-clean", "fast-clean", "tie-a", "tie-b", "mapped", "classic-copy"):
        _task(tasks, name, "no-network" if name == "fast-clean" else None)
    return jsonl, tasks


def test_the_rule_takes_the_shortest_clean_tasks_both_sides_build_alike(
    record: tuple[Path, Path],
) -> None:
    jsonl, tasks = record
    chosen = select_tasks(jsonl, {"debian:13.0-slim": "debian:13"}, 3, tasks)
    assert [t.task for t in chosen] == ["fast-clean", "tie-a", "tie-b"]
    assert chosen[0].recorded_duration_s == 20.0
    assert chosen[0].recorded_substitutions == ["uv-installer-from-pypi"]
    four = select_tasks(jsonl, {"debian:13.0-slim": "debian:13"}, 4, tasks)
    assert [t.task for t in four][-1] == "slow-clean"


def test_the_rule_refuses_a_selected_task_missing_on_disk(record: tuple[Path, Path]) -> None:
    jsonl, tasks = record
    with pytest.raises(Tb2SelectionError, match="expected 9 tasks by the rule, found 4"):
        select_tasks(jsonl, {"debian:13.0-slim": "debian:13"}, 9, tasks)
    (tasks / "tie-a" / "task.toml").unlink()
    with pytest.raises(Tb2SelectionError, match="tie-a"):
        select_tasks(jsonl, {"debian:13.0-slim": "debian:13"}, 2, tasks)


def test_prepare_writes_one_substituted_public_copy(
    record: tuple[Path, Path], tmp_path: Path
) -> None:
    jsonl, tasks = record
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "Packages-trixie-amd64").write_text("")  # no download in a unit test
    chosen = select_tasks(jsonl, {"debian:13.0-slim": "debian:13"}, 2, tasks)
    out = prepare(chosen, tasks, tmp_path / "prepared", cache)
    fast = out[0]
    assert fast.task == "fast-clean" and fast.public_copy
    assert fast.network_mode_original == "no-network"
    toml = (tmp_path / "prepared" / "fast-clean" / "task.toml").read_text()
    assert 'network_mode = "public"' in toml and "no-network" not in toml
    assert [s["name"] for s in fast.substitutions] == ["uv-installer-from-pypi"]
    script = (tmp_path / "prepared" / "fast-clean" / "tests" / "test.sh").read_text()
    assert "astral.sh" not in script and "pypi.org/simple/uv/" in script
    assert not out[1].public_copy and out[1].network_mode_original is None
    # the original task folder is left as it was
    assert "no-network" in (tasks / "fast-clean" / "task.toml").read_text()

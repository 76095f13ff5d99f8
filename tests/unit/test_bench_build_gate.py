"""lab/bench/build_gate.py and its use by `sandgym bench harbor_compat --prune-images`: a finished
task's image is never removed while another task's image builds (the legacy builder shares step
images between builds; removing them under a build lost its layer, issue 32)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from lab.bench import harbor_compat as hc
from lab.bench.build_gate import BuildGate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


async def _until(cond: Any) -> None:
    """Yield to the other tasks until `cond()` holds (no clock: the loop's own turns)."""
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_a_removal_waits_for_the_builds_inside_and_holds_back_new_ones() -> None:
    gate = BuildGate()
    order: list[str] = []
    first_done = asyncio.Event()

    async def build(name: str, done: asyncio.Event | None = None) -> None:
        async with gate.build():
            order.append(f"{name} in")
            if done is not None:
                await done.wait()
            order.append(f"{name} out")

    async def removal() -> None:
        async with gate.removal():
            order.append("rm")

    first = asyncio.create_task(build("b1", first_done))
    await _until(lambda: gate.building == 1)
    rm = asyncio.create_task(removal())
    await _until(lambda: gate.removals_waiting == 1)
    late = asyncio.create_task(build("b2"))  # arrives while the removal waits
    for _ in range(20):
        await asyncio.sleep(0)
    assert order == ["b1 in"]  # neither the removal nor the later build got in
    first_done.set()
    await asyncio.gather(first, rm, late)
    assert order == ["b1 in", "b1 out", "rm", "b2 in", "b2 out"]
    assert gate.building == 0 and gate.removals_waiting == 0


async def test_builds_share_the_gate() -> None:
    gate = BuildGate()
    release = asyncio.Event()
    inside: list[int] = []

    async def build() -> None:
        async with gate.build():
            inside.append(gate.building)
            await release.wait()

    tasks = [asyncio.create_task(build()) for _ in range(3)]
    await _until(lambda: gate.building == 3)
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(inside) == [1, 2, 3] and gate.building == 0


async def test_check_one_builds_the_image_inside_the_gate() -> None:
    gate = BuildGate()
    seen: list[int] = []

    class Backend:
        async def image_for(self, spec: Any) -> str:
            seen.append(gate.building)
            raise RuntimeError("stop after the build")

    from sandgym.tasks.loaders import load_task_dir

    task = load_task_dir(FIXTURES / "harbor-legacy")
    entry = await hc._check_one(task, Backend(), {}, 60.0, 0, gate=gate)
    assert seen == [1]  # the build ran holding the gate
    assert gate.building == 0 and entry["env_builds"] is False  # and left it


async def test_check_one_records_the_local_base_image_its_task_started_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each line names the local image its FROM resolved to when the task started (a stand-in
    rebuilt later by a new recipe is another image)."""
    seen: list[tuple[list[str], dict[str, str]]] = []

    def stand_ins(bases: list[str], image_map: dict[str, str]) -> dict[str, Any]:
        seen.append((bases, image_map))
        return {b: {"local_image": b, "id": "sha256:0123456789ab"} for b in bases}

    monkeypatch.setattr(hc, "_stand_ins", stand_ins)

    class Backend:
        async def image_for(self, spec: Any) -> str:
            raise RuntimeError("stop after the build")

    from sandgym.tasks.loaders import load_task_dir

    task = load_task_dir(FIXTURES / "harbor-legacy")
    base = hc._base_image(task)
    assert base
    entry = await hc._check_one(task, Backend(), {"x": "y"}, 60.0, 0)
    assert seen == [([base], {"x": "y"})]
    assert entry["base_image_local"] == {"local_image": base, "id": "sha256:0123456789ab"}


async def test_a_pruned_image_is_removed_only_when_no_other_build_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "set"
    root.mkdir()
    for n in ("slow", "quick"):
        shutil.copytree(FIXTURES / "harbor-legacy", root / n)
    gates: list[BuildGate] = []
    slow_released = asyncio.Event()
    removed: list[tuple[str, int]] = []
    loop = asyncio.get_running_loop()

    async def fake(task: Any, backend: Any, image_map: Any, t: Any, r: Any, item: Any, **kw: Any):
        gate = kw["gate"]
        gates.append(gate)
        async with gate.build():
            if item.path.name == "slow":
                await slow_released.wait()
        e: dict[str, Any] = {
            "task_id": task.id,
            "dataset": item.dataset,
            "oracle_shipped": True,
            "env_builds": True,
            "oracle_reward": 1.0,
            "noop_reward": 0.0,
            "error": None,
            "duration_s": 0.0,
        }
        e["reasons"] = hc.verdict(e)
        return e

    real_run = hc.subprocess.run

    def fake_run(cmd: list[str], **kw: Any) -> Any:  # the engine's `docker image rm -f TAG`
        if cmd[:3] != ["docker", "image", "rm"]:
            return real_run(cmd, **kw)
        removed.append((cmd[-1], gates[0].building))
        loop.call_soon_threadsafe(slow_released.set)
        return argparse.Namespace(returncode=0)

    async def release_when_a_removal_waits() -> None:
        await _until(lambda: bool(gates) and gates[0].removals_waiting > 0)
        slow_released.set()

    monkeypatch.setattr(hc, "_check_one", fake)
    monkeypatch.setattr(hc, "_existing_ctx_tags", lambda: set())
    monkeypatch.setattr(hc, "_ctx_tag", lambda task, image_map: f"sandgym/ctx:{task.id}")
    monkeypatch.setattr(hc.subprocess, "run", fake_run)
    parser = argparse.ArgumentParser()
    hc.add_arguments(parser)
    args = parser.parse_args(
        ["--tasks-dir", str(root), "--source-sample", "", "--backend", "null"]
        + ["--infra-retries", "0", "--work-dir", str(tmp_path / "w")]
        + ["--concurrency", "2", "--prune-images"]
    )
    helper = asyncio.create_task(release_when_a_removal_waits())
    try:
        doc = await hc.run_compat(args)
    finally:
        helper.cancel()
    assert doc["tasks_run"] == 2 and len(gates) == 2 and gates[0] is gates[1]
    # both images removed, each while no build ran (the quick task's waited for the slow build)
    assert sorted(tag for tag, _ in removed) == sorted(
        f"sandgym/ctx:{t['task_id']}" for t in doc["datasets"][0]["tasks"]
    )
    assert [building for _, building in removed] == [0, 0]

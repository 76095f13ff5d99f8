"""The training demo's held-out check: a held-out episode whose instruction also occurred in
training must be refused. Instructions come from the real `file-ops` generator (run here as the
runtime runs it, with $SANDGYM_INSTRUCTION_FILE), so this also shows that seeds give different
instructions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench.demo_stats import HeldoutOverlapError, check_heldout_disjoint, compare, summary_text
from sandgym.tasks.registry import CATALOG_DIR

GENERATOR = CATALOG_DIR / "file-ops" / "environment" / "generate.py"


def instruction(seed: int, tmp_path: Path) -> str:
    work = tmp_path / f"seed{seed}"
    work.mkdir()
    out = tmp_path / f"instruction{seed}.md"
    env = {**os.environ, "SANDGYM_INSTRUCTION_FILE": str(out)}
    subprocess.run(
        [sys.executable, str(GENERATOR), "--seed", str(seed)],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
    )
    return out.read_text()


def test_disjoint_seeds_pass_and_a_repeated_one_is_refused(tmp_path: Path) -> None:
    training = [instruction(s, tmp_path) for s in range(6)]
    heldout = [instruction(s, tmp_path) for s in (100_000, 100_001, 100_002)]
    rec = check_heldout_disjoint(training, heldout)
    assert rec == {"training_instructions": 6, "heldout_instructions": 3, "shared": 0}
    # a held-out seed that repeats a training seed repeats its instruction: refused
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(HeldoutOverlapError, match="1 held-out instruction"):
        check_heldout_disjoint(training, [*heldout, instruction(3, again)])


def test_whitespace_does_not_hide_a_repeat_and_nothing_recorded_is_an_error() -> None:
    with pytest.raises(HeldoutOverlapError, match="also occurred in training"):
        check_heldout_disjoint(["Copy `/app/a` to `/app/b`."], ["Copy `/app/a` to `/app/b`.\n"])
    with pytest.raises(HeldoutOverlapError, match="expected instructions on both sides"):
        check_heldout_disjoint(["x"], [])


def test_summary_is_built_from_the_values() -> None:
    before = {"mean_reward": 0.1, "stderr": 0.05, "successes": 4, "episodes": 40}
    after = {"mean_reward": 0.5, "stderr": 0.08, "successes": 20, "episodes": 40}
    c = compare(before, after)
    assert c["excludes_zero"] and abs(c["delta"] - 0.4) < 1e-9
    text = summary_text(
        {
            "temperature": 0.7,
            "updates": 20,
            "heldout": {"builtin/file-ops": {"before": before, "after": after, "comparison": c}},
            "heldout_instruction_check": {
                "ok": True,
                "training_instructions": 160,
                "heldout_instructions": 40,
            },
        }
    )
    assert "0.10 (4/40) before" in text and "0.50 (20/40) after 20 GRPO updates" in text
    assert "+0.40" in text and "excludes zero" in text and "160 training" in text


# -- issue 31, item 6: wordings and operations never seen; intervals at the level of seeds ----


def family_instructions(family_dir: Path, seeds: range, tmp_path: Path) -> list[str]:
    gen = family_dir / "environment" / "generate.py"
    out = []
    for seed in seeds:
        work = tmp_path / f"{family_dir.name}-{seed}"
        work.mkdir()
        dest = work / "instruction.md"
        env = {**os.environ, "SANDGYM_INSTRUCTION_FILE": str(dest)}
        subprocess.run([sys.executable, str(gen), "--seed", str(seed)], cwd=work, env=env,
                       check=True, capture_output=True)  # fmt: skip
        out.append(dest.read_text())
    return out


def test_the_heldout_family_has_unseen_wordings_and_an_unseen_operation(tmp_path: Path) -> None:
    from lab.bench.demo_stats import check_heldout_novel, wording_template
    from lab.bench.train_demo import operation
    from lab.bench.train_probe import HELDOUT_TASKS

    training = family_instructions(CATALOG_DIR / "path-ops", range(60), tmp_path)
    heldout = family_instructions(HELDOUT_TASKS / "heldout-ops", range(100_000, 100_040), tmp_path)
    rec = check_heldout_novel(training, heldout, operation)
    assert rec["unseen_operations"] == ["chmod"] and rec["shared_templates"] == 0
    assert {"mkdir", "write", "delete"} <= set(rec["heldout_operations"])
    # the check compares wordings, not strings: other seeds of the trained family have other
    # strings but the same templates, and are refused (an exact-string check passed them)
    other_seeds = family_instructions(CATALOG_DIR / "path-ops", range(500, 520), tmp_path)
    assert not set(other_seeds) & set(training)
    with pytest.raises(HeldoutOverlapError, match="wording"):
        check_heldout_novel(training, other_seeds, operation)
    assert wording_template("Delete the file `/app/a1/x.txt`.") == "Delete the file <X>."
    # a held-out set whose operations were all trained is refused too
    only_known = [h for h in heldout if operation(h) != "chmod"]
    with pytest.raises(HeldoutOverlapError, match="at least one never seen"):
        check_heldout_novel(training, only_known, operation)


def test_seed_level_interval_treats_the_seed_as_the_unit() -> None:
    from lab.bench.demo_stats import compare, rewards_by_seed, seed_level_compare

    # 4 seeds x 8 episodes: within a seed the episodes agree (the instance decides), so the
    # 32 episodes carry the information of 4 observations
    before = {s: [0.0] * 8 for s in range(4)}
    after = {0: [1.0] * 8, 1: [1.0] * 8, 2: [0.0] * 8, 3: [0.0] * 8}
    sl = seed_level_compare(before, after, n_boot=2000)
    assert sl["seeds"] == 4 and sl["delta"] == pytest.approx(0.5)
    assert sl["sign_flip_exact"] and sl["sign_flip_p"] == pytest.approx(0.5)  # 8 of 16 flips
    # resampling 4 seeds draws the two zero-difference seeds every time 1 in 16: 0 is inside
    assert sl["ci95"][0] == 0.0 and not sl["excludes_zero"]

    # the episode-level interval of the same data claims far more than 4 seeds can support
    def stats(d: dict[int, list[float]]) -> dict[str, float]:
        flat = [x for v in d.values() for x in v]
        m = sum(flat) / len(flat)
        return {"mean_reward": m, "stderr": (m * (1 - m) / len(flat)) ** 0.5}

    assert compare(stats(before), stats(after))["excludes_zero"]
    assert sl["sign_flip_p"] > 0.05
    with pytest.raises(ValueError, match="same non-empty seeds"):
        seed_level_compare(before, {0: [1.0]})
    eps = [{"task_id": "t", "phase": "eval-after", "seed": 3, "reward": 1.0},
           {"task_id": "t", "phase": "eval-after", "seed": 3, "reward": 0.0},
           {"task_id": "u", "phase": "eval-after", "seed": 3, "reward": 1.0}]  # fmt: skip
    assert rewards_by_seed(eps, "t", "eval-after") == {3: [1.0, 0.0]}

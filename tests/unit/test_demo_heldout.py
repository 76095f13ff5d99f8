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

from bench.demo_stats import HeldoutOverlapError, check_heldout_disjoint, compare, summary_text
from tasks.registry import CATALOG_DIR

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

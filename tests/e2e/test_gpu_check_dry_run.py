"""`lab/bench/gpu_check.py`, the GPU check prepared for a lent machine, run dry on this CPU (`--device
cpu --small`): every part it will run there runs here, so the script cannot rot unseen between
the rare sessions that have a GPU. The engine generates exactly the asked tokens with finite
logprobs; the learner's step (scripts/gpu_fsdp_check.py, which runs the trainer's own
`sandgym.trainer.update.update_step`) runs replicated and sharded, and an FSDP2 rank holds half the
parameters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


def test_gpu_check_runs_dry_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.bench.gpu_check",
            "--device",
            "cpu",
            "--small",
            "--out",
            str(out),
            "--run-timeout-s",
            "240",
            "--timeout-s",
            "560",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    gen = doc["generate"]
    assert gen["generated_tokens"] == gen["batch"] * doc["settings"]["new_tokens"]
    assert gen["logprobs_finite"] and gen["generated_tokens_per_s"] > 0
    runs = {(s["mode"], s["strategy"], s["world_size"]): s for s in doc["learner"]["summary"]}
    assert all(s["ok"] and s["loss_finite"] and s["tokens_per_s_rank0"] for s in runs.values())
    single = runs[("single", "replicate", 1)]
    sharded = runs[("dist", "fsdp", 2)]
    assert single["params_local_rank0"] == single["params_full"]
    assert sharded["params_local_rank0"] * 2 == pytest.approx(sharded["params_full"], rel=0.01)


def test_gpu_check_runs_the_trainers_own_step_not_a_copy() -> None:
    """The script calls `sandgym.trainer.update.update_step` (what `LearnerWorker.train` runs) and has no
    loss, backward or optimizer step of its own: a re-implementation would measure something
    other than the trainer (issue 31, item 5)."""
    import ast
    import inspect

    from sandgym.trainer.learner import LearnerWorker

    tree = ast.parse((REPO / "scripts" / "gpu_fsdp_check.py").read_text())
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = {f.id for f in calls if isinstance(f, ast.Name)}
    attrs = {f.attr for f in calls if isinstance(f, ast.Attribute)}
    assert "update_step" in names
    assert not attrs & {"backward", "step", "clip_grad_norm_", "cross_entropy", "all_reduce"}, (
        attrs & {"backward", "step", "clip_grad_norm_", "cross_entropy", "all_reduce"}
    )
    # and the learner's own train() goes through the same function
    assert "update_step(" in inspect.getsource(LearnerWorker.train)

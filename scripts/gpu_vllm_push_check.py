"""GPU check of the weight push into vLLM (issue 31): prepared, not yet run (no machine with
vLLM and a GPU was available; the lent GPU machine has no vLLM and cannot fetch it).

Needs: a CUDA GPU, `pip install vllm` (0.34 or later), transformers, and a Hugging Face model
directory (a small one: SmolLM2-135M-Instruct). Two checks, each printing a JSON line:

1. in-process (`engine.kind: vllm`, sandgym/trainer/engines/vllm.py): generate greedily, push weights
   whose final norm is scaled (a different policy), generate again: the engine's logprobs move,
   and they equal those of transformers' forward pass of the pushed weights (to bf16 tolerance);
2. `vllm serve` (`engine.kind: openai` with `engine.weight_sync: vllm_http`,
   sandgym/trainer/engines/openai.py): the same through VLLM_SERVER_DEV_MODE=1's /collective_rpc and
   /reset_prefix_cache, with `--logprobs-mode processed_logprobs`.

    python scripts/gpu_vllm_push_check.py --model /models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 314]


def perturbed(model_dir: str) -> dict[str, Any]:
    """The model's weights with its final norm scaled by 1.5 (another policy, same shapes)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for k in state:
        if k.endswith("model.norm.weight"):
            state[k] = state[k] * 1.5
    return state


def reference_logprobs(model_dir: str, state: dict[str, Any], tokens: list[int]) -> list[float]:
    """transformers' logprobs of `tokens` after PROMPT under `state` (temperature 1)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).cuda()
    model.load_state_dict(state)
    ids = torch.tensor([PROMPT + tokens]).cuda()
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    return [float(logp[len(PROMPT) - 1 + j, t]) for j, t in enumerate(tokens)]


def check(before: Any, after: Any, want: list[float]) -> dict[str, Any]:
    moved = max(abs(a - b) for a, b in zip(before.logprobs, after.logprobs, strict=False))
    err = max(abs(a - b) for a, b in zip(after.logprobs, want, strict=True))
    return {"logprobs_moved": moved, "max_err_vs_transformers": err,
            "ok": moved > 1e-2 and err < 5e-2 and after.version == 1}  # fmt: skip


def in_process(model_dir: str, state: dict[str, Any]) -> dict[str, Any]:
    from sandgym.trainer.engines import create_engine
    from sandgym.trainer.engines.base import SamplingParams

    engine = create_engine("vllm", model_path=model_dir, eos_token_ids=[2])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    before = engine.generate([PROMPT], greedy)[0]
    engine.update_weights(state, 1)
    after = engine.generate([PROMPT], greedy)[0]
    after.version = engine.version
    return check(before, after, reference_logprobs(model_dir, state, after.token_ids))


def served(model_dir: str, state: dict[str, Any], port: int) -> dict[str, Any]:
    from sandgym.trainer.engines import create_engine
    from sandgym.trainer.engines.base import SamplingParams

    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    cmd = ["vllm", "serve", model_dir, "--port", str(port), "--served-model-name", "policy",
           "--logprobs-mode", "processed_logprobs", "--gpu-memory-utilization", "0.4"]  # fmt: skip
    server = subprocess.Popen(cmd, env=env)
    try:
        import httpx

        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                return {"ok": False, "error": "vllm serve did not come up"}
            time.sleep(2)
        with tempfile.TemporaryDirectory() as d:
            engine = create_engine(
                "openai", base_url=f"http://127.0.0.1:{port}/v1", model_name="policy",
                eos_token_ids=[2], weight_sync="vllm_http", weight_dir=d,
            )  # fmt: skip
            greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
            before = asyncio.run(engine.agenerate(PROMPT, greedy))
            engine.update_weights(state, 1)
            after = asyncio.run(engine.agenerate(PROMPT, greedy))
        return check(before, after, reference_logprobs(model_dir, state, after.token_ids))
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a Hugging Face model directory")
    ap.add_argument("--port", type=int, default=8011)
    args = ap.parse_args()
    state = perturbed(args.model)
    results = {}
    for name, fn in (("in_process", lambda: in_process(args.model, state)),
                     ("vllm_serve", lambda: served(args.model, state, args.port))):  # fmt: skip
        try:
            results[name] = fn()
        except Exception as exc:  # recorded: the other check still runs
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({name: results[name]}), flush=True)
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

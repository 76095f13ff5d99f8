"""GPU check for the lent machine (issue 20.4): the rollout engine's generation and the sharded
learner's step on one CUDA GPU, tokens per second and peak memory, in one JSON document.

    bash lab/bench/gpu_check.sh                         # on the lent machine: writes $OUT/gpu_check.json
    python -m lab.bench.gpu_check --device cpu --small  # a dry run of every part on this machine

Made for what the lent machine has (torch with CUDA, transformers, numpy; no Ray, no pydantic,
no network, no real checkpoint: 64 MiB travel), so it imports only `sandgym/trainer/engines` (the hf
engine), `sandgym/trainer/sharding.py`, `sandgym/trainer/update.py` and `sandgym/trainer/algorithms.py` (through
`scripts/gpu_fsdp_check.py`: the learner's own update step, FSDP2 and bf16 mixed precision),
and builds its models from configs with random weights:

- `generate`: `sandgym.trainer.engines.hf.HFEngine` (KV-cached, left-padded batches, the sampling rule
  the learner recomputes) on a model of SmolLM2-135M's shapes in bf16: a batch of prompts,
  exactly `--new-tokens` each; generated tokens per second and peak memory;
- `learner`: `scripts/gpu_fsdp_check.py` on the SmolLM2 shapes and on a 1B Llama: the
  replicate strategy on one GPU, and FSDP2 as rank 0 of fake 2- and 8-rank groups (per-rank
  memory of a sharded run on one GPU); tokens per second of the update step and peak memory.

Random weights make generation speed real but its text meaningless; that is all this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandgym.trainer.engines.base import SamplingParams
from sandgym.trainer.engines.hf import HFEngine

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3

#: the learner check's model shapes (one table for both parts): SmolLM2-135M-Instruct's, the
#: demo's policy model, and `tiny` for a dry run that finishes in seconds
SHAPES = "smollm2"
SMALL_SHAPES = "tiny"


def _fsdp_check_module() -> Any:
    """scripts/gpu_fsdp_check.py loaded from its path: `scripts` is not a package of ours, and a
    site-packages `scripts` package (verl 0.9.1's wheel ships one) would shadow it by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "sandgym_gpu_fsdp_check", REPO / "scripts" / "gpu_fsdp_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate(args: argparse.Namespace) -> dict[str, Any]:
    """The hf engine generating `--new-tokens` for `--batch` prompts of `--prompt-tokens`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    CONFIGS = _fsdp_check_module().CONFIGS

    shapes = SMALL_SHAPES if args.small else SHAPES
    cfg = LlamaConfig(**CONFIGS[shapes], max_position_embeddings=8192)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype)  # type: ignore[call-arg]  # transformers' decorator typing
    engine = HFEngine(model, eos_token_ids=[], pad_token_id=0, device=args.device,
                      max_batch_size=args.batch)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(10, cfg.vocab_size, (args.batch, args.prompt_tokens), generator=gen)
    prompts_l = [p.tolist() for p in prompts]
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    engine.generate([p[:8] for p in prompts_l[:2]], SamplingParams(max_new_tokens=2))  # warm-up
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    gens = engine.generate(prompts_l, params)
    if args.device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    made = sum(len(g.token_ids) for g in gens)
    finite = all(all(lp == lp and lp <= 0.0 for lp in g.logprobs) for g in gens)  # NaN != NaN
    return {
        "model": f"{SMALL_SHAPES if args.small else SHAPES} shapes, random weights",
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "generated_tokens": made,
        "wall_s": round(wall, 4),
        "generated_tokens_per_s": round(made / wall, 1),
        "logprobs_finite": finite,
        "peak_gib": (
            round(torch.cuda.max_memory_allocated() / GIB, 3) if args.device == "cuda" else None
        ),
    }


def learner(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """`scripts/gpu_fsdp_check.py` (the learner's update step, FSDP2 and replicate), bounded."""
    configs = SMALL_SHAPES if args.small else f"{SHAPES},1b"
    out = out_dir / "gpu_fsdp_check.json"
    cmd = [sys.executable, str(REPO / "scripts/gpu_fsdp_check.py"), "--device", args.device,
           "--configs", configs, "--fake-worlds", "2" if args.small else "2,8", "--seq", str(args.seq),
           "--steps", "3", "--run-timeout-s", str(args.run_timeout_s), "--out", str(out)]  # fmt: skip
    if args.small:
        cmd += ["--micro-batch", "1", "--micro-batches", "2"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout_s)
    if not out.exists():
        return {"ok": False, "returncode": proc.returncode, "stderr_tail": proc.stderr[-3000:]}
    report = json.loads(out.read_text())
    tokens = (
        report["runs"][0]["per_rank"][0].get("tokens_per_step_per_rank") if report["runs"] else None
    )
    summary = []
    for s in report["summary"]:
        step = s.get("step_s_median_rank0")
        summary.append(
            {**s, "tokens_per_s_rank0": round(tokens / step, 1) if tokens and step else None}
        )
    return {"ok": proc.returncode == 0, "returncode": proc.returncode, "summary": summary,
            "report": report}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="small shapes: a CPU dry run")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--seq", type=int, default=1024, help="learner sequence length")
    ap.add_argument("--run-timeout-s", type=float, default=90.0, help="per learner run")
    ap.add_argument("--timeout-s", type=float, default=400.0, help="the whole learner part")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.small:
        args.batch, args.prompt_tokens, args.new_tokens, args.seq = 4, 16, 8, 64

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    started = time.time()
    doc: dict[str, Any] = {
        "bench": "gpu_check",
        "command": "python -m lab.bench.gpu_check " + " ".join(sys.argv[1:]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        },
        "settings": vars(args),
    }
    try:
        doc["generate"] = generate(args)
    except Exception as exc:  # recorded: the learner part still runs
        doc["generate"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    if args.device == "cuda":
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        doc["learner"] = learner(args, Path(tmp))
    doc["wall_s"] = round(time.time() - started, 1)
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    gen_ok = "generated_tokens_per_s" in doc["generate"] and doc["generate"]["logprobs_finite"]
    return 0 if gen_ok and doc["learner"]["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

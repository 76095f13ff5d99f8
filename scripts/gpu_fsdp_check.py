"""GPU check of the sharded learner: per-rank memory and step time, `fsdp` vs `replicate`.

Prepared for a CUDA machine (torch >= 2.6 with FSDP2, transformers; no Ray, no pydantic): it
runs the trainer's own code, `sandgym/trainer/sharding.py` (the learner's FSDP2 wrapping) and
`sandgym.trainer.update.update_step` (the update step `LearnerWorker.train` runs: the PPO loss over
micro-batches with gradient accumulation, bf16 autocast, fsdp's zero-loss fillers, one gradient
sync per step, global-norm clipping, AdamW), on a randomly initialised Llama-like model with
random samples shaped like the trainer's (a prompt without loss, generated tokens with
logprobs and advantages).

    python scripts/gpu_fsdp_check.py                       # 1b, every mode that fits the machine
    python scripts/gpu_fsdp_check.py --configs 1b,8b --out lab/bench/results/gpu_fsdp_check.json

On one GPU the default (1b) is 4 runs (single replicate, fake fsdp 2/4/8), each a fresh process
(~10-30 s to start and build); `--configs 1b,8b` adds the 8B shapes (replicate needs ~160 GB
for fp32 weights + grads + AdamW + the flat all-reduce buffer: expect an OOM recorded on a
141 GB card, which is the point; fsdp over 8 fake ranks needs ~1/8 of the state).

Runs, each in fresh processes (clean CUDA peak statistics; an OOM is recorded, not fatal):

- `dist`: with >= 2 GPUs, `--world-size` processes (torch.multiprocessing spawn, NCCL), one per
  GPU, for each strategy. Also a small equality check: one update with fsdp and with replicate
  from the same weights on the same batch (max weight difference after gathering).
- `fake`: with one GPU (or always, for `--fake-worlds`), one process that is rank 0 of a fake
  process group of N ranks (torch's FakeStore: collectives do nothing): fsdp's per-rank memory for
  N ranks is measured on one GPU; step time then excludes communication.
- `single`: the replicate strategy on one GPU (world size 1: its per-rank memory at any world
  size, less the flat gradient buffer of the all-reduce, which the step allocates only with
  several ranks: one more fp32 copy of the gradients).

Prints one JSON document on stdout (also written to `--out` if given). Model weights are random
(built on the meta device and initialised on the GPU: no download, seconds to start).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Llama-3-like shapes (vocab 128256, GQA 8 kv heads), SmolLM2-135M's; `tiny` is for
#: a CPU dry run of the script
CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                 tie_word_embeddings=True),
    # SmolLM2-135M-Instruct's shapes (the demo's policy model)
    "smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                    tie_word_embeddings=True),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               tie_word_embeddings=True),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
               num_attention_heads=24, num_key_value_heads=8, vocab_size=128256,
               tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               tie_word_embeddings=False),
}  # fmt: skip

GIB = 1024**3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_model(name: str, device: Any, seed: int, shard: bool, mixed: bool) -> Any:
    """The model on the meta device, sharded (fsdp) or not, then materialised on `device` and
    initialised there (normal(0, 0.02) weights, unit norms)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sandgym.trainer import sharding

    cfg = LlamaConfig(**CONFIGS[name], max_position_embeddings=8192)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    if shard:
        sharding.shard_model(model, device.type, mixed_precision=mixed)
    model.to_empty(device=device)
    if not shard:
        model.tie_weights()  # to_empty gave lm_head its own tensor; fully_shard kept the tie
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            local = sharding.local_tensor(p)
            if "norm" in pname:
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02, generator=gen)
    # the rotary embedding's inv_freq is a computed (non-persistent) buffer: rebuild it off meta
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=cfg).to(device)
    return model


def random_samples(vocab: int, args: argparse.Namespace, rank: int) -> list[Any]:
    """`micro_batch * micro_batches` sequences of `seq` random tokens: the first quarter a prompt
    (no loss), the rest generated tokens with the random model's logprob (log 1/vocab: ratios
    near 1) and advantages of both signs, as the trainer's samples look."""
    import torch

    from sandgym.trainer.algorithms import Sample

    gen = torch.Generator().manual_seed(1000 + rank)
    prompt = args.seq // 4
    out = []
    for i in range(args.micro_batch * args.micro_batches):
        ids = torch.randint(0, vocab, (args.seq,), generator=gen).tolist()
        mask = [0] * prompt + [1] * (args.seq - prompt)
        old = [0.0] * prompt + [-math.log(vocab)] * (args.seq - prompt)
        out.append(Sample(ids, mask, old, 1.0 if i % 2 else -1.0))
    return out


def train_steps(
    model: Any,
    optimizer: Any,
    args: argparse.Namespace,
    device: Any,
    fsdp: bool,
    rank: int,
    world: int,
) -> dict[str, Any]:
    """The learner's own update step (`sandgym.trainer.update.update_step`, what `LearnerWorker.train`
    runs: PPO loss, bf16 autocast on GPU, fsdp fillers, gradient sync, clipping, AdamW),
    `args.steps` times after one warm-up."""
    import torch

    from sandgym.trainer.algorithms import LossSettings, aggregation_norm
    from sandgym.trainer.update import update_step

    samples = random_samples(model.config.vocab_size, args, rank)
    settings = LossSettings()
    norm = aggregation_norm(samples, settings) * world  # every rank holds as many tokens
    times, losses = [], []
    gn = None
    for step in range(args.steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        stats = update_step(
            model,
            optimizer,
            samples,
            norm,
            settings,
            pad_id=0,
            device=device,
            micro_batch_size=args.micro_batch,
            max_grad_norm=1.0,
            world_size=world,
            fsdp=fsdp,
            num_micro_batches=args.micro_batches,
        )
        gn = stats["grad_norm"]
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step > 0:  # step 0 is the warm-up (allocator, kernels, AdamW state)
            times.append(time.perf_counter() - t0)
            losses.append(stats["loss_sum"])
    return {
        "step_s_median": statistics.median(times) if times else None,
        "step_s": times,
        "loss": losses,
        "grad_norm_last": gn,
        "tokens_per_step_per_rank": args.micro_batch * args.seq * args.micro_batches,
    }


def worker(rank: int, run: dict[str, Any], args: argparse.Namespace, out_dir: str) -> None:
    """One rank of one run; writes its result to out_dir/rank<r>.json."""
    import torch
    import torch.distributed as dist

    from sandgym.trainer import sharding

    res: dict[str, Any] = {"rank": rank}
    try:
        cuda = args.device == "cuda"
        if cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
            torch.cuda.reset_peak_memory_stats()
        device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
        mode, world, strategy = run["mode"], run["world_size"], run["strategy"]
        if mode == "fake":
            from torch.testing._internal.distributed.fake_pg import FakeStore

            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        elif world > 1 or strategy == "fsdp":
            dist.init_process_group(
                "nccl" if cuda else "gloo",
                init_method=f"tcp://127.0.0.1:{run['port']}",
                rank=rank,
                world_size=world,
            )
        fsdp = strategy == "fsdp"
        model = build_model(run["config"], device, seed=0, shard=fsdp, mixed=cuda)
        model.train()
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        full = sum(p.numel() for p in model.parameters())
        res["params_full"] = full
        res["params_local"] = sharding.local_numel(model)
        res["mem_after_build_gib"] = torch.cuda.memory_allocated() / GIB if cuda else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        res.update(train_steps(model, optimizer, args, device, fsdp, rank, world))
        res["optimizer_local_numel"] = sharding.optimizer_local_numel(optimizer)
        if cuda:
            res["mem_after_steps_gib"] = torch.cuda.memory_allocated() / GIB
            res["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
            res["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        res["ok"] = True
    except torch.cuda.OutOfMemoryError as exc:
        res.update(ok=False, oom=True, error=str(exc).splitlines()[0])
        if torch.cuda.is_available():
            res["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    except Exception as exc:  # recorded; the other runs go on
        res.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))
    # an OOM'd or failed rank may leave peers waiting in a collective: the parent's timeout ends it
    if dist.is_initialized() and res.get("ok"):
        dist.destroy_process_group()


def equality_worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """fsdp vs replicate from the same weights on the same global batch (NCCL, bf16 autocast):
    the max difference of the gathered weights after one AdamW step."""
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from sandgym.trainer import sharding

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from sandgym.trainer.algorithms import LossSettings, aggregation_norm
    from sandgym.trainer.update import update_step

    cfg = LlamaConfig(**{**CONFIGS["tiny"], "hidden_size": 256, "intermediate_size": 512})
    small = argparse.Namespace(seq=64, micro_batch=2, micro_batches=1)
    mine = random_samples(cfg.vocab_size, small, rank)
    settings = LossSettings()
    norm = aggregation_norm(mine, settings) * world
    result: dict[str, Any] = {}
    for strategy in ("replicate", "fsdp"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)  # same CPU init on every rank
        if strategy == "fsdp":
            sharding.shard_model(model, "cuda", mixed_precision=True)
        model = model.cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        update_step(
            model, opt, mine, norm, settings, pad_id=0, device=torch.device("cuda"),
            micro_batch_size=2, max_grad_norm=1.0, world_size=world,
            fsdp=strategy == "fsdp", num_micro_batches=1,
        )  # fmt: skip
        if strategy == "fsdp":
            weights = sharding.full_state_dict(model)  # rank 0 only
        else:
            weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        result[strategy] = {k: v.float() for k, v in weights.items()}
    if rank == 0:
        r, f = result["replicate"], result["fsdp"]
        err = max(float((r[k] - f[k]).abs().max()) for k in r)
        Path(out).write_text(json.dumps({"max_abs_weight_diff": err, "world_size": world}))
    dist.destroy_process_group()


def launch(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Spawn the processes of one run, wait (bounded), collect the per-rank results."""
    import torch.multiprocessing as mp

    nprocs = run["world_size"] if run["mode"] == "dist" else 1
    run = {**run, "port": _free_port()}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ctx = mp.start_processes(
            worker, args=(run, args, tmp), nprocs=nprocs, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + args.run_timeout_s
        timed_out = False
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                timed_out = True
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                break
        per_rank = []
        for r in range(nprocs):
            f = Path(tmp, f"rank{r}.json")
            per_rank.append(json.loads(f.read_text()) if f.exists() else {"rank": r, "ok": False})
    out = {k: v for k, v in run.items() if k != "port"}
    out.update(wall_s=round(time.perf_counter() - t0, 1), timed_out=timed_out, per_rank=per_rank)
    out["ok"] = all(r.get("ok") for r in per_rank) and not timed_out
    out["oom"] = any(r.get("oom") for r in per_rank)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--configs", default="1b", help=f"comma-separated: {', '.join(CONFIGS)}")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world-size", type=int, default=0, help="nccl ranks (default: all GPUs)")
    ap.add_argument("--fake-worlds", default="", help="fake-PG fsdp world sizes (default 2,4,8 "
                    "on one GPU, none with several)")  # fmt: skip
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--run-timeout-s", type=float, default=150.0, help="per run (processes killed)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus == 0:
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    world = args.world_size or (gpus if args.device == "cuda" else 2)
    fake = [int(x) for x in args.fake_worlds.split(",") if x] or ([2, 4, 8] if world < 2 else [])
    report: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpu_mem_gib": torch.cuda.get_device_properties(0).total_memory / GIB if gpus else None,
        "device_count": gpus,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "notes": {
            "single": "replicate on one GPU: its per-rank memory at any world size",
            "dist": "real ranks, one per GPU (NCCL): memory and step time with communication",
            "fake": "rank 0 of a fake N-rank group (FakeStore): fsdp per-rank memory for N ranks; "
            "step time without communication; gathered weights are garbage, loss may be NaN",
        },
        "runs": [],
    }
    for name in args.configs.split(","):
        report["runs"].append(launch(dict(config=name, mode="single", world_size=1,
                                          strategy="replicate"), args))  # fmt: skip
        if world >= 2:
            for strategy in ("replicate", "fsdp"):
                report["runs"].append(
                    launch(
                        dict(config=name, mode="dist", world_size=world, strategy=strategy), args
                    )
                )
        for n in fake:
            report["runs"].append(
                launch(dict(config=name, mode="fake", world_size=n, strategy="fsdp"), args)
            )
        print(f"[gpu_fsdp_check] {name} done", file=sys.stderr, flush=True)
    if args.device == "cuda" and world >= 2:
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            f = os.path.join(tmp, "eq.json")
            mp.spawn(equality_worker, args=(world, _free_port(), args, f), nprocs=world)
            report["equality"] = json.loads(Path(f).read_text())
    # summary: peak memory per rank and median step time per run
    report["summary"] = [
        {
            "config": r["config"],
            "mode": r["mode"],
            "strategy": r["strategy"],
            "world_size": r["world_size"],
            "ok": r["ok"],
            "oom": r["oom"],
            "params_full": r["per_rank"][0].get("params_full"),
            "params_local_rank0": r["per_rank"][0].get("params_local"),
            "peak_gib_max_rank": max(
                (x.get("peak_gib") or 0.0 for x in r["per_rank"]), default=None
            ),
            "step_s_median_rank0": r["per_rank"][0].get("step_s_median"),
            "loss_finite": all(math.isfinite(v) for v in r["per_rank"][0].get("loss", []) or [0.0]),
        }
        for r in report["runs"]
    ]
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0 if all(r["ok"] or r["oom"] for r in report["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

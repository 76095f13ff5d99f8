"""Measure rank 0's memory for one weight push under `learner.strategy: fsdp` (issue 31).

Two gloo processes on CPU shard a tiny Llama (SmolLM2's vocabulary; hidden size x layers as given) with the
learner's own `sharding.shard_model`, then push the full weights the old way
(`sharding.full_state_dict`: every tensor gathered into one dict on rank 0) and the new way
(`sharding.write_full_weights`: one tensor at a time, written in shards of `--shard-mb`). Rank 0
samples its resident memory every millisecond during each push; the peak above the level just
before is reported, with the model's size. Prints one JSON document.

    python scripts/fsdp_push_memory.py --shapes 256x4 256x16 512x4 --shard-mb 8

The streamed push holds at most about twice the larger of one shard and the largest tensor (the
tensor being written, and safetensors' serialised copy of its file): it grows with the largest
tensor (the embedding: vocabulary x hidden), not with the number of layers, where the old gather
held the whole model.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_during(fn: Any) -> tuple[Any, int]:
    """fn()'s result and the peak RSS above the level before it (sampled every 1 ms)."""
    base = _rss()
    peak = [base]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        out = fn()
    finally:
        done.set()
        t.join()
    peak[0] = max(peak[0], _rss())
    return out, peak[0] - base


def _worker(rank: int, port: int, hidden: int, layers: int, shard_mb: int, out: Any) -> None:
    import gc

    import torch
    import torch.distributed as dist

    from sandgym.trainer import sharding
    from sandgym.trainer.config import ModelSettings
    from sandgym.trainer.models import load_model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = load_model(
        ModelSettings(source="tiny", tiny_hidden=hidden, tiny_heads=4, tiny_layers=layers)
    )
    model_bytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    sharding.shard_model(model, "cpu")
    gc.collect()
    dist.barrier()
    old, old_peak = _peak_during(lambda: sharding.full_state_dict(model))
    old_held = sum(t.numel() * t.element_size() for t in old.values()) if rank == 0 else 0
    del old
    gc.collect()
    dist.barrier()
    with tempfile.TemporaryDirectory() as d:
        new, new_peak = _peak_during(
            lambda: sharding.write_full_weights(model, d + "/w", shard_mb * 1024 * 1024)
        )
    dist.barrier()
    if rank == 0:
        out.put(
            {
                "hidden": hidden,
                "layers": layers,
                "model_mb": round(model_bytes / 2**20, 1),
                "gather_dict_held_mb": round(old_held / 2**20, 1),
                "gather_dict_peak_rss_mb": round(old_peak / 2**20, 1),
                "stream_peak_buffered_mb": round(new["peak_buffered_bytes"] / 2**20, 1),
                "stream_peak_rss_mb": round(new_peak / 2**20, 1),
                "stream_shards": new["shards"],
            }
        )
    dist.destroy_process_group()


def measure(hidden: int, layers: int, shard_mb: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, port, hidden, layers, shard_mb, q)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    row = q.get(timeout=600)
    for p in procs:
        p.join(timeout=120)
    return dict(row)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--shapes", nargs="+", default=["256x4", "256x16", "512x4"], help="HIDDENxLAYERS"
    )
    ap.add_argument("--shard-mb", type=int, default=8)
    args = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    rows = [measure(h, n, args.shard_mb) for h, n in shapes]
    print(json.dumps({"shard_mb": args.shard_mb, "world_size": 2, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Probe: the base policy's success rate per task family, to pick tasks GRPO can learn from.

    python -m lab.bench.train_probe --tasks builtin/sort-numbers builtin/count-lines --seeds 16

GRPO only learns from groups whose rewards differ, so a family the model never (or always)
solves gives no signal. This plays the real agent (`TerminalAgent` through `EpisodeRunner`, the
trainer's own code, no Ray) on a local `sandgym serve` for each task over `--seeds` seeds at
the demo config's sampling settings, and prints the success rate, the termination reasons and
a few replies, so prompts, token limits and temperatures can be compared before a long run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from sandgym.server.runner import ServerProcess
from sandgym.trainer.agents import TerminalAgent
from sandgym.trainer.config import load_config
from sandgym.trainer.engines import create_engine
from sandgym.trainer.models import load_model, load_tokenizer
from sandgym.trainer.rollout import EpisodeRunner

REPO = Path(__file__).resolve().parents[2]
#: the demo's own held-out family (`heldout-ops`): wordings no training family uses and one
#: operation none asks (lab/bench/tasks/heldout-ops; served beside the catalog)
HELDOUT_TASKS = REPO / "lab" / "bench" / "tasks"


def heldout_server() -> ServerProcess:
    """A local-backend `sandgym serve` of the catalog and the held-out family, once healthy."""
    return ServerProcess("local", args=["--tasks", str(HELDOUT_TASKS)], startup_timeout_s=120)


async def play_episodes(
    cfg: Any, jobs: list[tuple[str, int]], sample_seed: int = 0, threads: int = 1
) -> list[Any]:
    """Play one episode per (task_id, seed) with `cfg`'s model, agent and sampling settings,
    up to `engine.max_batch_size` at a time (their generations are batched together)."""
    import torch

    torch.manual_seed(sample_seed)
    # on a shared 2-core machine one intra-op thread generates ~10x faster than two (measured)
    torch.set_num_threads(threads)
    tok = load_tokenizer(cfg.model)
    engine = create_engine(
        "hf",
        model=load_model(cfg.model),
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        max_batch_size=cfg.engine.max_batch_size,
        batch_wait_s=0.05,
    )
    runner = EpisodeRunner(cfg, engine, TerminalAgent(tok, cfg.agent, cfg.sampling.max_new_tokens))
    sem = asyncio.Semaphore(cfg.engine.max_batch_size)

    async def one(task: str, seed: int) -> Any:
        async with sem:
            return await runner.run_episode(task, seed, f"probe-{task}-{seed}")

    try:
        return list(await asyncio.gather(*(one(t, s) for t, s in jobs)))
    finally:
        await engine.aclose()


def reward_stats(episodes: list[Any]) -> dict[str, Any]:
    """Mean reward with its standard error and a 95% Wilson interval of the success rate."""
    valid = [e for e in episodes if not e.is_infra_failure]
    n = len(valid)
    rewards = [e.reward for e in valid]
    mean = sum(rewards) / n if n else float("nan")
    var = sum((r - mean) ** 2 for r in rewards) / (n - 1) if n > 1 else float("nan")
    k = sum(1 for r in rewards if r >= 1.0)
    z = 1.96
    p = k / n if n else 0.0
    centre = (p + z * z / (2 * n)) / (1 + z * z / n) if n else float("nan")
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n) if n else 0.0
    terms: dict[str, int] = {}
    for e in episodes:
        terms[e.termination] = terms.get(e.termination, 0) + 1
    return {
        "mean_reward": mean,
        "stderr": math.sqrt(var / n) if n > 1 else None,
        "successes": k,
        "episodes": n,
        "infra_failures": len(episodes) - n,
        "success_ci95": [centre - half, centre + half],
        "terminations": terms,
    }


async def _probe(args: argparse.Namespace, url: str) -> dict[str, Any]:
    cfg = load_config(args.config, [f'env.server_urls=["{url}"]', *args.override])
    out: dict[str, Any] = {}
    for task in args.tasks:
        t0 = time.monotonic()
        jobs = [(task, args.seed_start + i) for i in range(args.seeds)]
        eps = await play_episodes(cfg, jobs, args.sample_seed, args.threads)
        out[task] = {
            **reward_stats(eps),
            "wall_s": time.monotonic() - t0,
            "samples": [
                {"reward": e.reward, "replies": [s.response_text for s in e.trajectories[0].steps]}
                for e in eps[: args.show]
            ],
        }
        print(json.dumps({task: out[task]}, indent=1), file=sys.stderr)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--config", default=str(REPO / "sandgym/trainer/configs/demo.yaml"))
    p.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--seed-start", type=int, default=20_000)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--show", type=int, default=4, help="replies shown per task")
    p.add_argument("--server-url")
    args = p.parse_args()
    server = None
    url = args.server_url
    if url is None:
        server = heldout_server()
        url = server.url
    try:
        result = asyncio.run(_probe(args, url))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

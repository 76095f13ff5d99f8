"""`sandgym eval`: many episodes of some tasks with one agent, and a pass@k table.

    sandgym eval --server-url ws://127.0.0.1:8765/v1/env --tasks builtin/hello-file \\
        --agent llm --attempts 4 --json

Episodes run concurrently in this process (no Ray): `noop`, `oracle` (solutions read from
`--solutions-dir`, default the built-in catalog) or `llm` (the model of `--model`, with the
terminal agent and the hf engine). Infrastructure failures are reported and left out of pass@k.
pass@k is the unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k) over the n valid
attempts of which c succeeded (reward >= --success-threshold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from math import comb
from pathlib import Path
from typing import Any

DEFAULT_CATALOG = Path(__file__).resolve().parents[1] / "tasks" / "catalog"


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Probability that at least one of k attempts drawn from n (c correct) succeeds."""
    if n < k or k < 1:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server-url", default="ws://127.0.0.1:8765/v1/env", help="env server")
    parser.add_argument("--token", help="bearer token of the env server")
    parser.add_argument(
        "--tasks", nargs="+", required=True, metavar="TASK_ID", help="task ids to evaluate"
    )
    parser.add_argument("--agent", choices=["noop", "oracle", "llm"], default="llm")
    parser.add_argument("--attempts", type=int, default=1, help="episodes per task (k max)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first attempt")
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at the same time")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--solutions-dir", default=str(DEFAULT_CATALOG))
    parser.add_argument("--success-threshold", type=float, default=1.0)
    parser.add_argument("--json", action="store_true", help="print one JSON document")


async def _evaluate(args: argparse.Namespace) -> list[Any]:
    from tqdm import tqdm

    from trainer.agents import NoopAgent, OracleAgent, TerminalAgent, solutions_from_dir
    from trainer.config import TrainConfig
    from trainer.rollout import EpisodeRunner

    cfg = TrainConfig.model_validate(
        {
            "env": {"server_urls": [args.server_url], "token": args.token, "task_ids": args.tasks},
            "model": {"source": args.model},
            "agent": {"max_turns": args.max_turns},
            "sampling": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
        }
    )
    engine = None
    agent: Any
    if args.agent == "noop":
        agent = NoopAgent()
    elif args.agent == "oracle":
        agent = OracleAgent(solutions_from_dir(args.solutions_dir))
    else:
        from trainer.engines import create_engine
        from trainer.models import load_model, load_tokenizer

        tok = await asyncio.to_thread(load_tokenizer, cfg.model)
        model = await asyncio.to_thread(load_model, cfg.model)
        engine = create_engine(
            "hf", model=model, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id
        )
        agent = TerminalAgent(tok, cfg.agent, cfg.sampling.max_new_tokens)
    runner = EpisodeRunner(cfg, engine, agent)
    sem = asyncio.Semaphore(args.concurrency)
    bar = tqdm(total=len(args.tasks) * args.attempts, desc="episodes", file=sys.stderr)

    async def one(task_id: str, seed: int) -> Any:
        async with sem:
            ep = await runner.run_episode(task_id, seed, f"{task_id}/{seed}")
        bar.update(1)
        return ep

    try:
        return list(
            await asyncio.gather(
                *(one(t, args.seed + i) for t in args.tasks for i in range(args.attempts))
            )
        )
    finally:
        bar.close()
        if engine is not None:
            await engine.aclose()


def run(args: argparse.Namespace) -> int:
    if args.attempts < 1:
        print("sandgym eval: --attempts must be at least 1", file=sys.stderr)
        return 2
    episodes = asyncio.run(_evaluate(args))
    ks = [k for k in (1, 2, 4, 8, 16) if k <= args.attempts]
    rows = []
    for task_id in args.tasks:
        eps = [e for e in episodes if e.task_id == task_id]
        valid = [e for e in eps if not e.is_infra_failure]
        c = sum(1 for e in valid if e.reward >= args.success_threshold)
        rows.append(
            {
                "task_id": task_id,
                "attempts": len(eps),
                "valid": len(valid),
                "successes": c,
                "mean_reward": sum(e.reward for e in valid) / len(valid) if valid else None,
                "rewards": [e.reward for e in eps],
                "terminations": [e.termination for e in eps],
                **{f"pass@{k}": pass_at_k(len(valid), c, k) for k in ks},
            }
        )
    valid_rewards = [e.reward for e in episodes if not e.is_infra_failure]
    result = {
        "agent": args.agent,
        "tasks": rows,
        "mean_reward": sum(valid_rewards) / len(valid_rewards) if valid_rewards else None,
        "infra_failures": sum(1 for e in episodes if e.is_infra_failure),
    }
    if args.json:
        print(json.dumps(result))
    else:
        head = f"{'task':40s} {'n':>3s} {'mean':>6s} " + " ".join(
            f"{'pass@' + str(k):>7s}" for k in ks
        )
        print(head)
        for r in rows:
            mean = "-" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}"
            cells = " ".join(
                f"{'-' if r[f'pass@{k}'] is None else format(r[f'pass@{k}'], '.3f'):>7s}"
                for k in ks
            )
            print(f"{r['task_id']:40s} {r['valid']:>3d} {mean:>6s} {cells}")
    return 0

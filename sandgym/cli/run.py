"""`sandgym run`: one episode and its record. The oracle and no-op agents are the env server's
own (`sandgym.cli.run_cli`); `--agent llm` plays the trainer's terminal agent with a model
(`sandgym.trainer.builders`), which the env server may not import, so the two meet here, on top.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from sandgym.cli import run_cli
from sandgym.tasks import TaskRegistry
from sandgym.trainer.builders import build_agent, load_engine
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.rollout import EpisodeRunner


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_cli.add_arguments(parser, agents=("oracle", "noop", "llm"))
    llm = parser.add_argument_group("--agent llm")
    llm.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    llm.add_argument("--max-turns", type=int, default=6)
    llm.add_argument("--max-new-tokens", type=int, default=128)
    llm.add_argument("--temperature", type=float, default=0.0)


def run(args: argparse.Namespace) -> int:
    if args.agent != "llm":
        return run_cli.run(args)

    TaskRegistry(args.tasks).get(args.task)  # an unknown id: one line, before a model loads
    if args.server:
        record = asyncio.run(_play_llm(args, args.server, args.token))
        record["server"] = args.server
    else:
        # lazy: every `sandgym` command builds its parser from this module; server.runner loads
        # fastapi and uvicorn: +0.19 s CPU at start-up (0.73 s without), measured
        from sandgym.server.runner import BackgroundServer

        settings = run_cli.in_process_settings(args)
        with BackgroundServer(settings) as srv:
            record = asyncio.run(_play_llm(args, srv.url, None))
        record["backend"] = settings.backend
    record["agent"] = "llm"
    if args.json:
        print(json.dumps(record))
    else:
        turns = sum(len(t["steps"]) for t in record["trajectories"])
        print(
            f"task {record['task_id']} agent llm ({args.model}): {record['termination']}, "
            f"reward {record['reward']:g} after {turns} model turns"
            + (f"; error: {record['error']}" if record["error"] else "")
        )
    return 0 if record["termination"] in ("submitted", "turn_limit", "env_truncated") else 1


async def _play_llm(args: argparse.Namespace, url: str, token: str | None) -> dict[str, Any]:
    cfg = TrainConfig.model_validate(
        {
            # verify: the server's or task's choice (refuse-tampered is the trainer's default)
            "env": {"server_urls": [url], "token": token, "task_ids": [args.task], "verify": None},
            "model": {"source": args.model},
            "agent": {"kind": "terminal", "max_turns": args.max_turns},
            "sampling": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
        }
    )
    tok, engine = await asyncio.to_thread(load_engine, cfg)
    runner: Any = EpisodeRunner(cfg, engine, build_agent(cfg, tok))
    ep = await runner.run_episode(args.task, args.seed, f"run-{args.task}")
    record = ep.to_dict(with_tokens=False)
    record["reward"] = ep.reward
    return record

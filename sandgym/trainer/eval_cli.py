"""`sandgym eval`: many episodes of some tasks with one agent, and a pass@k table.

    sandgym eval --server-url ws://127.0.0.1:8765/v1/env --tasks builtin/hello-file \\
        --agent llm --attempts 4 --json

Episodes run concurrently in this process: `noop`, `oracle` (solutions read from
`--solutions-dir`, default the built-in catalog) or `llm` (the model of `--model`, with the
terminal agent and the hf engine). Infrastructure failures are reported and left out of pass@k.
pass@k is the unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k) over the n valid
attempts of which c succeeded (reward >= --success-threshold).

The env servers: `--server-url`, and with `--ray-servers discover` those `sandgym cluster up`
placed on a Ray cluster (`--ray-address`), or with `--ray-servers place` also one started for
this run on every node offering `--server-resource` (removed at the end), as `sandgym train`
finds them (`sandgym.trainer.cluster.ray_servers`); each episode goes to the server with the fewest of
this run's episodes in flight.

Every episode is written to `--out` (JSONL, one record per episode). `--select pairwise` adds
best-of-K selection by pairwise self-verification (`sandgym.trainer.selection`): the model (`--model`,
or `--judge-model` for the oracle/noop agents) compares candidates head to head in a knockout of
K-1 comparisons (2(K-1) model calls with the order-swap check), and the report gives the
selected candidate's success rate ("selected") beside pass@1 and pass@K.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from math import comb
from pathlib import Path
from typing import Any

from sandgym.client.env_client import AsyncEnvClient
from sandgym.client.fleet import parse_fleet, ws_url_of
from sandgym.trainer.builders import build_agent, load_engine, uses_model
from sandgym.trainer.cluster import NAMESPACE, ClusterError, ray_servers
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.episode import EpisodeWriter
from sandgym.trainer.rollout import EpisodeRunner
from sandgym.trainer.selection import PairwiseJudge

DEFAULT_CATALOG = Path(__file__).resolve().parents[1] / "tasks" / "catalog"
DEFAULT_SERVER = "ws://127.0.0.1:8765/v1/env"


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Probability that at least one of k attempts drawn from n (c correct) succeeds."""
    if n < k or k < 1:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server-url",
        help=f"env server (default {DEFAULT_SERVER}, unless --ray-servers finds servers), or "
        "a fleet: a comma-separated list of servers, or ray:ADDRESS (cluster up's servers)",
    )
    parser.add_argument(
        "--ray-servers",
        choices=["off", "place", "discover"],
        default="off",
        help="env servers through Ray, as `env.ray_servers` of train (sandgym/trainer/cluster.py): "
        "discover = those `sandgym cluster up` placed; place = also start one on every node "
        "offering --server-resource for this run; episodes go to the least busy",
    )
    parser.add_argument(
        "--ray-address", default="auto", help="Ray cluster of --ray-servers (default: auto)"
    )
    parser.add_argument(
        "--server-resource", default="sandgym", help="the Ray node resource of --ray-servers"
    )
    parser.add_argument(
        "--server-backend",
        choices=["local", "docker", "e2b", "null"],
        default="local",
        help="--ray-servers place: sandbox backend of the servers it starts",
    )
    parser.add_argument("--token", help="bearer token of the env server")
    parser.add_argument(
        "--tasks", nargs="+", required=True, metavar="TASK_ID", help="task ids to evaluate"
    )
    parser.add_argument(
        "--agent",
        choices=["noop", "oracle", "llm", "harness"],
        default="llm",
        help="harness: the ReAct CLI agent inside the sandbox, its model behind the gateway "
        "(local backend, server on this host)",
    )
    parser.add_argument("--attempts", type=int, default=1, help="episodes per task (k max)")
    parser.add_argument("--seed", type=int, default=0, help="task seed (of the first attempt)")
    parser.add_argument(
        "--seed-mode",
        choices=["same", "distinct"],
        default="same",
        help="same: the K attempts of a task share --seed (one instance of a procedural task, "
        "attempts differ by sampling: what pass@k assumes); distinct: attempt i uses seed+i",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="episodes at the same time")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--solutions-dir", default=str(DEFAULT_CATALOG))
    parser.add_argument("--success-threshold", type=float, default=1.0)
    parser.add_argument(
        "--select",
        choices=["none", "pairwise"],
        default="none",
        help="best-of-K selection: pairwise self-verification knockout over the K attempts",
    )
    parser.add_argument(
        "--judge-model",
        choices=["smollm2", "tiny"],
        help="judge for --select pairwise (default: --model)",
    )
    parser.add_argument(
        "--no-swap", action="store_true", help="judge each pair once (no order-swap check)"
    )
    parser.add_argument("--out", help="episodes JSONL (default runs/eval/episodes-<time>.jsonl)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


#: `--agent` -> `agent.kind` of the config the agent and engine are built from
AGENT_KINDS = {"noop": "noop", "oracle": "oracle", "llm": "terminal", "harness": "harness"}


def eval_config(args: argparse.Namespace, server_urls: list[str]) -> Any:
    """The `TrainConfig` this evaluation's agent and engine are built from (sandgym.trainer.builders)."""

    return TrainConfig.model_validate(
        {
            # verify: the server's or task's choice (refuse-tampered is the trainer's default)
            "env": {
                "server_urls": server_urls,
                "token": args.token,
                "task_ids": args.tasks,
                "verify": None,
            },
            "model": {"source": args.model},
            "agent": {
                "kind": AGENT_KINDS[args.agent],
                "solutions_dir": args.solutions_dir,
                "max_turns": args.max_turns,
            },
            "sampling": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
        }
    )


class EvalError(RuntimeError):
    """The evaluation cannot start (no env server to run episodes on)."""


def check_task_ids(urls: list[str], task_ids: list[str], token: str | None) -> None:
    """Refuse task ids some server does not serve, before any episode runs (a typo would
    otherwise give one unknown_task error per attempt and an empty table)."""
    import difflib
    from urllib.parse import urlsplit, urlunsplit

    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for url in urls:
        parts = urlsplit(url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        tasks_url = urlunsplit((scheme, parts.netloc, "/v1/tasks", "", ""))
        try:
            reply = httpx.get(tasks_url, headers=headers, timeout=30)
            reply.raise_for_status()
            served = set(reply.json()["tasks"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise EvalError(
                f"could not list the tasks of the env server {url} ({tasks_url}): {exc}; "
                "expected a running `sandgym serve` (and --token if it has one)"
            ) from exc
        unknown = [t for t in task_ids if t not in served]
        if unknown:
            hints = {t: difflib.get_close_matches(t, sorted(served), n=3) for t in unknown}
            said = "; ".join(
                f"{t!r}" + (f" (did you mean {', '.join(h)}?)" if h else "")
                for t, h in hints.items()
            )
            raise EvalError(
                f"unknown task id {said}: the env server {url} serves {len(served)} tasks "
                "(`sandgym tasks list` names them)"
            )


def server_urls(args: argparse.Namespace) -> tuple[list[str], Any]:
    """(the env servers' URLs, the fleet this run placed or None): `--server-url`, and with
    `--ray-servers` those found (or placed) through Ray (initialised by the caller)."""
    urls = [ws_url_of(u) for u in parse_fleet(args.server_url)] if args.server_url else []
    if args.ray_servers == "off":
        return urls or [DEFAULT_SERVER], None

    settings = {"backend": args.server_backend}
    fleet, found = ray_servers(args.ray_servers, args.server_resource, settings)
    urls += [info.url for info in found if info.url not in urls]
    if not urls:
        raise EvalError(
            f"--ray-servers {args.ray_servers}: no env server found through Ray at "
            f"{args.ray_address} (expected servers placed by `sandgym cluster up`, or nodes "
            f"offering the {args.server_resource!r} resource with --ray-servers place)"
        )
    return urls, fleet


async def _evaluate(args: argparse.Namespace, urls: list[str]) -> tuple[list[Any], dict[str, Any]]:
    import itertools

    from tqdm import tqdm

    cfg = eval_config(args, urls)
    engine = None
    tok = None
    if uses_model(cfg):
        tok, engine = await asyncio.to_thread(load_engine, cfg)
    agent: Any = build_agent(cfg, tok)
    runner: Any = EpisodeRunner(cfg, engine, agent)
    gateway_server = None
    if args.agent == "harness" and engine is not None:  # (harness uses the model: engine set)
        # lazy: every `sandgym` command builds its parser from this module; the gateway and the
        # harness load fastapi: +0.14 s CPU at start-up, measured
        from sandgym.trainer.gateway import CallStore, GatewayServer, ModelGateway
        from sandgym.trainer.harness import HarnessRunner

        store_path = Path(args.out or "runs/eval/episodes.jsonl").with_suffix(".gateway.sqlite")
        gateway = ModelGateway([engine], tok, CallStore(store_path))
        gateway_server = await GatewayServer(gateway).__aenter__()
        runner = HarnessRunner(
            gateway,
            gateway_server.root,
            lambda servers=itertools.cycle(urls): AsyncEnvClient(next(servers), token=args.token),
            max_turns=args.max_turns,
            max_tokens=args.max_new_tokens,
            temperature=args.temperature,
        )
    sem = asyncio.Semaphore(args.concurrency)
    bar = tqdm(total=len(args.tasks) * args.attempts, desc="episodes", file=sys.stderr)

    async def one(task_id: str, attempt: int) -> Any:
        seed = args.seed + (attempt if args.seed_mode == "distinct" else 0)
        async with sem:
            ep = await runner.run_episode(task_id, seed, f"{task_id}/{seed}/{attempt}")
        ep.metrics["attempt"] = float(attempt)
        bar.update(1)
        return ep

    judge_engine: Any = None
    try:
        episodes = list(
            await asyncio.gather(*(one(t, i) for t in args.tasks for i in range(args.attempts)))
        )
        bar.close()
        selections: dict[str, Any] = {}
        if args.select == "pairwise":
            judge_source = args.judge_model or args.model
            if engine is not None and judge_source == args.model:
                judge = PairwiseJudge(engine, tok, swap=not args.no_swap)
            else:  # the judge's own model
                judge_cfg = cfg.model_copy(
                    update={"model": cfg.model.model_copy(update={"source": judge_source})}
                )
                judge_tok, judge_engine = await asyncio.to_thread(load_engine, judge_cfg)
                judge = PairwiseJudge(judge_engine, judge_tok, swap=not args.no_swap)
            sbar = tqdm(total=len(args.tasks), desc="pairwise selection", file=sys.stderr)

            async def select(task_id: str) -> None:
                cands = [e for e in episodes if e.task_id == task_id and not e.is_infra_failure]
                if not cands:
                    selections[task_id] = None
                    return
                instruction = cands[0].instruction or task_id
                idx, comps = await judge.select(instruction, cands)
                selections[task_id] = {
                    "selected_attempt": int(cands[idx].metrics["attempt"]),
                    "selected_reward": cands[idx].reward,
                    "comparisons": len(comps),
                    "judge_calls": sum(len(c.replies) for c in comps),
                    "bracket": [
                        {
                            "a": int(cands[c.a].metrics["attempt"]),
                            "b": int(cands[c.b].metrics["attempt"]),
                            "winner": int(cands[c.winner].metrics["attempt"]),
                            "replies": c.replies,
                        }
                        for c in comps
                    ],
                }
                sbar.update(1)

            # tasks judged concurrently: the engine batches their comparisons together
            await asyncio.gather(*(select(t) for t in args.tasks))
            sbar.close()
        return episodes, selections
    finally:
        bar.close()
        if gateway_server is not None:
            await gateway_server.__aexit__(None, None, None)
        if engine is not None:
            await engine.aclose()
        if judge_engine is not None and judge_engine is not engine:
            await judge_engine.aclose()


def run(args: argparse.Namespace) -> int:
    if args.attempts < 1:
        print("sandgym eval: --attempts must be at least 1", file=sys.stderr)
        return 2
    if args.select == "pairwise" and args.agent not in ("llm", "harness") and not args.judge_model:
        print(
            "sandgym eval: --select pairwise with a non-llm agent needs --judge-model",
            file=sys.stderr,
        )
        return 2

    ray_started = False
    fleet = None
    try:
        try:
            if args.ray_servers != "off":
                import ray

                if not ray.is_initialized():
                    ray.init(address=args.ray_address, namespace=NAMESPACE, log_to_driver=False)
                    ray_started = True
            urls, fleet = server_urls(args)
            check_task_ids(urls, args.tasks, args.token)
        except (EvalError, ClusterError, ConnectionError) as exc:  # no servers, no Ray cluster
            print(f"sandgym eval: {exc}", file=sys.stderr)
            return 2
        episodes, selections = asyncio.run(_evaluate(args, urls))
    finally:
        if fleet is not None:
            fleet.stop()
        if ray_started:
            ray.shutdown()
    out = Path(args.out) if args.out else Path("runs/eval") / f"episodes-{int(time.time())}.jsonl"
    writer = EpisodeWriter(out, with_tokens=False)
    for ep in episodes:
        writer.write(ep, success=ep.reward >= args.success_threshold)
    writer.close()
    ks = sorted({k for k in (1, 2, 4, 8, 16) if k <= args.attempts} | {args.attempts})
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
        if args.select == "pairwise":
            sel = selections.get(task_id)
            rows[-1]["selection"] = sel
            rows[-1]["selected"] = (
                None if sel is None else float(sel["selected_reward"] >= args.success_threshold)
            )
    valid_rewards = [e.reward for e in episodes if not e.is_infra_failure]
    result = {
        "agent": args.agent,
        "tasks": rows,
        "mean_reward": sum(valid_rewards) / len(valid_rewards) if valid_rewards else None,
        "infra_failures": sum(1 for e in episodes if e.is_infra_failure),
        "episodes_path": str(out),
        "attempts": args.attempts,
        "select": args.select,
    }
    # macro averages over tasks (a task with no valid attempt has no pass@k and is left out)
    for key in [f"pass@{k}" for k in ks] + (["selected"] if args.select == "pairwise" else []):
        vals = [r[key] for r in rows if r.get(key) is not None]
        result[key] = sum(vals) / len(vals) if vals else None
    if args.json:
        print(json.dumps(result))
    else:
        cols = [f"pass@{k}" for k in ks] + (["selected"] if args.select == "pairwise" else [])
        head = f"{'task':40s} {'n':>3s} {'mean':>6s} " + " ".join(f"{c:>8s}" for c in cols)
        print(head)

        def cell(v: Any) -> str:
            return f"{'-' if v is None else format(v, '.3f'):>8s}"

        for r in rows:
            mean = "-" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}"
            cells = " ".join(cell(r.get(c)) for c in cols)
            print(f"{r['task_id']:40s} {r['valid']:>3d} {mean:>6s} {cells}")
        print(
            f"{'(mean over tasks)':40s} {'':>3s} {'':>6s} "
            + " ".join(cell(result[c]) for c in cols)
        )
        print(f"episodes written to {out}", file=sys.stderr)
    return 0

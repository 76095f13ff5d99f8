"""`sandgym runs cost RUN_DIR`: what a run cost, from the cost ledger in its episode records.

Each line of `RUN_DIR/episodes.jsonl` carries `cost` (the server's ledger, `info.cost`: sandbox
seconds by phase, CPU seconds, peak memory, bytes written, commands; plus the tokens generated
and trained on). This sums them per advantage group, per update (`received_at_version`, the
learner's update count when the episode arrived) and for the run, prints a table (or one JSON
document with `--json`) and draws sandbox seconds by phase and tokens per update into a PNG.

Money only where the user gives prices (`--prices FILE` or `RUN_DIR/prices.yaml`, YAML or
JSON), nothing invented:

    sandbox_second: {docker: 0.00001, e2b: 0.000028}   # per sandbox-second, per backend
    cpu_second: 0.00002                                  # per CPU second of the sandboxes
    token_generated: 0.0000002                           # per token the policy generated
    token_trained: 0.0000001                             # per token trained on

An item without a price is left out of the money, and the output says which were.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from sandgym.trainer.episode import read_episodes

#: summed fields of the ledger (peak memory is a maximum)
SUMMED = (
    "pool_s",
    "prepare_s",
    "agent_s",
    "verifier_s",
    "sandbox_s",
    "cpu_s",
    "bytes_written",
    "commands",
    "tokens_generated",
    "tokens_trained",
)
PHASES = ("pool_s", "prepare_s", "agent_s", "verifier_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="runs_command", metavar="SUBCOMMAND", required=True)
    cost = sub.add_parser("cost", help="what a run cost", description=__doc__.split("\n\n")[0])
    cost.add_argument("run_dir", help="a run directory written by `sandgym train`")
    cost.add_argument("--prices", help="price table (YAML/JSON; default RUN_DIR/prices.yaml)")
    cost.add_argument("--out", help="PNG path (default RUN_DIR/cost.png)")
    cost.add_argument("--json", action="store_true", help="print one JSON document")


def _zero() -> dict[str, Any]:
    return {**{k: 0.0 for k in SUMMED}, "peak_memory_bytes": 0, "episodes": 0, "unmetered": 0}


def _add(total: dict[str, Any], cost: dict[str, Any]) -> None:
    total["episodes"] += 1
    if "sandbox_s" not in cost:  # no server ledger (an old server, or the reset failed)
        total["unmetered"] += 1
    for key in SUMMED:
        value = cost.get(key)
        if isinstance(value, int | float):
            total[key] += value
    peak = cost.get("peak_memory_bytes")
    if isinstance(peak, int | float):
        total["peak_memory_bytes"] = max(total["peak_memory_bytes"], int(peak))


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums per group, per update and for the run (see the module docstring)."""
    run = _zero()
    by_update: dict[int, dict[str, Any]] = defaultdict(_zero)
    by_group: dict[str, dict[str, Any]] = defaultdict(_zero)
    backend_s: dict[str, float] = defaultdict(float)
    for rec in records:
        cost = rec.get("cost") or {}
        _add(run, cost)
        _add(by_update[int(rec.get("received_at_version", 0))], cost)
        _add(by_group[str(rec.get("group_id", ""))], cost)
        if isinstance(cost.get("sandbox_s"), int | float):
            backend_s[str(cost.get("backend") or "?")] += float(cost["sandbox_s"])
    return {
        "run": run,
        "sandbox_s_by_backend": dict(backend_s),
        "updates": [{"update": k, **v} for k, v in sorted(by_update.items())],
        "groups": [{"group_id": k, **v} for k, v in by_group.items()],
    }


def load_prices(path: Path | None) -> dict[str, Any]:
    """The price table, {} without one."""
    if path is None or not path.exists():
        return {}
    import yaml

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping in the price table {path}, found {type(data)}")
    return data


def money(summary: dict[str, Any], prices: dict[str, Any]) -> dict[str, Any]:
    """Money for the priced items only: {items: {name: amount}, total, unpriced: [...]}."""
    items: dict[str, float] = {}
    unpriced: list[str] = []
    per_backend = prices.get("sandbox_second") or {}
    for backend, seconds in summary["sandbox_s_by_backend"].items():
        if backend in per_backend:
            items[f"sandbox_seconds[{backend}]"] = seconds * float(per_backend[backend])
        elif seconds:
            unpriced.append(f"sandbox_seconds[{backend}]")
    run = summary["run"]
    for name, key in (
        ("cpu_second", "cpu_s"),
        ("token_generated", "tokens_generated"),
        ("token_trained", "tokens_trained"),
    ):
        if name in prices:
            items[name] = run[key] * float(prices[name])
        elif run[key]:
            unpriced.append(name)
    return {"items": items, "total": sum(items.values()), "unpriced": unpriced}


def plot(summary: dict[str, Any], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ups = summary["updates"]
    xs = [u["update"] for u in ups]
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(xs)
    for phase in PHASES:
        ys = [u[phase] for u in ups]
        ax.bar(xs, ys, bottom=bottom, label=phase.removesuffix("_s"))
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.set_xlabel("update (the learner's version when the episode arrived)")
    ax.set_ylabel("sandbox seconds")
    tokens = ax.twinx()
    tokens.plot(xs, [u["tokens_generated"] for u in ups], "k.-", label="tokens generated")
    tokens.set_ylabel("tokens generated")
    ax.legend(loc="upper left")
    ax.set_title(f"sandgym cost: {title}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    path = run_dir / "episodes.jsonl"
    if not path.exists():
        print(f"sandgym runs cost: {run_dir} has no episodes.jsonl", file=sys.stderr)
        return 2
    summary = summarize(read_episodes(path))
    prices_path = Path(args.prices) if args.prices else run_dir / "prices.yaml"
    if args.prices and not prices_path.exists():
        print(f"sandgym runs cost: no price table at {prices_path}", file=sys.stderr)
        return 2
    prices = load_prices(prices_path)
    summary["money"] = money(summary, prices) if prices else None
    out = Path(args.out) if args.out else run_dir / "cost.png"
    plot(summary, out, run_dir.name)
    summary["png"] = str(out)
    if args.json:
        print(json.dumps(summary))
        return 0
    cols = ("update", "episodes", *PHASES, "cpu_s", "commands", "tokens_generated")
    print("  ".join(f"{c:>16}" for c in cols))
    for row in [*summary["updates"], {"update": "run", **summary["run"]}]:
        cells = [row[c] if isinstance(row[c], str) else f"{row[c]:.6g}" for c in cols]
        print("  ".join(f"{c:>16}" for c in cells))
    r = summary["run"]
    print(
        f"peak memory {r['peak_memory_bytes'] / 2**20:.1f} MiB, {r['bytes_written'] / 2**20:.1f} "
        f"MiB written, {int(r['tokens_trained'])} tokens trained on, "
        f"{r['unmetered']} episodes without a ledger"
    )
    if summary["money"] is not None:
        m = summary["money"]
        items = ", ".join(f"{k} {v:.4f}" for k, v in m["items"].items())
        unpriced = f" (no price for: {', '.join(m['unpriced'])})" if m["unpriced"] else ""
        print(f"money: {m['total']:.4f} = {items}{unpriced}")
    print(f"wrote {out}", file=sys.stderr)
    return 0

"""`sandgym bench NAME`: dispatch to the benchmark modules of this package.

Each benchmark module (`bench/<name>.py`) exposes `add_arguments(parser)` and `run(args) -> int`,
prints one JSON document with `--json`, and writes `bench/results/<file>.json` with `--out`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHES: dict[str, str] = {
    "sandbox": "bench.sandbox",
    "pool": "bench.pool",
    "step": "bench.step",
    "sessions": "bench.sessions",
    "harbor_compat": "bench.harbor_compat",
    "harbor_provider": "bench.harbor_provider",
    "reliability": "bench.reliability",
    "group": "bench.group",
    "cluster": "bench.cluster",
    "openai_llamacpp": "bench.openai_llamacpp",
    "vllm_cpu_push": "bench.vllm_cpu_push",
    "canaries": "bench.canaries",
    "compat_replication": "bench.compat_replication",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, module in BENCHES.items():
        p = sub.add_parser(name, help=f"the {name} benchmark")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            p.set_defaults(_bench_unavailable=name)
            continue
        mod.add_arguments(p)
        p.set_defaults(_bench_run=mod.run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_bench_unavailable", None):
        print(f"sandgym bench {args._bench_unavailable}: not yet available", file=sys.stderr)
        return 3
    from bench.report import start_run

    start_run()
    return int(args._bench_run(args) or 0)

"""`sandgym bench NAME`: dispatch to the benchmark modules of this package.

Each benchmark module (`lab/bench/<name>.py`) exposes `add_arguments(parser)` and `run(args) -> int`,
prints one JSON document with `--json`, and writes `lab/bench/results/<file>.json` with `--out`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHES: dict[str, str] = {
    "sandbox": "lab.bench.sandbox",
    "pool": "lab.bench.pool",
    "step": "lab.bench.step",
    "sessions": "lab.bench.sessions",
    "harbor_compat": "lab.bench.harbor_compat",
    "harbor_provider": "lab.bench.harbor_provider",
    "reliability": "lab.bench.reliability",
    "group": "lab.bench.group",
    "cluster": "lab.bench.cluster",
    "openai_llamacpp": "lab.bench.openai_llamacpp",
    "vllm_cpu_push": "lab.bench.vllm_cpu_push",
    "canaries": "lab.bench.canaries",
    "compat_replication": "lab.bench.compat_replication",
    "host_scale": "lab.bench.host_scale",
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
    from lab.bench.report import start_run

    start_run()
    return int(args._bench_run(args) or 0)

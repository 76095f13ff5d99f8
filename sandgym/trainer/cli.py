"""`sandgym train CONFIG [--override k=v]...`: validate a YAML config and run the trainer."""

from __future__ import annotations

import argparse
import json
import sys

from sandgym.trainer.config import ConfigError, describe_fields, load_config
from sandgym.trainer.train import Trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", help="YAML trainer config (sandgym/trainer/configs/*.yaml)"
    )
    parser.add_argument(
        "--override",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config field by dotted path, e.g. algorithm.estimator=rloo (repeatable)",
    )
    parser.add_argument("--run-dir", help="run directory (default: run.output_dir/run.name)")
    parser.add_argument(
        "--help-config", action="store_true", help="list every config field with its description"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and print the resolved config, then exit"
    )
    parser.add_argument("--json", action="store_true", help="print the run summary as JSON")


def run(args: argparse.Namespace) -> int:
    if args.help_config:
        print("\n".join(describe_fields()))
        return 0
    if not args.config:
        print(
            "sandgym train: a CONFIG file is required (see sandgym/trainer/configs/)",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = load_config(args.config, args.override)
    except (ConfigError, OSError) as exc:
        print(f"sandgym train: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(cfg.model_dump(mode="json"), indent=None if args.json else 2))
        return 0

    trainer = Trainer(cfg, args.run_dir)
    try:
        summary = trainer.run()
    finally:
        trainer.shutdown()
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"run directory: {summary['run_dir']}", file=sys.stderr)
        print(json.dumps(summary, indent=2), file=sys.stderr)
    return 0

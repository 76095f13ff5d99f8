"""`sandgym reap`: remove sandboxes that a crashed or expired owner left behind.

    sandgym reap [--backend all|docker|local|e2b] [--all] [--images] [--json]

By default only orphans go (lease expired, or owner process on this host dead); `--all` removes
every sandgym-managed sandbox, including those of live servers. With `--json` it prints
`{"removed":[{"backend":..,"id":..}], "errors":[{"backend":..,"id":..,"error":..}]}`.
Exit status: 0 when nothing failed, 1 when some removal failed or a backend was unreachable
(a backend explicitly asked for), 0 with `--backend all` when a backend is merely not present.
`all` covers E2B only when `E2B_API_KEY` is set. `--images` also removes the Docker images built
from task build contexts (`sandgym/ctx:*`) that no container uses; they are rebuilt when needed.
On a Docker engine on btrfs, reaping docker then clears the qgroups that removed layers left
(sandgym/sandboxes/qgroups.py; root only), saying so on stderr; that never changes the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from sandgym.sandboxes.qgroups import clear_docker_stale
from sandgym.sandboxes.reaper import BACKENDS, default_backends, reap


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=["all", *BACKENDS],
        default="all",
        help="which backend to reap (default: all)",
    )
    parser.add_argument(
        "--all",
        dest="everything",
        action="store_true",
        help="remove every sandgym sandbox, not only orphans (live servers lose theirs)",
    )
    parser.add_argument(
        "--images",
        action="store_true",
        help="docker: also remove task-context images (sandgym/ctx:*) no container uses",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    backends = default_backends() if args.backend == "all" else [args.backend]
    report = asyncio.run(reap(backends, everything=args.everything, images=args.images))
    doc = report.to_json()
    if args.json:
        print(json.dumps(doc))
    else:
        for r in report.removed:
            print(f"removed {r['backend']} {r['id']}")
        for e in report.errors:
            print(f"error   {e['backend']} {e['id'] or '-'}: {e['error']}", file=sys.stderr)
        if not report.removed:
            print("nothing to reap")
    if "docker" in backends:
        print(clear_docker_stale(), file=sys.stderr)
    # An unreachable backend counts as a failure only when it was asked for by name.
    failures = [e for e in report.errors if e["id"] or args.backend != "all"]
    return 1 if failures else 0

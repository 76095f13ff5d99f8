"""`sandgym cluster up|list|down`: env servers on a Ray cluster, without a trainer.

- `up` places one env server on every Ray node that offers the resource (`ray start ...
  --resources '{"sandgym": 1}'`), each on that node's backend, prints their URLs and then keeps
  them (placing one on each node that joins or comes back) until SIGINT/SIGTERM, when it drains
  and removes them; with `--detach` it returns at once and the servers stay (`down` removes
  them). A trainer with `env.ray_servers: discover` (or `place`) finds them through Ray; eval
  takes their URLs from `list`.
- `list` prints the live servers (`--json`: `{"servers": [{url, node_id, node_ip, ...}]}`).
- `down` drains and removes every server placed in the namespace.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from sandgym.trainer.cluster import (
    NAMESPACE,
    ClusterError,
    EnvServerFleet,
    discover_servers,
    remove_servers,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "list", "down"])
    parser.add_argument(
        "--address", default="auto", help="Ray cluster address (default: auto, the local one)"
    )
    parser.add_argument("--resource", default="sandgym", help="the node resource to look for")
    parser.add_argument("--backend", default="local", help="sandbox backend of the servers")
    parser.add_argument("--host", help="listen address (default: the node's; 0.0.0.0 in Docker)")
    parser.add_argument("--port", type=int, default=0, help="port on each node (0 = any free)")
    parser.add_argument("--pool-size", type=int, help="ready sandboxes kept per task environment")
    parser.add_argument("--max-sessions", type=int, help="live episodes per server at most")
    parser.add_argument("--tasks", action="append", metavar="DIR", help="extra task directory")
    parser.add_argument("--token", help="bearer token the servers require")
    parser.add_argument(
        "--detach", action="store_true", help="up: return; the servers outlive this command"
    )
    parser.add_argument(
        "--refresh-s", type=float, default=5.0, help="up: how often to look for new nodes"
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=300.0,
        help="up: how long to wait for a first node offering the resource (nodes join late)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": args.backend, "port": args.port}
    for key in ("host", "pool_size", "max_sessions", "token"):
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    if args.tasks:
        out["task_dirs"] = list(args.tasks)
    return out


def _print(args: argparse.Namespace, servers: list[Any], note: str = "") -> None:
    if args.json:
        print(json.dumps({"servers": [asdict(s) for s in servers]}), flush=True)
        return
    for s in servers:
        print(f"{s.url}\tnode {s.node_id[:12]} ({s.node_ip})\t{s.backend}", flush=True)
    if note:
        print(note, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import ray

    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        if args.action == "list":
            _print(args, discover_servers())
            return 0
        if args.action == "down":
            names = remove_servers()
            print(json.dumps({"removed": names}) if args.json else f"removed {len(names)}")
            return 0
        fleet = EnvServerFleet(_settings(args), resource=args.resource, detached=args.detach)
        deadline = time.monotonic() + args.wait_s
        while True:
            try:
                servers = fleet.start()
                break
            except ClusterError as exc:
                if time.monotonic() > deadline:
                    print(f"sandgym cluster up: {exc}", file=sys.stderr)
                    return 1
                time.sleep(min(2.0, args.refresh_s))
        _print(args, servers, "" if args.detach else "serving; Ctrl-C drains and removes them")
        if args.detach:
            return 0
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            while not stop.wait(args.refresh_s):
                started, lost = fleet.refresh()
                for s in started:
                    print(f"+ {s.url}\tnode {s.node_id[:12]}", file=sys.stderr, flush=True)
                for s in lost:
                    print(f"- {s.url}\tnode {s.node_id[:12]} is gone", file=sys.stderr, flush=True)
        finally:
            fleet.stop()
        return 0
    finally:
        ray.shutdown()

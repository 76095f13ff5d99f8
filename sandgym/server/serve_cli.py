"""`sandgym serve`: run the env server in the foreground under uvicorn.

Flags override `SANDGYM_*` environment variables, which override `ServerSettings` defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sandgym.server.settings import ServerSettings


def _image_map_item(text: str) -> tuple[str, str]:
    src, sep, dst = text.partition("=")
    if not sep or not src or not dst:
        raise argparse.ArgumentTypeError(f"expected FROM=TO (an image mapping), got {text!r}")
    return src, dst


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default 8765; 0 = any free port)")
    parser.add_argument(
        "--backend",
        choices=["local", "docker", "e2b", "null"],
        help="sandbox backend (default local)",
    )
    parser.add_argument("--pool-size", type=int, help="ready sandboxes kept per task environment")
    parser.add_argument("--max-sessions", type=int, help="live episodes at most")
    parser.add_argument(
        "--openenv-max-concurrent-envs",
        type=int,
        help="OpenEnv wire sockets (/openenv/ws) open at once (default: --max-sessions)",
    )
    parser.add_argument(
        "--tasks",
        action="append",
        type=Path,
        metavar="DIR",
        help="extra task directory (repeatable)",
    )
    parser.add_argument("--token", help="bearer token required on every endpoint but /healthz")
    parser.add_argument(
        "--image-map",
        action="append",
        type=_image_map_item,
        metavar="FROM=TO",
        help="use image TO wherever a task names FROM (repeatable)",
    )
    parser.add_argument(
        "--network-ceiling",
        metavar="POLICY",
        help="the most open network any episode gets, whatever its task says: 'no-network', "
        "'allowlist:HOST,...' or 'public' (default: each task's own; see info.network)",
    )
    parser.add_argument(
        "--verifier-stop-agent-processes",
        action="store_true",
        default=None,
        help="e2b: kill what the agent left running before the tests (no daemon can race the "
        "reward file; tasks whose tests need the agent's services then fail); local and docker "
        "run the verifier out of the agent's reach and ignore it",
    )


def settings_from_args(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    for flag, key in (
        ("host", "host"),
        ("port", "port"),
        ("backend", "backend"),
        ("pool_size", "pool_size"),
        ("max_sessions", "max_sessions"),
        ("openenv_max_concurrent_envs", "openenv_max_concurrent_envs"),
        ("token", "token"),
        ("network_ceiling", "network_ceiling"),
        ("verifier_stop_agent_processes", "verifier_stop_agent_processes"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    if getattr(args, "tasks", None):
        overrides["task_dirs"] = list(args.tasks)
    if getattr(args, "image_map", None):
        overrides["image_map"] = dict(args.image_map)
    return ServerSettings(**overrides)


def run(args: argparse.Namespace) -> int:
    import sys

    # lazy: every `sandgym` command builds its parser from this module; server.runner loads
    # fastapi and uvicorn: +0.19 s CPU at start-up (0.73 s without), measured
    from sandgym.server.runner import serve_forever

    settings = settings_from_args(args)
    try:
        serve_forever(settings)
    except OSError as exc:  # the port is taken, the host is not ours, ...
        print(
            f"sandgym serve: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    except RuntimeError as exc:  # startup failed (bad task dir, backend unavailable): logged above
        print(f"sandgym serve: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    from sandgym.server.standalone import run_module

    sys.exit(run_module("sandgym serve", sys.modules[__name__], sys.argv[1:]))

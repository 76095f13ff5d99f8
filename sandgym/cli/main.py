"""The `sandgym` command line: one argparse tree, each subcommand delegating to its package.

It lives in its own top-level package because it names every package (envserver, tasks,
sandboxes, trainer, bench); no one of those imports it, so `envserver` names neither `trainer`
nor `bench`. Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`;
modules are imported by name as the parser is built, never at import time of this module.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sandgym.server.standalone import configure_logging


def user_errors() -> tuple[type[Exception], ...]:
    """Errors a user's input can cause (an unknown task id, a bad task directory, a backend that
    is not installed): printed as one line with exit code 2; anything else is a bug and keeps its
    traceback. Imported when a command runs: they live in the server's packages, which a client
    install (`pip install sandgym`) lacks the dependencies of."""
    # lazy: a client install lacks the server's dependencies (ModuleNotFoundError, which main()
    # turns into the extra to install)
    from sandgym.sandboxes.errors import SandboxError
    from sandgym.server.errors import EnvServerError
    from sandgym.tasks.errors import TaskError

    return (TaskError, SandboxError, EnvServerError)


#: subcommand -> the extra whose dependencies it needs (the rest: the server's)
EXTRAS = {
    "train": "train",
    "cluster": "train",
    "plot": "train",
    "runs": "train",
    "eval": "train",
}

#: subcommand -> (module exposing add_arguments/run, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("sandgym.server.serve_cli", "run the env server"),
    "tasks": ("sandgym.tasks.cli", "list and check tasks"),
    "run": ("sandgym.cli.run", "play one episode and print its record"),
    "eval": ("sandgym.trainer.eval_cli", "many episodes, pass@k table"),
    "train": ("sandgym.trainer.cli", "the RL trainer"),
    "cluster": (
        "sandgym.trainer.cluster_cli",
        "env servers on every sandgym node of a Ray cluster",
    ),
    "route": (
        "sandgym.integrations.openenv_router",
        "OpenEnv's wire (/openenv) for a fleet of servers, behind one address",
    ),
    "plot": ("sandgym.trainer.plot_cli", "plot a run's reward curve"),
    "runs": (
        "sandgym.trainer.runs_cli",
        "what a run cost: `runs cost RUN_DIR` (table, PNG, --json)",
    ),
    "bench": ("lab.bench.cli", "benchmarks (sandbox, pool, step, sessions)"),
    "reap": ("sandgym.sandboxes.reaper_cli", "remove orphaned sandboxes"),
    "images": ("lab.images_cli", "build and list the offline stand-in images"),
}


def _load(module: str):  # type: ignore[no-untyped-def]
    """(the subcommand's module, None), or (None, the missing module's name) where it is not in
    this install: the module itself is missing (lab/: a source checkout only), or a dependency
    outside sandgym (an extra this install lacks)."""
    try:
        return importlib.import_module(module), None
    except ModuleNotFoundError as exc:
        if exc.name and (module.startswith(exc.name) or not _ours(exc.name)):
            return None, exc.name
        raise


def _ours(name: str) -> bool:
    return name.partition(".")[0] in ("sandgym", "lab")


def _unavailable(command: str, missing: str | None) -> str:
    """The one line printed for a subcommand this install cannot run."""
    module = COMMANDS[command][0]
    if module.startswith("lab."):
        return (
            f"sandgym {command}: not in this install ({module} is developer tooling: "
            "it runs from a source checkout)"
        )
    extra = EXTRAS.get(command, "server")
    why = f"no module named {missing!r}" if missing else f"{module} cannot be imported"
    return f"sandgym {command}: not in this install ({why}): pip install 'sandgym[{extra}]'"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandgym",
        description="Environment server for training terminal and desktop agents with RL.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod, missing = _load(module)
        if mod is None:
            p.set_defaults(_unavailable=name, _missing=missing)
            p.add_argument("rest", nargs=argparse.REMAINDER)
        else:
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_unavailable", None):
        print(_unavailable(args._unavailable, args._missing), file=sys.stderr)
        return 3
    try:
        errors = user_errors()
    except ModuleNotFoundError as exc:  # a client install: the server's dependencies are absent
        if not exc.name or _ours(exc.name):
            raise
        print(_unavailable(args.command, exc.name), file=sys.stderr)
        return 3
    try:
        return int(args._run(args) or 0)
    except errors as exc:  # a typo or a refused request: one line, not a traceback
        print(f"sandgym {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a dependency of an extra this install lacks
        if not exc.name or _ours(exc.name):
            raise
        print(_unavailable(args.command, exc.name), file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

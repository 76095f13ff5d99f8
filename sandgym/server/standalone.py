"""One envserver subcommand run on its own: `python -m sandgym.server.serve_cli ...` is `sandgym serve ...`.

The `sandgym` command line (`sandgym_cli`) names trainer and bench, so envserver never imports it;
what envserver starts itself (`ServerProcess`: a server in a child process) goes through here.
`configure_logging` is the one logging set-up both entries use.
"""

from __future__ import annotations

import argparse
import logging
import sys
from types import ModuleType


def configure_logging(verbose: bool) -> None:
    """Logs on stderr (stdout carries `--json` documents), debug with `-v`."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run_module(prog: str, module: ModuleType, argv: list[str] | None = None) -> int:
    """Parse `argv` with `module.add_arguments` and return `module.run(args)`'s exit status."""
    parser = argparse.ArgumentParser(prog=prog, description=module.__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    return int(module.run(args) or 0)

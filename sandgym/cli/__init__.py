"""The `sandgym` console command (`sandgym.cli.main:main`), apart from the packages it drives."""

from sandgym.cli.main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]

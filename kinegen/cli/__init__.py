"""The ``kinegen`` command line: generate, models, profile, calibrate, train, eval, understand, app, serve.

Each command lives in its own module with ``add_parser(subparsers)`` and ``run(args) -> int``;
the flags they share are in :mod:`kinegen.cli.common`. Every user error (bad size, unknown model
or accelerator, unwritable output...) prints one ``error:`` paragraph saying what to do and exits
with status 2; no partial output file is left behind. Heavy imports happen inside the commands so
that ``kinegen --help`` is instant.
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import KinegenError
from ..memory import out_of_memory_guard
from . import app, calibrate, generate, models, profile, serve, train, understand
from . import eval as evaluate

COMMANDS = (generate, models, profile, calibrate, train, evaluate, understand, app, serve)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command's subparser."""
    parser = argparse.ArgumentParser(
        prog="kinegen", description="Fast video and image generation on diffusers pipelines.",
        epilog="Run `kinegen COMMAND --help` for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"kinegen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with out_of_memory_guard():  # a command that runs out of memory: one line saying what to try
            return args.func(args)
    except KinegenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


__all__ = ["build_parser", "main"]

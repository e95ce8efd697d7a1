"""The ``skewer`` command line: one subcommand per module in :mod:`pipeline.commands`.

Each command module defines ``register(subparsers)``, which adds its parser and sets
``handler`` to a function taking the parsed arguments and returning an exit code. Modules
import their heavy dependencies (Spark, numba-compiled schemes) inside the handler, so
``skewer --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from operators.base import SchemeError

#: Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "pipeline.commands.services",
    "pipeline.commands.route",
    "pipeline.commands.sim",
    "pipeline.commands.bench",
    "pipeline.commands.produce",
    "pipeline.commands.group",
    "pipeline.commands.work",
    "pipeline.commands.aggregate",
    "pipeline.commands.control",
    "pipeline.commands.demo",
    "pipeline.commands.report",
)


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skewer",
        description="Kafka-to-Spark streaming with pluggable stream grouping, and its simulator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (UsageError, SchemeError) as error:
        print(f"skewer {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # `python -m pipeline.cli` runs this file as __main__, a second copy of the module: the
    # commands raise pipeline.cli.UsageError, which only the imported module's main() catches.
    from pipeline.cli import main as imported_main

    sys.exit(imported_main())

"""The ``skewer`` command line: one subcommand per module of :mod:`pipeline.cli`. (layer: cli)

Each command module defines ``register(subparsers)``, which adds its parser and sets
``handler`` to a function taking the parsed arguments and returning an exit code. Modules
import their heavy dependencies (Spark, numba-compiled schemes) inside the handler, so
``skewer --help`` stays fast. Commands that live above ``pipeline`` (``skewer bench``, in
:mod:`bench.cli`) register through the ``skewer.commands`` entry-point group of
pyproject.toml, the way pytest finds its plugins: ``pipeline`` never imports ``bench``.

Errors become exit codes here, once for every command: bad input (:class:`UsageError`,
:class:`~operators.base.SchemeError`, a topic of the wrong shape, an exporter port taken, a
setting of the environment that cannot work) is 2,
a service that does not answer is 1; each is one line ``skewer COMMAND: error: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from operators.base import SchemeError
from pipeline.cli.arguments import UsageError
from pipeline.io.config import SettingsError
from pipeline.io.kafka_io import KafkaIOError, ServiceUnavailableError
from pipeline.observe.exporter import MetricsError

#: Subcommand modules of this package, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "pipeline.cli.services",
    "pipeline.cli.images",
    "pipeline.cli.route",
    "pipeline.cli.sim",
    "pipeline.cli.advise",
    "pipeline.cli.produce",
    "pipeline.cli.group",
    "pipeline.cli.work",
    "pipeline.cli.aggregate",
    "pipeline.cli.control",
    "pipeline.cli.demo",
    "pipeline.cli.verify",
    "pipeline.cli.report",
)
#: Where packages above ``pipeline`` register more subcommands (``NAME = "module:register"``).
COMMAND_ENTRY_POINTS = "skewer.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skewer",
        description="Kafka-to-Spark streaming with pluggable stream grouping, and its simulator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for entry_point in sorted(entry_points(group=COMMAND_ENTRY_POINTS), key=lambda e: e.name):
        entry_point.load()(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ServiceUnavailableError as error:
        print(f"skewer {args.command}: error: {error}", file=sys.stderr)
        return 1
    except (UsageError, SchemeError, KafkaIOError, MetricsError, SettingsError) as error:
        print(f"skewer {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

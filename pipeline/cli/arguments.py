"""The options every ``skewer`` subcommand repeats, and the errors every one of them raises.

One definition each of: the run's names (``--run-id``, ``--topic-prefix``), the scheme
(``--scheme``, defaulting to ``$GROUPING_SCHEME``), the scheme's parameters (``--param``), the
metrics exporter (``--metrics-port``, and ``--scheme`` as a label for stages that do not
route), ``--json``, the ">= 1" checks of counts, and SIGTERM as a clean stop. Errors:
:class:`UsageError` is bad input (one line, exit 2); :func:`pipeline.cli.app.main` also maps a
service that does not answer to exit 1. (layer: cli)

Example:
    >>> parser = argparse.ArgumentParser(prog="skewer x")
    >>> add_run_arguments(parser)
    >>> add_param_argument(parser)
    >>> args = parser.parse_args(["--run-id", "r1", "--param", "d=3"])
    >>> args.run_id, args.topic_prefix, args.param
    ('r1', '', ['d=3'])
    >>> require_at_least(1, ("--workers", 0))
    Traceback (most recent call last):
    ...
    pipeline.cli.arguments.UsageError: --workers must be >= 1, got 0
"""

from __future__ import annotations

import argparse
import signal

from pipeline.io.config import SCHEME_VARIABLE
from pipeline.observe.exporter import ENV_METRICS_PORT, UNKNOWN_SCHEME, port_number


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def add_command(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, doc: str, paragraph: int = 0
) -> argparse.ArgumentParser:
    """The subcommand ``name``: ``help`` in ``skewer --help``, and paragraph ``paragraph`` of its
    module docstring ``doc`` as the description of ``skewer NAME --help``."""
    description = doc.split("\n\n")[paragraph].replace("``", "`")
    return subparsers.add_parser(name, help=help, description=description)


def add_window_argument(parser: argparse.ArgumentParser) -> None:
    """``--window-ms``: the tumbling window's length, the same for every stage of a run."""
    parser.add_argument("--window-ms", type=int, default=10_000, help="window length (10000)")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``--run-id`` and ``--topic-prefix``: the names of one run (:class:`RunNames`)."""
    parser.add_argument("--run-id", default="default", help="namespace of Redis keys")
    parser.add_argument("--topic-prefix", default="", help="prefix of the run's topic names")


def add_scheme_argument(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--scheme``: the grouping scheme, else ``$GROUPING_SCHEME``, else ``default``."""
    fallback = f", else {default}" if default else ""
    parser.add_argument("--scheme", help=f"grouping scheme (default: ${SCHEME_VARIABLE}{fallback})")


def add_param_argument(parser: argparse.ArgumentParser) -> None:
    """``--param NAME=VALUE``, repeatable: the scheme's parameters (:mod:`operators.params`)."""
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a scheme parameter: int, float, true/false or a comma list, e.g. theta_max=0.1 "
        "(repeatable)",
    )


def add_metrics_arguments(parser: argparse.ArgumentParser, *, scheme_label: bool) -> None:
    """``--metrics-port`` and, for a stage that routes nothing, ``--scheme`` as a label only."""
    if scheme_label:
        parser.add_argument(
            "--scheme",
            help=f"grouping scheme of the run, a label of its metrics (default: "
            f"${SCHEME_VARIABLE}, else {UNKNOWN_SCHEME})",
        )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        metavar="PORT",
        help=f"Prometheus exporter port (default: ${ENV_METRICS_PORT}, else 0 = a free port; "
        "-1 = off)",
    )


def add_stage_arguments(
    parser: argparse.ArgumentParser, *, scheme_label: bool, until_end: str | None
) -> None:
    """What every stage process takes: the run's names, the metrics exporter, ``--json`` and,
    for a stage that runs until told to stop, ``--until-end`` (its help says when it ends)."""
    if until_end is not None:
        parser.add_argument("--until-end", action="store_true", help=until_end)
    add_run_arguments(parser)
    add_metrics_arguments(parser, scheme_label=scheme_label)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")


def require_at_least(minimum: int, *values: tuple[str, int]) -> None:
    """:class:`UsageError` naming the first ``(flag, value)`` below ``minimum``."""
    for name, value in values:
        if value < minimum:
            raise UsageError(f"{name} must be >= {minimum}, got {value}")


def stop_on_sigterm() -> None:
    """Turn SIGTERM (how ``skewer demo`` stops its children) into KeyboardInterrupt, so a
    long-running command leaves through its ``finally`` blocks (Spark's query stopped cleanly)."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)

"""The options every ``skewer`` subcommand repeats, and the errors every one of them raises.

One definition each of: the run's names (``--run-id``, ``--topic-prefix``), the scheme
(``--scheme``, defaulting to ``$GROUPING_SCHEME``), the scheme's parameters (``--param``), the
grouping stage's transaction cadence (``--commit-interval-ms``), the metrics exporter
(``--metrics-port``, and ``--scheme`` as a label for stages that do not route), ``--json``,
the ">= 1" checks of counts, and SIGTERM as a clean stop. Errors:
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
import os
import re
import signal
from typing import TYPE_CHECKING

from pipeline.io import kafka_io
from pipeline.io.config import ENV_SPARK_MASTER, SCHEME_VARIABLE, check_spark_master
from pipeline.observe.exporter import ENV_METRICS_PORT, UNKNOWN_SCHEME, port_number

if TYPE_CHECKING:
    from pipeline.io.query.job import Job
    from pipeline.stages.user_topic import UserTopic

#: A duration: a number and a unit (``500ms``, ``5s``, ``2m``, ``1h``); ``0`` alone is 0.
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def add_command(
    subparsers: argparse._SubParsersAction, name: str, *, help: str, doc: str, paragraph: int = 0
) -> argparse.ArgumentParser:
    """The subcommand ``name``: ``help`` in ``skewer --help``, and paragraph ``paragraph`` of its
    module docstring ``doc`` as the description of ``skewer NAME --help`` (its "Layer:" line
    not counted: that is for the code's reader)."""
    paragraphs = [text for text in doc.split("\n\n") if not text.startswith("Layer:")]
    description = paragraphs[paragraph].replace("``", "`")
    return subparsers.add_parser(name, help=help, description=description)


#: The tumbling window's length when neither ``--window-ms`` nor a query says it.
DEFAULT_WINDOW_MS = 10_000


def add_window_argument(parser: argparse.ArgumentParser, *, by_query: bool = False) -> None:
    """``--window-ms``: the tumbling window's length, the same for every stage of a run; with
    ``by_query`` its default is None (a query's window, else :data:`DEFAULT_WINDOW_MS`)."""
    parser.add_argument(
        "--window-ms",
        type=int,
        default=None if by_query else DEFAULT_WINDOW_MS,
        help=f"window length ({DEFAULT_WINDOW_MS})",
    )


def add_keep_results_argument(parser: argparse.ArgumentParser) -> None:
    """``--keep-results SECONDS``: how long a window's result stays in Redis once published."""
    parser.add_argument(
        "--keep-results",
        type=int,
        metavar="SECONDS",
        dest="keep_results_s",
        help="a window's result, top-k and ground truth leave Redis SECONDS after its result "
        "is published to topic results, checked against the truth first (verify adds up what "
        "was checked); for runs that go on for hours (default: kept until the run is deleted)",
    )


def add_commit_interval_argument(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    """``--commit-interval-ms``: the grouping stage's transaction cadence, the longest a source
    waits for a batch to fill up (:data:`~pipeline.io.kafka_io.COMMIT_INTERVAL_MS`); with
    ``several``, one value or more, as a list. Check it with :func:`require_at_least`."""
    default = kafka_io.COMMIT_INTERVAL_MS
    parser.add_argument(
        "--commit-interval-ms",
        type=int,
        nargs="+" if several else None,
        default=[default] if several else default,
        metavar="MS",
        help="how long the grouping stage waits at most to fill a batch (one Kafka "
        "transaction) before it commits: shorter makes records visible sooner, in more and "
        f"smaller transactions (default {default})",
    )


def add_spark_master_argument(parser: argparse.ArgumentParser) -> None:
    """``--spark-master``: where the workers' Spark tasks run (default ``$SKEWER_SPARK_MASTER``,
    else ``local``: threads of the ``skewer work`` process)."""
    parser.add_argument(
        "--spark-master",
        metavar="URL",
        help=f"local[...], spark://HOST:PORT, k8s://URL or yarn (default: ${ENV_SPARK_MASTER}, "
        "else local)",
    )


def add_jit_argument(parser: argparse.ArgumentParser, default: str | None) -> None:
    """``--jit``: how the workers' driver JVM compiles (``pipeline.io.spark_session.JIT_MODES``);
    ``default`` None lets the run choose (``skewer demo``: quick for a paced local run)."""
    from pipeline.io.spark_session import JIT_MODES

    chosen = "quick for a paced run on a local master, else peak" if default is None else default
    parser.add_argument(
        "--jit",
        choices=JIT_MODES,
        default=default,
        help=f"the Spark driver's JIT: peak (C1 then C2) or quick (C1 only: warm within a "
        f"second, about half the peak rate of the JVM's part) (default: {chosen})",
    )


def add_trigger_argument(parser: argparse.ArgumentParser) -> None:
    """``--trigger``: the workers' Spark trigger (read with :func:`trigger_from_args`)."""
    from pipeline.io.config import ENV_TRIGGER, TRIGGERS

    parser.add_argument(
        "--trigger",
        choices=TRIGGERS,
        help=f"the workers' Spark trigger: micro-batch, or real-time (Spark's Real-Time Mode, "
        f"milliseconds per record) (default: ${ENV_TRIGGER}, else micro-batch)",
    )


def trigger_from_args(args: argparse.Namespace) -> str:
    """``--trigger``, else ``$SKEWER_TRIGGER``, else micro-batch; a :class:`UsageError` for a
    variable that names no trigger."""
    from pipeline.io.config import SettingsError, resolve_trigger

    try:
        return resolve_trigger(args.trigger)
    except SettingsError as error:
        raise UsageError(str(error)) from None


def spark_master_from_args(args: argparse.Namespace, default: str) -> str:
    """``--spark-master``, else ``default`` (the settings' ``spark_master``); a
    :class:`UsageError` if Spark would not take it, or if it is a ``spark://`` master that does
    not answer (checked before anything starts: a driver would retry it for a minute)."""
    from pipeline.io.spark_session import SparkClusterError, require_master_answers

    try:
        master = check_spark_master(args.spark_master or default, "--spark-master")
        require_master_answers(master)
    except (ValueError, SparkClusterError) as error:
        raise UsageError(str(error)) from None
    return master


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


def parse_duration_ms(flag: str, text: str) -> int:
    """Milliseconds of ``text`` (``5s``, ``500ms``, ``2m``, ``1h``, ``0``); UsageError else.

    Example:
        >>> parse_duration_ms("--idle-timeout", "1.5s"), parse_duration_ms("--x", "0")
        (1500, 0)
    """
    if text.strip() == "0":
        return 0
    match = DURATION.match(text)
    if match is None:
        raise UsageError(f"{flag} {text!r}: not a duration (e.g. 500ms, 5s, 2m)")
    return round(float(match.group(1)) * DURATION_UNITS_MS[match.group(2)])


#: The flags of a user's own topic: (flag, environment variable of its default, default,
#: metavar, help).
INPUT_TOPIC_FLAGS = (
    (
        "--query",
        "SKEWER_QUERY",
        "",
        "SQL",
        "your own windowed job in Spark SQL, instead of --input-topic, --key, --time and --sum: "
        "SELECT url, window.start, count(*) AS hits FROM clicks GROUP BY url, "
        "window(timestamp_millis(ts), '1 minute') (docs/query.md)",
    ),
    (
        "--input-topic",
        "SKEWER_INPUT_TOPIC",
        "",
        "TOPIC",
        "read this topic as it is; one source per partition",
    ),
    (
        "--key",
        "SKEWER_KEY",
        "kafka-key",
        "SPEC",
        "where the key is: kafka-key | json:FIELD | csv:N (default kafka-key)",
    ),
    (
        "--time",
        "SKEWER_TIME",
        "kafka-timestamp",
        "SPEC",
        "where the event time is: kafka-timestamp | json:FIELD[:ms|s|iso] | "
        "csv:N[:ms|s|iso] (default kafka-timestamp)",
    ),
    (
        "--sum",
        "SKEWER_SUM",
        "",
        "SPEC",
        "also sum this number per (key, window): json:FIELD | csv:N (exact to 6 decimals)",
    ),
    (
        "--max-out-of-order",
        "SKEWER_MAX_OUT_OF_ORDER",
        "5s",
        "DURATION",
        "the watermark is the highest event time seen minus this (default 5s)",
    ),
    (
        "--idle-timeout",
        "SKEWER_IDLE_TIMEOUT",
        "10s",
        "DURATION",
        "a partition without records this long stops holding windows open (default 10s; 0 = never)",
    ),
)


def add_input_topic_arguments(parser: argparse.ArgumentParser) -> None:
    """A user's own topic as the input (:mod:`pipeline.stages.user_topic`); each flag's
    default is an environment variable, so a compose file can set them."""
    group = parser.add_argument_group(
        "your own topic (instead of skewer's producers; defaults from SKEWER_QUERY, "
        "SKEWER_INPUT_TOPIC, SKEWER_KEY, SKEWER_TIME, SKEWER_SUM, SKEWER_MAX_OUT_OF_ORDER, "
        "SKEWER_IDLE_TIMEOUT)"
    )
    for flag, variable, default, metavar, help in INPUT_TOPIC_FLAGS:
        value = os.environ.get(variable, default)
        group.add_argument(flag, default=value or default or None, metavar=metavar, help=help)


def job_from_args(args: argparse.Namespace) -> Job | None:
    """``--query``'s job (None without one); UsageError with one line for a query skewer cannot
    run, one the live stages do not run yet, or one beside the flags it replaces."""
    from pipeline.io.query.job import live_refusal
    from pipeline.io.query.parse import QueryError, parse_query

    if not getattr(args, "query", None):
        return None
    try:
        job = parse_query(args.query)
    except QueryError as error:
        raise UsageError(str(error)) from None
    replaced = [
        flag
        for flag, _, default, _, _ in INPUT_TOPIC_FLAGS[1:5]
        if getattr(args, flag[2:].replace("-", "_")) not in (None, default)
    ]
    if replaced:
        raise UsageError(
            f"--query names the topic, key, event time and sums: drop {', '.join(replaced)}"
        )
    refusal = live_refusal(job)
    if refusal is not None:
        raise UsageError(f"--query: {refusal}")
    return job


def window_ms_from_args(
    args: argparse.Namespace, job: Job | None, flag: str, flag_ms: int | None, default_ms: int
) -> int:
    """The run's window: the query's, else the window flag's (``flag_ms``, None when not
    given), else ``default_ms``; UsageError for a window flag beside a query."""
    if job is None:
        return default_ms if flag_ms is None else flag_ms
    if flag_ms is not None:
        raise UsageError(f"--query says the window: drop {flag}")
    return job.window.size_ms


def user_topic_from_args(
    args: argparse.Namespace, *, window_ms: int, lateness_ms: int, job: Job | None = None
) -> UserTopic | None:
    """The :class:`UserTopic` the flags of :func:`add_input_topic_arguments` describe, or
    ``job`` (``--query``) when given (None for skewer's own stream); UsageError with one line
    for a bad extractor or duration."""
    from pipeline.io.query.job import OWN_STREAM
    from pipeline.stages.user_topic import UserTopic, topic_extractor

    topic, key, time, amount = args.input_topic, args.key, args.time, args.sum
    if job is not None:
        topic = None if job.table == OWN_STREAM else job.table
        # A query's aggregates are read as its state fields (the extractor's aggregated
        # columns), NULLs skipped: no --sum amount, which a record must have.
        key, time = job.route_on.spec.text, job.time.text if job.time is not None else time
        amount = None
    if not topic:
        if amount:
            raise UsageError(
                f"--sum {amount} needs --input-topic: skewer's own records carry no amount"
            )
        return None
    try:
        topic = UserTopic(
            topic=topic,
            extractor=topic_extractor(key, time, amount, job.text if job is not None else None),
            max_out_of_order_ms=parse_duration_ms("--max-out-of-order", args.max_out_of_order),
            idle_timeout_ms=parse_duration_ms("--idle-timeout", args.idle_timeout),
            window_ms=window_ms,
            lateness_ms=lateness_ms,
            query=job.text if job is not None else None,
        )
        topic.validate()
    except ValueError as error:  # ExtractorSpecError is one
        raise UsageError(str(error)) from None
    return topic


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

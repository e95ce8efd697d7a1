"""`skewer demo`: the live pipeline end to end -- produce, group, work, aggregate -- for one run.

Layer: cli.

It starts Kafka and Redis natively if they do not answer (and stops them again at the end
unless someone else uses them; ``--keep-services`` leaves them up, ``--no-start`` never starts
them), then runs ``skewer produce``, ``group``, ``work`` (Spark) and ``aggregate`` as
subprocesses on a fresh run (its own topics ``{run}-keys``, ``{run}-work``, ... and Redis keys
``skewer:{run}:``), shows progress on stderr (records produced, grouped, processed; final
windows; max/avg load of the workers), and prints a summary per worker and overall.
``--verify`` compares every final (key, window) count with the ground truth and exits 0 only
if all are equal. ``--input-topic T`` runs the scheme on a topic you already have instead: no
producer, one source per partition of T, the records T holds when the run starts, key and time
from ``--key`` and ``--time``; the ground truth is then a Spark batch recount of T. ``--json``
prints one object instead (the start-up timeline in it; ``--timings`` prints the timeline and
the latency per 5 s window after the summary). The run's topics, Redis keys and Spark
checkpoint are deleted at the end unless ``--keep`` (never T itself). Exit 2 on bad arguments
(unknown scheme, W < 1, ...), 1 when a service does not answer, a stage fails, or ``--verify``
fails.

How the stages run: pipeline/runs/orchestrator.py; what the figures mean: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, TextIO

from pipeline.cli.arguments import (
    add_command,
    add_commit_interval_argument,
    add_input_topic_arguments,
    add_jit_argument,
    add_keep_results_argument,
    add_param_argument,
    add_scheme_argument,
    add_spark_master_argument,
    add_trigger_argument,
)
from producers.workloads import DEFAULT_WORKLOAD

if TYPE_CHECKING:
    from pipeline.io.config import Settings
    from pipeline.runs.orchestrator import Pipeline
    from pipeline.runs.plan import RunPlan
    from pipeline.runs.run_clock import RunClock
    from pipeline.runs.summary import RunSummary

DEFAULT_SCHEME = "pkg"
#: The flags that are :class:`~pipeline.runs.plan.RunPlan` fields of the same name.
PLAN_FLAGS = (
    "records",
    "jit",
    "workers",
    "sources",
    "workload",
    "rate",
    "event_rate",
    "cpu_cost_us",
    "top_k",
    "topic_prefix",
    "control_interval",
    "control_every",
    "commit_interval_ms",
    "keep_results_s",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "demo",
        help="run producers, grouping stage, Spark workers and aggregator end to end",
        doc=__doc__,
        paragraph=1,
    )
    add_scheme_argument(parser, DEFAULT_SCHEME)
    parser.add_argument("--records", type=int, default=100_000, help="records (100000)")
    parser.add_argument("--workers", type=int, default=8, metavar="W", help="workers (8)")
    parser.add_argument("--sources", type=int, default=2, metavar="S", help="sources (2)")
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        metavar="SPEC",
        help=f"key stream (producers/workloads.py; default {DEFAULT_WORKLOAD})",
    )
    parser.add_argument(
        "--rate", type=float, metavar="R", help="pace the producers at R records/s (real time)"
    )
    parser.add_argument(
        "--window", type=float, metavar="SECONDS", help="tumbling window (10; a query says its own)"
    )
    parser.add_argument(
        "--cpu-cost-us", type=float, default=0.0, metavar="C", help="per-record work, µs (0)"
    )
    parser.add_argument(
        "--event-rate",
        type=float,
        metavar="E",
        help="synthetic event time: records per second of event time (default: produce's)",
    )
    parser.add_argument("--top-k", type=int, default=10, metavar="K", help="top keys (10)")
    add_param_argument(parser)
    parser.add_argument(
        "--control-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="routing-table schemes: seconds between the controller's rounds (2)",
    )
    parser.add_argument(
        "--control-every",
        type=int,
        metavar="N",
        help="routing-table schemes: a round every N records routed instead, each source "
        "reporting after every N/S of its own (the simulator's rounds)",
    )
    add_commit_interval_argument(parser)
    add_keep_results_argument(parser)
    add_input_topic_arguments(parser)
    parser.add_argument("--verify", action="store_true", help="exit 1 unless counts are exact")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--timings",
        action="store_true",
        help="print the start-up timeline and the latency per 5 s window after the summary",
    )
    parser.add_argument("--run-id", help="run id (default: a fresh demo-XXXXXXXX)")
    parser.add_argument("--topic-prefix", help="prefix of the run's topics (default: RUN-)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the run's topics, Redis keys and checkpoint"
    )
    parser.add_argument("--no-start", action="store_true", help="never start services")
    parser.add_argument(
        "--keep-services", action="store_true", help="leave services it started running"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds (1800)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_spark_master_argument(parser)
    add_jit_argument(parser, None)
    add_trigger_argument(parser)
    parser.set_defaults(handler=run)


class ProgressPrinter:
    """Progress on stderr: one line rewritten in place on a terminal, a line every few
    seconds otherwise (logs and CI)."""

    def __init__(self, records: int, stream: TextIO | None = None) -> None:
        self.records = records
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.calls = 0
        self.width = 0

    def __call__(self, progress: object) -> None:
        self.calls += 1
        if not self.tty and self.calls % 5 != 1:
            return
        line = progress.line(self.records)  # type: ignore[attr-defined]
        if self.tty:
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


def plan_from_args(args: argparse.Namespace, settings: Settings) -> RunPlan:
    """The run the flags describe (:func:`pipeline.runs.plan.plan_run`); UsageError with one
    line for a bad one."""
    from pipeline.cli.arguments import (
        DEFAULT_WINDOW_MS,
        UsageError,
        job_from_args,
        spark_master_from_args,
        trigger_from_args,
        user_topic_from_args,
        window_ms_from_args,
    )
    from pipeline.io import config
    from pipeline.runs.plan import plan_run

    scheme = config.resolve_scheme(args.scheme, DEFAULT_SCHEME)
    spark_master = spark_master_from_args(args, settings.spark_master)
    job = job_from_args(args)
    flag_ms = None if args.window is None else round(args.window * 1000)
    window_ms = window_ms_from_args(args, job, "--window", flag_ms, DEFAULT_WINDOW_MS)
    user_topic = user_topic_from_args(args, window_ms=window_ms, lateness_ms=0, job=job)
    own_topic = {}
    if user_topic is not None:
        amount = user_topic.extractor.amount
        own_topic = {
            "input_topic": user_topic.topic,
            "key": user_topic.extractor.key.text,
            "time": user_topic.extractor.time.text,
            "sum": amount.text if amount is not None else None,
            "query": user_topic.query,
            "max_out_of_order_ms": user_topic.max_out_of_order_ms,
            "idle_timeout_ms": user_topic.idle_timeout_ms,
        }
    same_names = {name: getattr(args, name) for name in PLAN_FLAGS}
    try:
        return plan_run(
            settings,
            trigger=trigger_from_args(args),
            run_id=args.run_id,
            spark_master=spark_master,
            scheme=scheme,
            window_ms=window_ms,
            params=tuple(args.param),
            **same_names,
            **own_topic,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def _sized_to_topic(plan: RunPlan, settings: Settings) -> RunPlan:
    """The plan of a run on a user's topic: one source per partition, and as many records as
    the topic holds now (what the run reads). UsageError if there is no such topic or it is
    empty."""
    from pipeline.cli.arguments import UsageError
    from pipeline.io import kafka_io

    topic = plan.input_topic
    held = kafka_io.topic_records(settings.kafka_bootstrap, topic)
    if held is None:
        raise UsageError(f"--input-topic {topic}: no such topic")
    if not sum(held):
        raise UsageError(f"--input-topic {topic}: the topic holds no records")
    return replace(plan, sources=len(held), records=sum(held))


def _say(line: str) -> None:
    print(f"skewer demo: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from pipeline.io import config, kafka_io
    from pipeline.runs import orchestrator, service_lease
    from pipeline.runs.run_clock import RunClock, process_started_at

    # The command started with its process (interpreter and imports included).
    clock = RunClock(process_started_at())
    settings = config.load()
    plan = plan_from_args(args, settings)
    try:
        lease = service_lease.ensure_services(
            settings, start=not args.no_start, keep=args.keep_services
        )
    except orchestrator.PipelineError as error:
        _say(f"error: {error}")
        return 1
    clock.mark("services checked")
    if lease.started:
        kept = "kept running" if args.keep_services else "stopped at the end"
        _say(f"started {', '.join(lease.started)} ({kept})")
    try:
        # Before any stage starts: a setting the cluster cannot meet is refused whole (exit 2).
        kafka_io.require_replication(settings.kafka_bootstrap, settings.kafka_replication)
        if plan.input_topic is not None:
            plan = _sized_to_topic(plan, settings)
        summary, report_png = _run(plan, settings, args, clock)
    except orchestrator.StageFailedError as error:
        # A stage that refused its settings (exit 2: fewer Spark cores than tasks, say) is the
        # user's to fix, as if the demo had refused them itself.
        reason = error.reason.removeprefix(f"skewer {error.stage}: error: ")
        _say(f"error: {error.stage}: {reason}" if error.code == 2 else f"error: {error}")
        return 2 if error.code == 2 else 1
    except orchestrator.PipelineError as error:
        _say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted: every stage stopped")
        raise
    finally:
        lease.release()
    _print(plan, summary, report_png, json_out=args.json, timings=args.timings)
    if args.verify and not summary.exact:
        if args.json:
            for line in summary.verification.lines():
                print(line, file=sys.stderr)
        return 1
    return 0


def _run(
    plan: RunPlan, settings: Settings, args: argparse.Namespace, clock: RunClock
) -> tuple[RunSummary, str | None]:
    """Run ``plan`` with progress on stderr (unless ``--quiet``); its summary and report."""
    from pipeline.runs import orchestrator, report

    quiet = args.quiet
    if not quiet:
        _say(
            f"run {plan.run_id}: scheme {plan.scheme}, W={plan.workers} workers, "
            f"S={plan.sources} sources, {plan.records:,} records of "
            f"{plan.workload if plan.input_topic is None else plan.input_topic}, "
            f"windows of {plan.window_ms / 1000:g} s, CPU cost {plan.cpu_cost_us:g} µs/record"
        )
    printer = ProgressPrinter(plan.records)
    report_png: str | None = None

    def draw_report(pipeline: Pipeline, _summary: RunSummary) -> None:
        nonlocal report_png
        report_png = report.report_for_demo(
            pipeline.store.client, plan.run_id, plan.scheme, settings.run_dir, _say
        )

    try:
        summary = orchestrator.run_pipeline(
            plan,
            settings,
            timeout=args.timeout,
            on_progress=None if quiet else printer,
            keep=args.keep,
            log=None if quiet else _say,
            on_end=draw_report,
            clock=clock,
        )
    finally:
        printer.done()
        if args.keep:
            _say(f"kept: topics {', '.join(plan.topics)}, Redis keys {plan.names.redis_prefix}*")
    return summary, report_png


def _print(
    plan: RunPlan,
    summary: RunSummary,
    report_png: str | None,
    *,
    json_out: bool,
    timings: bool = False,
) -> None:
    """The run's summary on stdout: one JSON object, or lines per worker and overall (and with
    ``timings`` the start-up timeline and the latency per 5 s window)."""
    if json_out:
        print(json.dumps({**summary.as_json(), "report_png": report_png}))
        return
    stream = plan.workload if plan.input_topic is None else f"topic {plan.input_topic}"
    print(
        f"run {plan.run_id}: scheme {plan.scheme}, {plan.records:,} records of "
        f"{stream}, W={plan.workers}, S={plan.sources}"
    )
    print("\n".join(summary.lines()))
    print("\n".join(summary.verification.lines()))
    if report_png:
        print(f"report: {report_png}")
    if timings:
        from pipeline.runs.run_clock import timeline_lines
        from pipeline.runs.summary import window_lines

        print("timeline (seconds since the command, event, gap since the previous event):")
        print("\n".join(timeline_lines(summary.timeline)))
        print("latency per 5 s window of the run (start in seconds since the command):")
        print("\n".join(window_lines(summary.latency_windows)))

"""`skewer advise`: which grouping scheme for your stream, and what it buys over key grouping.

Layer: cli.

Replays a sample of the stream through every registered scheme in the simulator (defaults
plus a small sweep of each one's main parameter) and prints a ranked table -- throughput
bound at ``--cpu-cost-us`` C per record, predicted p50/p99 latency at ``--rate`` R, state
entries, workers per key -- and one recommendation line. The sample: ``--input-topic T`` with
the own-topic flags of ``skewer demo`` (``--sample N`` records, default 1,000,000, one
source per partition), ``--workload SPEC`` or ``--input FILE`` (one key per line), dealt to
``--sources`` sources (default 2) as ``skewer produce`` deals them. ``--goal`` ranks for
throughput (default), latency or memory; ``--batch-ms D`` is Spark's micro-batch cycle the
workers are fed in (250; 0: one by one); ``--json`` prints one object; ``--picture PATH``
writes a PNG. ``--validate K`` then runs the top K live schemes and key grouping live, one
after another, on the same stream (``skewer demo``'s path, same W and C) and prints predicted
against measured; ``--check`` exits 1 if a figure is outside its tolerance. Exit 2 on bad
input, 1 when Kafka does not answer or a live run fails. Model and tolerances: docs/advise.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.cli.arguments import (
    UsageError,
    add_command,
    add_input_topic_arguments,
    user_topic_from_args,
)

if TYPE_CHECKING:
    from operators.advice import Advice, Candidate, Check, Sample
    from pipeline.runs.advise import StreamSample

#: C: µs of CPU per record at a worker (a small Python aggregation; docs/advise.md).
DEFAULT_CPU_COST_US = 500.0
DEFAULT_WORKERS = 8
DEFAULT_SOURCES = 2
#: Seconds between progress lines on a pipe (a terminal's line is rewritten in place).
PROGRESS_SECONDS = 1.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "advise",
        help="which grouping scheme for your stream: every scheme replayed on a sample of it",
        doc=__doc__,
        paragraph=1,
    )
    # Numbers are read as text and checked here, so a bad one is one line (not argparse's two).
    parser.add_argument(
        "--workers", default=str(DEFAULT_WORKERS), metavar="W", help="workers, >= 2 (8)"
    )
    parser.add_argument(
        "--sources", metavar="S", help="sources (default: the topic's partitions, else 2)"
    )
    parser.add_argument(
        "--cpu-cost-us",
        default=str(DEFAULT_CPU_COST_US),
        metavar="C",
        help="CPU µs per record at a worker (500)",
    )
    parser.add_argument(
        "--rate",
        metavar="R",
        help="offered records/s (default: what the sample's times show; 4000 for a workload)",
    )
    parser.add_argument(
        "--batch-ms",
        metavar="D",
        help="ms of Spark's micro-batch cycle the workers are fed in; 0: one by one (250)",
    )
    parser.add_argument(
        "--sample", metavar="N", help="records to sample (default 1000000, or the whole topic)"
    )
    parser.add_argument("--goal", default="throughput", help="throughput | latency | memory")
    parser.add_argument("--workload", metavar="SPEC", help="e.g. zipf:z=1.2,keys=100000,n=1e6")
    parser.add_argument("--input", metavar="FILE", help="one key per line")
    add_input_topic_arguments(parser)
    parser.add_argument(
        "--window", default="10", metavar="SECONDS", help="window, for late records (10)"
    )
    parser.add_argument("--seed", default="0", help="seeds every scheme object (0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--picture", metavar="PATH", help="write a PNG: loads and p99 per scheme")
    parser.add_argument(
        "--validate", metavar="K", help="run the top K schemes and key grouping live, compare"
    )
    parser.add_argument(
        "--check", action="store_true", help="with --validate: exit 1 if outside tolerance"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def number(flag: str, text: str | None, *, minimum: float, integer: bool = False) -> float:
    """``text`` as a finite number >= ``minimum`` (an integer if asked); UsageError else.

    >>> number("--workers", "8", minimum=2, integer=True), number("--rate", "1e3", minimum=0)
    (8, 1000.0)
    """
    try:
        value = float(text or "")
    except ValueError:
        raise UsageError(f"{flag} {text!r}: not a number") from None
    if not math.isfinite(value) or (integer and value != int(value)):
        kind = "an integer" if integer else "a finite number"
        raise UsageError(f"{flag} {text!r}: not {kind}")
    if value < minimum:
        raise UsageError(f"{flag} must be >= {minimum:g}, got {text}")
    return int(value) if integer else value


class Progress:
    """Progress lines on stderr: rewritten in place on a terminal, one a second on a pipe."""

    def __init__(self, quiet: bool, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = 0.0

    def say(self, line: str, *, final: bool = False) -> None:
        now = time.monotonic()
        if self.quiet or (not final and now - self.last < PROGRESS_SECONDS):
            return
        self.last = now
        self.stream.write(
            f"\rskewer advise: {line}\x1b[K" if self.tty else f"skewer advise: {line}\n"
        )
        if self.tty and final:
            self.stream.write("\n")
        self.stream.flush()

    def read(self, done: int, total: int) -> None:
        self.say(f"read {done:,} of {total:,} records", final=done == total)

    def simulated(self, done: int, total: int, label: str) -> None:
        self.say(f"simulated {done}/{total} settings ({label})", final=done == total)


def _sample(args: argparse.Namespace, limit: int | None, progress: Progress) -> StreamSample:
    from pipeline.io import config, kafka_io
    from pipeline.runs.advise import (
        DEFAULT_SAMPLE,
        SampleError,
        topic_sample,
        workload_sample,
    )
    from producers.kafka_producer import DEFAULT_EVENT_RATE
    from producers.workloads import File, WorkloadError, parse

    given = [flag for flag, value in _inputs(args) if value]
    if len(given) != 1:
        raise UsageError("give one of --input-topic, --workload and --input")
    window_ms = round(number("--window", args.window, minimum=0.001) * 1000)
    user_topic = user_topic_from_args(args, window_ms=window_ms, lateness_ms=0)
    if user_topic is not None:
        if args.sources is not None:
            raise UsageError("--sources: a topic's sources are its partitions, one each")
        bootstrap = config.load().kafka_bootstrap
        kafka_io.require_kafka(bootstrap)
        try:
            return topic_sample(bootstrap, user_topic, limit or DEFAULT_SAMPLE, progress.read)
        except SampleError as error:
            raise UsageError(str(error)) from None
    sources = number("--sources", args.sources or str(DEFAULT_SOURCES), minimum=1, integer=True)
    rate = number("--rate", args.rate, minimum=0) if args.rate else DEFAULT_EVENT_RATE
    if rate <= 0:
        raise UsageError(f"--rate must be > 0, got {args.rate}")
    try:
        workload = parse(args.workload) if args.workload else File(path=args.input)
        return workload_sample(workload, limit, int(sources), rate)
    except WorkloadError as error:
        raise UsageError(str(error)) from None


def _inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    return [
        ("--input-topic", args.input_topic),
        ("--workload", args.workload),
        ("--input", args.input),
    ]


def run(args: argparse.Namespace) -> int:
    from operators.advice import DEFAULT_BATCH_MS, GOALS, advise, live_candidates

    workers = number("--workers", args.workers, minimum=2, integer=True)
    cost = number("--cpu-cost-us", args.cpu_cost_us, minimum=0)
    batch_ms = number("--batch-ms", args.batch_ms, minimum=0) if args.batch_ms else DEFAULT_BATCH_MS
    seed = number("--seed", args.seed, minimum=0, integer=True)
    if args.goal not in GOALS:
        raise UsageError(f"--goal {args.goal!r}: not one of {', '.join(GOALS)}")
    limit = number("--sample", args.sample, minimum=1, integer=True) if args.sample else None
    rate = number("--rate", args.rate, minimum=0) if args.rate else None
    if rate is not None and rate <= 0:
        raise UsageError(f"--rate must be > 0, got {args.rate}")
    validate = (
        int(number("--validate", args.validate, minimum=1, integer=True)) if args.validate else 0
    )
    if args.check and not validate:
        raise UsageError("--check needs --validate K: there is nothing measured to check")
    if validate and seed:
        raise UsageError("--validate: live grouping stages seed their schemes with 0; drop --seed")
    progress = Progress(args.quiet)
    taken = _sample(args, int(limit) if limit else None, progress)
    sample = taken.sample
    if rate is None:
        rate = taken.rate
        if rate is None:
            raise UsageError("the sample's times span no time, so they show no rate: give --rate")
    stream = _live_stream(args, taken, rate) if validate else {}
    advice = advise(
        sample,
        int(workers),
        cost,
        rate,
        goal=args.goal,
        seed=int(seed),
        batch_ms=batch_ms,
        progress=progress.simulated,
    )
    if args.picture:
        from pipeline.runs.advise import draw
        from pipeline.runs.report import ReportError

        try:
            draw(advice, Path(args.picture))
        except ReportError as error:
            raise UsageError(f"--picture: {error}") from None
    validated = live_candidates(advice.ranking, validate)
    if validated:
        failed = _run_live(advice, validated, sample, stream, progress)
        if failed:
            print(f"skewer advise: error: {failed}", file=sys.stderr)
            return 1
    if args.json:
        live = {"live": [_live_summary(c) for c in validated]} if validated else {}
        print(json.dumps({"sample": taken.summary(), **advice.summary(), **live}))
    else:
        print(table(advice, taken))
        if validated:
            print(live_table(advice, validated, stream))
    sys.stdout.flush()
    outside = any(check.within is False for c in validated for check in c.checks())
    return 1 if args.check and outside else 0


def _live_stream(args: argparse.Namespace, taken: StreamSample, rate: float) -> dict[str, Any]:
    """What the live runs read (:mod:`pipeline.runs.advise_live`); UsageError if a topic's
    sample is not the whole topic."""
    from pipeline.io import config
    from pipeline.runs.advise_live import LiveRunError, topic_stream, workload_stream

    window_ms = round(number("--window", args.window, minimum=0.001) * 1000)
    user_topic = user_topic_from_args(args, window_ms=window_ms, lateness_ms=0)
    if user_topic is None:
        fields = workload_stream(taken.origin, taken.read, taken.sample.n_sources, rate)
        return {**fields, "window_ms": window_ms}
    try:
        return topic_stream(config.load().kafka_bootstrap, user_topic, taken.read)
    except LiveRunError as error:
        raise UsageError(str(error)) from None


def _run_live(
    advice: Advice,
    validated: list[Candidate],
    sample: Sample,
    stream: dict[str, Any],
    progress: Progress,
) -> str | None:
    """Run ``validated`` live (filling each one's ``measured``); a failure's one line, or None."""
    from pipeline.io import config
    from pipeline.runs import service_lease
    from pipeline.runs.advise_live import LiveRunError, run_live
    from pipeline.runs.orchestrator import PipelineError

    settings = config.load()
    try:
        lease = service_lease.ensure_services(settings, start=True)
    except PipelineError as error:
        return str(error)
    try:
        run_live(
            advice,
            validated,
            sample,
            stream,
            settings,
            say=lambda line: progress.say(line, final=True),
            progress=progress.say,
        )
    except LiveRunError as error:
        return str(error)
    finally:
        lease.release()
    return None


def _live_summary(candidate: Candidate) -> dict[str, Any]:
    checks = candidate.checks()
    return {
        "label": candidate.label,
        "measured": candidate.measured,
        "checks": [check.summary() for check in checks],
        "within": all(check.within is not False for check in checks),
    }


def _batches(batch_ms: float) -> str:
    """How the model feeds the workers, for the table's model line."""
    return f"D = {batch_ms:g} ms micro-batches" if batch_ms else "no micro-batches"


def _ms(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def table(advice: Advice, taken: StreamSample) -> str:
    """The ranked table: the best setting of each scheme for the goal, then the recommendation."""
    from operators.advice import key_shown

    m = advice.records
    lines = [
        f"sample: {taken.origin}, {m:,} records from {advice.n_sources} source(s), "
        f"{advice.distinct_keys:,} keys; top key '{key_shown(advice.top_keys[0])}' "
        f"{advice.top_key_counts[0] / m:.1%}",
    ]
    if taken.refused:
        parts = [f"{name} {n:,}" for name, n in taken.dead_letters.items()]
        if taken.late:
            parts.append(f"late {taken.late:,}")
        lines.append(
            f"left out as the live stage would: {taken.refused:,} of {taken.read:,} "
            f"({taken.refused / taken.read:.1%}): {', '.join(parts)}"
        )
    lines.append(
        f"model: W = {advice.n_workers} workers, C = {advice.cpu_cost_us:g} µs per record, "
        f"R = {advice.rate:,.0f} records/s offered, {_batches(advice.batch_ms)}; "
        f"ranked for {advice.goal}"
    )
    lines.extend(f"note: {note}" for note in advice.notes)
    header = (
        "rank",
        "scheme",
        "bound/s",
        "vs even",
        "vs key",
        "max/avg",
        "worst",
        "p50 ms",
        "p99 ms",
        "state",
        "w/key",
        "w/hot",
        "moved keys",
        "route M/s",
    )
    rows = [header]
    for i, c in enumerate(advice.ranking, start=1):
        p99 = _ms(c.p99_ms) + ("!" if c.busiest_utilisation > 1 else "")
        rows.append(
            (
                str(i),
                c.label + ("*" if c.simulator_only else ""),
                f"{c.throughput_bound:,.0f}" if c.throughput_bound is not None else "",
                f"{c.vs_even:.2f}",
                f"{c.vs_key:.2f}",
                f"{c.max_avg_final:.2f}",
                f"{c.max_avg_worst:.2f}",
                _ms(c.p50_ms),
                p99,
                f"{c.state_entries:,}",
                f"{c.workers_per_key:.2f}",
                f"{c.workers_per_hot_key:.1f}",
                f"{c.moved_keys:,}" if c.rebalance_interval is not None else "-",
                f"{c.routing_rate / 1e6:.1f}",
            )
        )
    lines.extend(aligned(rows, text_column=1))
    lines.append(
        "* simulator only; ! the busiest worker is past its capacity at R (its queue grows "
        "through the sample)"
    )
    lines.append(f"recommendation: {advice.recommendation}")
    return "\n".join(lines)


def aligned(rows: Sequence[Sequence[str]], text_column: int) -> list[str]:
    """``rows`` as lines of columns two spaces apart: numbers right-aligned, the text column
    left-aligned.

    >>> aligned([("n", "scheme"), ("10", "pkg")], text_column=1)
    [' n  scheme', '10  pkg']
    """
    widths = [max(len(row[j]) for row in rows) for j in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if j == text_column else cell.rjust(w)
            for j, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _number_cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def _loads_cell(check: Check) -> str:
    if check.measured is None:
        return "-"
    predicted, live = check.predicted, check.measured
    if len(predicted) != len(live):
        return "differ"
    apart = sum(abs(p - m) for p, m in zip(predicted, live, strict=True))
    return "equal" if not apart else f"{apart:,} apart"


def live_table(advice: Advice, validated: list[Candidate], stream: dict[str, Any]) -> str:
    """Predicted against measured per setting run live: each figure, then ``live``, then
    live / predicted; ``#`` marks a figure outside its tolerance."""
    where = (
        f"topic {stream['input_topic']}"
        if "input_topic" in stream
        else f"{stream['workload']} at {stream['rate']:,.0f} records/s"
    )
    lines = [
        f"live: {len(validated)} setting(s) run as skewer demo runs them, {stream['records']:,} "
        f"records of {where}, W = {advice.n_workers}, C = {advice.cpu_cost_us:g} µs",
    ]
    header = (
        "scheme",
        "loads",
        "max/avg",
        "live",
        "ratio",
        "rate/s",
        "live",
        "ratio",
        "p50 ms",
        "live",
        "p99 ms",
        "live",
        "ratio",
    )
    rows = [header]
    for c in validated:
        loads, max_avg, rate, p50, p99 = c.checks()
        cells = [c.label, _loads_cell(loads) + ("#" if loads.within is False else "")]
        for check, shown in ((max_avg, True), (rate, True), (p50, False), (p99, True)):
            mark = "#" if check.within is False else ""
            cells += [_number_cell(check.predicted), _number_cell(check.measured) + mark]
            if shown:
                cells.append(_number_cell(check.ratio))
        rows.append(tuple(cells))
    lines.extend(aligned(rows, text_column=0))
    lines.append(
        "ratio = live / predicted; rate/s = steady rate (after 20 % applied); p50/p99 live = "
        "steady state; - not compared; # outside tolerance (docs/advise.md)"
    )
    return "\n".join(lines)

"""`skewer bench`: regenerate the recorded results in ``bench/results``.

``skewer bench paper [--quick] [--only NAME ...]`` runs every experiment module of
``bench/experiments`` (or the named ones) and writes ``<name>.md`` (headed by the command and
the machine), its PNG figures and its data as JSON. ``skewer bench speed`` measures routing,
simulation and planning speed into ``speed.md``. ``skewer bench worker`` races the worker stage
against Spark's own windowed count into ``worker_stage.md``; ``skewer bench latency`` measures
its latency under a paced stream, with and without two of its settings, into
``worker_latency.md``. ``skewer bench grouping`` measures the grouping stage against a
consume-and-produce passthrough at each ``--commit-interval-ms`` into ``grouping_stage.md``.
``skewer bench e2e`` runs the live pipeline once per live scheme (services must answer) into
``end_to_end.md`` (``--trigger real-time``: the workers in Spark's Real-Time Mode); ``skewer
bench triggers`` runs pkg and key under both triggers, saturated and paced, into
``triggers.md``; ``skewer bench migration`` runs each routing-table scheme live with its
controller, and in the simulator, into ``migration.md``.
``skewer bench scale`` runs the workers on 1, 2 and 4 Spark executors and the grouping stage on
topics of 1 and 3 replicas into ``scale.md``. ``skewer bench startup`` times ``skewer demo``
from the command to its first result, and a cold ``skewer work`` against a cold Spark
application, into ``startup.md``. ``skewer bench advise`` checks ``skewer advise``'s predictions
against live runs on three streams into ``advise.md``. ``--out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.cli.arguments import (
    add_command,
    add_commit_interval_argument,
    add_jit_argument,
    add_spark_master_argument,
    add_trigger_argument,
)
from pipeline.io.config import TRIGGERS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "bench",
        help="reproduce the papers' experiments and measure speed into bench/results",
        doc=__doc__,
        paragraph=0,
    )
    commands = parser.add_subparsers(dest="bench_command", metavar="WHAT", required=True)
    paper = commands.add_parser("paper", help="run the paper experiments")
    paper.add_argument("--quick", action="store_true", help="small sizes (seconds, for tests)")
    paper.add_argument("--only", nargs="+", metavar="NAME", help="experiment module names")
    paper.add_argument("--out", type=Path, help="output directory (default bench/results)")
    paper.set_defaults(handler=run_paper)
    speed = commands.add_parser("speed", help="measure routing, simulation and planning speed")
    speed.add_argument("--quick", action="store_true", help="10^6 keys instead of 10^7")
    speed.add_argument("--out", type=Path, help="output directory (default bench/results)")
    speed.set_defaults(handler=run_speed)
    worker = commands.add_parser(
        "worker", help="the worker stage against Spark's own groupBy(window, key).count()"
    )
    worker.add_argument("--records", type=int, default=1_000_000, help="records (1000000)")
    worker.add_argument("--rounds", type=int, default=3, help="measured rounds (3)")
    add_jit_argument(worker, "peak")  # quick writes worker_stage_quick
    worker.add_argument("--out", type=Path, help="output directory (default bench/results)")
    worker.set_defaults(handler=run_worker)
    latency = commands.add_parser(
        "latency", help="the worker stage's latency at a paced rate, with and without its settings"
    )
    latency.add_argument("--rate", type=float, default=14_000.0, help="records/s offered (14000)")
    latency.add_argument("--seconds", type=float, default=20.0, help="per run (20)")
    latency.add_argument("--rounds", type=int, default=2, help="rounds of every setting (2)")
    latency.add_argument("--out", type=Path, help="output directory (default bench/results)")
    latency.set_defaults(handler=run_latency)
    grouping = commands.add_parser(
        "grouping",
        help="the grouping stage against a consume-and-produce passthrough, per commit interval",
    )
    grouping.add_argument("--records", type=int, default=300_000, help="records (300000)")
    grouping.add_argument("--repeats", type=int, default=3, help="pairs per measurement (3)")
    grouping.add_argument("--only", nargs="+", metavar="SCHEME", help="these live schemes only")
    add_commit_interval_argument(grouping, several=True)
    grouping.add_argument("--out", type=Path, help="output directory (default bench/results)")
    grouping.set_defaults(handler=run_grouping)
    own = commands.add_parser(
        "own-topic", help="the grouping stage on a JSON and a bytes topic vs skewer's format"
    )
    own.add_argument("--records", type=int, default=300_000, help="records (300000)")
    own.add_argument("--rounds", type=int, default=3, help="measured rounds (3)")
    own.add_argument("--out", type=Path, help="output directory (default bench/results)")
    own.set_defaults(handler=run_own_topic)
    e2e = commands.add_parser("e2e", help="throughput and latency of the live pipeline per scheme")
    e2e.add_argument("--records", type=int, default=200_000, help="records per run (200000)")
    e2e.add_argument("--cpu-cost-us", type=float, default=1000.0, help="µs per record (1000)")
    e2e.add_argument("--only", nargs="+", metavar="SCHEME", help="these live schemes only")
    e2e.add_argument(
        "--no-latency", action="store_true", help="skip the latency table at fixed offered loads"
    )
    e2e.add_argument("--out", type=Path, help="output directory (default bench/results)")
    add_spark_master_argument(e2e)
    add_commit_interval_argument(e2e)
    add_trigger_argument(e2e)
    e2e.set_defaults(handler=run_e2e)
    triggers = commands.add_parser(
        "triggers", help="micro-batches and Real-Time Mode side by side: capacity and latency"
    )
    triggers.add_argument(
        "--trigger",
        nargs="+",
        choices=TRIGGERS,
        default=list(TRIGGERS),
        help="these triggers (both)",
    )
    triggers.add_argument("--seconds", type=float, default=20.0, help="per paced run (20)")
    triggers.add_argument("--only", nargs="+", metavar="SCHEME", help="these schemes (pkg key)")
    triggers.add_argument("--out", type=Path, help="output directory (default bench/results)")
    add_spark_master_argument(triggers)
    triggers.set_defaults(handler=run_triggers)
    migration = commands.add_parser(
        "migration", help="routing-table schemes live: planning, migrated state, hold-back"
    )
    migration.add_argument("--only", nargs="+", metavar="SCHEME", help="these schemes only")
    migration.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="controller round (2)"
    )
    migration.add_argument("--out", type=Path, help="output directory (default bench/results)")
    migration.set_defaults(handler=run_migration)
    soak = commands.add_parser(
        "soak", help="two runs for an hour under seeded kill -9s: exact, flat, recovered"
    )
    soak.add_argument("--minutes", type=float, default=60.0, help="how long (60)")
    soak.add_argument(
        "--load", type=float, default=0.5, help="share of the cluster's sustainable rate (0.5)"
    )
    soak.add_argument("--faults", type=int, default=24, help="how many kill -9s (24)")
    soak.add_argument("--seed", type=int, default=1, help="of the fault schedule and stream (1)")
    soak.add_argument(
        "--kinds", nargs="+", metavar="KIND", help="these fault kinds (all of bench.chaos.KINDS)"
    )
    soak.add_argument(
        "--rate", type=float, help="records/s of each run instead of --load x capacity"
    )
    soak.add_argument(
        "--recheck",
        type=Path,
        metavar="JSON",
        help="judge a recorded soak (its page's JSON) by this version's checks; runs nothing",
    )
    soak.add_argument("--out", type=Path, help="output directory (default bench/results)")
    soak.set_defaults(handler=run_soak)
    scale = commands.add_parser(
        "scale", help="workers on 1, 2, 4 Spark executors; the grouping stage at replication 1, 3"
    )
    scale.add_argument(
        "--records", type=int, default=400_000, help="records per executor run (400000)"
    )
    scale.add_argument(
        "--cpu-cost-us", type=float, default=0.0, help="emulated µs per record (0: none)"
    )
    scale.add_argument("--out", type=Path, help="output directory (default bench/results)")
    scale.set_defaults(handler=run_scale)
    startup = commands.add_parser(
        "startup", help="command to first result; a cold worker stage against a cold Spark app"
    )
    startup.add_argument("--records", type=int, default=600_000, help="demo records (600000)")
    startup.add_argument(
        "--rate", type=float, default=10_000.0, help="demo records/s offered (10000)"
    )
    startup.add_argument("--rounds", type=int, default=2, help="rounds of each part (2)")
    startup.add_argument(
        "--work-records", type=int, default=1_000_000, help="records of the cold runs (1000000)"
    )
    startup.add_argument("--only", dest="part", choices=("demo", "cold"), help="run this part only")
    startup.add_argument("--out", type=Path, help="output directory (default bench/results)")
    startup.set_defaults(handler=run_startup)
    advise = commands.add_parser(
        "advise", help="skewer advise's predictions against live runs on three streams"
    )
    advise.add_argument("--records", type=int, default=300_000, help="records per stream (300000)")
    advise.add_argument("--rate", type=float, default=14_000.0, help="records/s offered (14000)")
    advise.add_argument(
        "--timed-records",
        type=int,
        default=1_000_000,
        help="records of the timed advise run (1000000)",
    )
    advise.add_argument(
        "--loads-records",
        type=int,
        default=40_000,
        help="records each source-order scheme runs live for the loads check (40000; 0: none)",
    )
    advise.add_argument(
        "--only", nargs="+", choices=("zipf", "drift", "json"), help="these streams only"
    )
    advise.add_argument("--out", type=Path, help="output directory (default bench/results)")
    advise.set_defaults(handler=run_advise)


def _command(args: argparse.Namespace, *flags: str) -> str:
    """The command line recorded with the results: ``flags`` the subcommand's own, as given."""
    words = ["skewer", "bench", args.bench_command, *flags]
    if getattr(args, "quick", False):
        words.append("--quick")
    if getattr(args, "only", None):
        words += ["--only", *args.only]
    if args.out is not None:
        words += ["--out", str(args.out)]
    return " ".join(words)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_paper(args: argparse.Namespace) -> int:
    from bench import harness
    from pipeline.cli.arguments import UsageError

    try:
        outcomes = harness.run_experiments(
            args.only,
            quick=args.quick,
            out_dir=args.out or harness.RESULTS_DIR,
            command=_command(args),
            log=_log,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    failed = [o.module for o in outcomes if o.error]
    total = sum(o.seconds for o in outcomes)
    print(f"{len(outcomes) - len(failed)} experiment(s) written in {total:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _write(result: Any, out: Path | None, command: str, seconds: float) -> int:
    """Write ``result`` headed by its command and this machine, print it, say where it went."""
    from bench import harness

    paths = harness.write_result(
        result, out or harness.RESULTS_DIR, command, harness.machine_info(), seconds
    )
    print(result.markdown)
    _log(f"written: {', '.join(str(p) for p in paths)}")
    return 0


def _write_live(args: argparse.Namespace, command: str, run: Callable[[], Any]) -> int:
    """Run a live benchmark (``run()``) and write its result: a ValueError is a usage error
    (exit 2), a pipeline that failed is one line and exit 1. SIGTERM stops it as Ctrl-C does,
    through its clean-up: its runs' stages stopped, their topics and Redis keys deleted."""
    from pipeline.cli.arguments import UsageError, stop_on_sigterm
    from pipeline.runs.orchestrator import PipelineError

    stop_on_sigterm()
    began = time.perf_counter()
    try:
        result = run()
    except ValueError as error:
        raise UsageError(str(error)) from None
    except PipelineError as error:
        print(f"skewer bench {args.bench_command}: error: {error}", file=sys.stderr)
        return 1
    return _write(result, args.out, command, time.perf_counter() - began)


def run_speed(args: argparse.Namespace) -> int:
    from bench import speed

    began = time.perf_counter()
    result = speed.run(quick=args.quick)
    return _write(result, args.out, _command(args), time.perf_counter() - began)


def run_worker(args: argparse.Namespace) -> int:
    from bench import worker_stage
    from pipeline.cli.arguments import UsageError, require_at_least

    require_at_least(1, ("--records", args.records), ("--rounds", args.rounds))
    command = _command(args, "--records", str(args.records), "--rounds", str(args.rounds))
    began = time.perf_counter()
    try:
        result = worker_stage.run(
            records_count=args.records, rounds=args.rounds, jit=args.jit, log=_log
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    return _write(result, args.out, command, time.perf_counter() - began)


def run_latency(args: argparse.Namespace) -> int:
    from bench import worker_latency
    from pipeline.cli.arguments import UsageError, require_at_least

    require_at_least(1, ("--rounds", args.rounds))
    if not (args.rate > 0 and args.seconds > 0):
        raise UsageError("--rate and --seconds must be > 0")
    command = _command(
        args,
        "--rate",
        f"{args.rate:g}",
        "--seconds",
        f"{args.seconds:g}",
        "--rounds",
        str(args.rounds),
    )
    began = time.perf_counter()
    result = worker_latency.run(rate=args.rate, seconds=args.seconds, rounds=args.rounds, log=_log)
    return _write(result, args.out, command, time.perf_counter() - began)


def run_grouping(args: argparse.Namespace) -> int:
    from bench import grouping_stage
    from pipeline.cli.arguments import UsageError, require_at_least

    intervals = args.commit_interval_ms
    require_at_least(1, ("--records", args.records), ("--repeats", args.repeats))
    require_at_least(1, *(("--commit-interval-ms", ms) for ms in intervals))
    schemes = args.only or grouping_stage.live_schemes()
    unknown = [s for s in schemes if s not in grouping_stage.live_schemes()]
    if unknown:
        raise UsageError(
            f"--only: no live scheme {', '.join(unknown)}; live schemes: "
            + ", ".join(grouping_stage.live_schemes())
        )
    command = _command(
        args,
        "--records",
        str(args.records),
        "--repeats",
        str(args.repeats),
        "--commit-interval-ms",
        *map(str, intervals),
    )
    began = time.perf_counter()
    result = grouping_stage.run(
        records=args.records,
        workers=grouping_stage.WORKERS,
        schemes=schemes,
        repeats=args.repeats,
        commit_intervals_ms=intervals,
        log=_log,
    )
    return _write(result, args.out, command, time.perf_counter() - began)


def run_own_topic(args: argparse.Namespace) -> int:
    from bench import own_topic
    from pipeline.cli.arguments import require_at_least

    require_at_least(1, ("--records", args.records), ("--rounds", args.rounds))
    command = _command(args, "--records", str(args.records), "--rounds", str(args.rounds))
    began = time.perf_counter()
    result = own_topic.run(records=args.records, workers=8, rounds=args.rounds, log=_log)
    return _write(result, args.out, command, time.perf_counter() - began)


def run_e2e(args: argparse.Namespace) -> int:
    from bench import end_to_end
    from pipeline.cli.arguments import (
        require_at_least,
        spark_master_from_args,
        trigger_from_args,
    )
    from pipeline.io import config
    from pipeline.io.kafka_io import COMMIT_INTERVAL_MS

    require_at_least(1, ("--commit-interval-ms", args.commit_interval_ms))
    master = spark_master_from_args(args, config.load().spark_master)
    interval = args.commit_interval_ms
    trigger = trigger_from_args(args)
    command = _command(
        args,
        "--records",
        str(args.records),
        "--cpu-cost-us",
        f"{args.cpu_cost_us:g}",
        *(["--no-latency"] if args.no_latency else []),
        *(["--spark-master", master] if master != config.DEFAULT_SPARK_MASTER else []),
        *(["--commit-interval-ms", str(interval)] if interval != COMMIT_INTERVAL_MS else []),
        *(["--trigger", trigger] if trigger != config.MICRO_BATCH else []),
    )
    return _write_live(
        args,
        command,
        lambda: end_to_end.run(
            trigger=trigger,
            records=args.records,
            cpu_cost_us=args.cpu_cost_us,
            schemes=args.only or end_to_end.LIVE_SCHEMES,
            latency_loads=() if args.no_latency else end_to_end.LATENCY_LOADS,
            spark_master=master,
            commit_interval_ms=interval,
            log=_log,
        ),
    )


def run_triggers(args: argparse.Namespace) -> int:
    from bench import triggers
    from pipeline.cli.arguments import UsageError, spark_master_from_args
    from pipeline.io import config

    if not args.seconds > 0:
        raise UsageError(f"--seconds must be > 0, got {args.seconds}")
    master = spark_master_from_args(args, config.load().spark_master)
    command = _command(
        args,
        "--trigger",
        *args.trigger,
        *(["--seconds", f"{args.seconds:g}"] if args.seconds != triggers.SECONDS else []),
        *(["--spark-master", master] if master != config.DEFAULT_SPARK_MASTER else []),
    )
    return _write_live(
        args,
        command,
        lambda: triggers.run(
            triggers=args.trigger,
            schemes=args.only or triggers.SCHEMES,
            seconds=args.seconds,
            spark_master=master,
            log=_log,
        ),
    )


def run_soak(args: argparse.Namespace) -> int:
    from bench import chaos, soak
    from pipeline.cli.arguments import UsageError

    if args.recheck is not None:
        try:
            data = json.loads(args.recheck.read_text())
        except (OSError, ValueError) as error:
            raise UsageError(f"--recheck {args.recheck}: not a soak's JSON: {error}") from None
        if not isinstance(data, dict) or "samples" not in data or "faults" not in data:
            raise UsageError(f"--recheck {args.recheck}: not a soak's JSON (no samples, faults)")
        return _write(soak.recheck(data), args.out, soak.command_of(data), data["ran_s"])
    kinds = args.kinds or list(chaos.KINDS)
    command = _command(
        args,
        "--minutes",
        f"{args.minutes:g}",
        "--load",
        f"{args.load:g}",
        "--faults",
        str(args.faults),
        "--seed",
        str(args.seed),
        *(["--kinds", *kinds] if args.kinds else []),
        *(["--rate", f"{args.rate:g}"] if args.rate else []),
    )
    try:
        return _write_live(
            args,
            command,
            lambda: soak.run(
                minutes=args.minutes,
                load=args.load,
                faults=args.faults,
                seed=args.seed,
                kinds=kinds,
                rate=args.rate,
                log=_log,
            ),
        )
    except soak.SoakError as error:
        raise UsageError(str(error)) from None


def run_migration(args: argparse.Namespace) -> int:
    from bench import migration
    from pipeline.cli.arguments import UsageError

    if not args.interval > 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    interval = ["--interval", f"{args.interval:g}"] if args.interval != migration.INTERVAL else []
    command = _command(args, *interval)
    return _write_live(
        args,
        command,
        lambda: migration.run(
            schemes=args.only or migration.TABLE_SCHEMES, interval=args.interval, log=_log
        ),
    )


def run_scale(args: argparse.Namespace) -> int:
    from bench import scale
    from pipeline.cli.arguments import UsageError, require_at_least

    require_at_least(1, ("--records", args.records))
    if not args.cpu_cost_us >= 0:
        raise UsageError(f"--cpu-cost-us must be >= 0, got {args.cpu_cost_us:g}")
    command = _command(
        args, "--records", str(args.records), "--cpu-cost-us", f"{args.cpu_cost_us:g}"
    )
    return _write_live(
        args,
        command,
        lambda: scale.run(executor_records=args.records, cpu_cost_us=args.cpu_cost_us, log=_log),
    )


def run_startup(args: argparse.Namespace) -> int:
    from bench import startup
    from pipeline.cli.arguments import UsageError, require_at_least

    require_at_least(
        1,
        ("--records", args.records),
        ("--rounds", args.rounds),
        ("--work-records", args.work_records),
    )
    if not args.rate > 0:
        raise UsageError(f"--rate must be > 0, got {args.rate:g}")
    command = _command(
        args,
        "--records",
        str(args.records),
        "--rate",
        f"{args.rate:g}",
        "--rounds",
        str(args.rounds),
        "--work-records",
        str(args.work_records),
        *(["--only", args.part] if args.part else []),
    )
    began = time.perf_counter()
    try:
        result = startup.run(
            records=args.records,
            rate=args.rate,
            rounds=args.rounds,
            work_records=args.work_records,
            parts=[args.part] if args.part else startup.PARTS,
            log=_log,
        )
    except startup.StartupBenchError as error:
        print(f"skewer bench startup: error: {error}", file=sys.stderr)
        return 1
    return _write(result, args.out, command, time.perf_counter() - began)


def run_advise(args: argparse.Namespace) -> int:
    from bench import advise
    from pipeline.cli.arguments import UsageError, require_at_least
    from pipeline.runs.advise import SampleError
    from pipeline.runs.advise_live import LiveRunError

    require_at_least(1, ("--records", args.records), ("--timed-records", args.timed_records))
    if not args.rate > 0:
        raise UsageError(f"--rate must be > 0, got {args.rate:g}")
    if args.loads_records < 0:
        raise UsageError(f"--loads-records must be >= 0, got {args.loads_records}")
    command = _command(
        args,
        "--records",
        str(args.records),
        "--rate",
        f"{args.rate:g}",
        "--timed-records",
        str(args.timed_records),
        "--loads-records",
        str(args.loads_records),
    )
    began = time.perf_counter()
    try:
        result = advise.run(
            records=args.records,
            rate=args.rate,
            timed_records=args.timed_records,
            streams=args.only or tuple(advise.STREAMS),
            log=_log,
            loads_records=args.loads_records,
        )
    except (LiveRunError, SampleError) as error:
        print(f"skewer bench advise: error: {error}", file=sys.stderr)
        return 1
    return _write(result, args.out, command, time.perf_counter() - began)

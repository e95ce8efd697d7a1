"""Start-up: from the command to the first result, and a cold worker stage against a cold Spark
application.

What it measures and how: :data:`METHOD`, the prose of bench/results/startup.md.
``python -m bench.startup --topic TOPIC`` is the Spark contender's own process
(:func:`spark_application`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.experiment import (
    ExperimentResult,
    median_or_none,
    method_markdown,
    or_dash,
    ratio_or_dash,
    ratio_or_none,
)
from bench.worker_stage import (
    WINDOW_MS,
    WORKERS,
    WORKLOAD,
    Expected,
    counts_exact,
    prefill,
    spark_group_by_count,
)
from pipeline.io import config, kafka_io
from pipeline.io.spark_session import CLASS_ARCHIVE_ENV, class_archive_path
from pipeline.io.state_store import StateStore
from pipeline.stages import worker_job

#: What the benchmark measures and how: the prose of bench/results/startup.md.
METHOD = """\
``skewer bench startup`` writes ``bench/results/startup.md`` (and ``.json``), headed by the
command and the machine. Needs a running broker and Redis (``skewer services up``); ``--only
demo`` or ``--only cold`` runs one of its two parts.

Command to first result. ``skewer demo --scheme pkg --records N --rate R --json`` runs as a
fresh process (``--records``, ``--rate``; W = 8 workers, 2 sources, zero CPU cost, the services
already up), ``--rounds`` times, one after the other. Its JSON carries what is reported: the
seconds from the command (the process's own start, interpreter and imports included) to the
first record a worker applied (``first_applied_seconds``: the workers' counters, polled every
0.1 s); the p99 latency of the whole run, of the steady state (the records applied after the
first 20 % of them were) and of every 5 s of wall time (``latency_windows``); and the start-up
timeline. Two ratios say how far start-up lifts latency above the warm pipeline's: the worst
5 s window's p99 and the whole run's p99, each over the steady p99. Quantiles are the upper
edges of the latency histogram's buckets (20 per decade), so a ratio moves in steps of about
1.12. The timeline and the windows shown are the median round's, by seconds to the first
record applied (the lower of the middle two for an even number of rounds).

A cold worker stage against a cold Spark application. One ``work`` topic of W = 8 partitions is
filled once with ``--work-records`` records the way ``skewer bench worker`` fills its own
(:func:`bench.worker_stage.prefill`: ``zipf:z=1.2,keys=100000`` routed by PKG, event times over
6 windows of 10 s, END_OF_STREAM on every partition). Each contender is a fresh process, timed
from its launch to its exit, so its interpreter, JVM, SparkSession and Python workers count:

- **skewer**: ``python -m pipeline.cli work --until-end`` over that topic (``--topic-prefix``
  names it), a fresh ``--run-id`` and ``--checkpoint`` each time, in the ``local[T]`` session
  the job builds by default. Afterwards every (window, key) count in Redis, summed over the
  workers' partial state, must equal the count computed from the records written;
- **Spark**: ``python -m bench.startup --topic TOPIC``, a session built as the worker job builds
  its own (:func:`pipeline.io.spark_session.build_spark_session`, the same ``local[T]``), then
  the query of ``skewer bench worker`` (:func:`bench.worker_stage.spark_group_by_count`:
  ``groupBy(window, key).count()``, ``trigger(availableNow=True)``, ``noop`` sink) to its end.

Each contender runs with the driver's class-data-sharing archive (the default environment: the
JVM maps it once it has been built, :func:`pipeline.io.spark_session.class_archive_path`) and
without it (``SKEWER_SPARK_CLASS_ARCHIVE=off``, as a Spark application starts): four
contenders per round, in one order in odd rounds and the reverse in even ones, after one
unmeasured launch of skewer and of Spark, so that no measured contender is the first to read the
jars and Python modules from disk. The target compares what a user gets from each: skewer as it
ships (with the archive) against a Spark application as a user writes it (without); the ratios
of like against like are given beside it.
"""

RECORDS = 600_000
RATE = 10_000.0
ROUNDS = 2
WORK_RECORDS = 1_000_000
#: The two parts, for ``--only``.
PARTS = ("demo", "cold")
TARGET_FIRST_APPLIED_SECONDS = 12.0
#: Worst 5 s window's p99, and the whole run's, over the steady p99: at most this.
TARGET_P99_RATIO = 1.5
#: skewer's cold seconds over Spark's: at most this.
TARGET_COLD_RATIO = 1.0
#: Part 2's contenders (who, with the class archive?), in the order of odd rounds.
CONTENDERS = (("skewer", True), ("Spark", True), ("skewer", False), ("Spark", False))
#: Seconds a contender process may take before the benchmark gives up on it.
CONTENDER_TIMEOUT = 900.0
SPARK_APP_NAME = "skewer-bench-startup-spark"


class StartupBenchError(Exception):
    """A measured process failed or said something the benchmark cannot read; one line."""


def environment(archive: bool) -> dict[str, str]:
    """This process's environment, with the driver's class archive as found (``archive``) or
    switched off: the variable's other values (a training run's) never leak into a contender."""
    env = dict(os.environ)
    env.pop(CLASS_ARCHIVE_ENV, None)
    if not archive:
        env[CLASS_ARCHIVE_ENV] = "off"
    return env


def launch(command: Sequence[str], env: dict[str, str], timeout: float) -> tuple[float, str]:
    """Run ``command`` to its end; seconds from launch to exit, and its standard output."""
    what = f"python -m {' '.join(command[2:4])}"
    began = time.perf_counter()
    try:
        done = subprocess.run(
            list(command), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise StartupBenchError(f"{what}: no exit in {timeout:g} s") from None
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise StartupBenchError(f"{what} exited {done.returncode}: {tail}")
    return seconds, done.stdout


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object a ``--json`` command prints last."""
    lines = stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise StartupBenchError(f"no JSON object at the end of: {stdout[-200:]!r}") from None


# Part 1: command to first result.


def demo_round(records: int, rate: float, env: dict[str, str]) -> dict[str, Any]:
    """One ``skewer demo`` process: its JSON summary and the seconds from launch to exit."""
    command = [sys.executable, "-m", "pipeline.cli", "demo", "--scheme", "pkg"]
    command += ["--records", str(records), "--rate", f"{rate:g}", "--json", "--no-start"]
    seconds, stdout = launch([*command, "--quiet"], env, records / rate + CONTENDER_TIMEOUT)
    return {**last_json(stdout), "process_seconds": seconds}


def worst_window_p99(windows: Sequence[dict[str, Any]]) -> float | None:
    """The highest p99 of the 5 s windows that applied records.

    >>> worst_window_p99([{"p99_ms": 631.0}, {"p99_ms": None}, {"p99_ms": 1000.0}])
    1000.0
    """
    measured = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    return max(measured) if measured else None


def demo_figures(demo: dict[str, Any]) -> dict[str, Any]:
    """What one round reports, from the demo's JSON."""
    steady = demo["latency_steady_p99_ms"]
    worst = worst_window_p99(demo["latency_windows"])
    return {
        "first_applied_seconds": demo["first_applied_seconds"],
        "worst_window_p99_ms": worst,
        "whole_p99_ms": demo["latency_p99_ms"],
        "steady_p99_ms": steady,
        "worst_window_ratio": ratio_or_none(worst, steady),
        "whole_ratio": ratio_or_none(demo["latency_p99_ms"], steady),
        "process_seconds": demo["process_seconds"],
        "exact": demo["exact"],
    }


def verdict(values: Sequence[float | None], target: float) -> str:
    """Whether the median of ``values`` is at most ``target``, and in how many of them.

    >>> verdict([9.0, 13.0, 11.0], 12.0)
    'met (in 2 of 3 rounds)'
    >>> verdict([13.0], 12.0)
    'NOT met (met in 0 of 1 rounds)'
    >>> verdict([None], 1.5)
    'not measured'
    """
    measured = [v for v in values if v is not None]
    if not measured:
        return "not measured"
    met = sum(v <= target for v in measured)
    if statistics.median(measured) <= target:
        return f"met (in {met} of {len(values)} rounds)"
    return f"NOT met (met in {met} of {len(values)} rounds)"


def demo_table(rows: Sequence[dict[str, Any]]) -> str:
    """Part 1's figures per round, plain markdown.

    >>> print(demo_table([{"round": 1, "first_applied_seconds": 9.5, "worst_window_p99_ms": 891.3,
    ...     "whole_p99_ms": 1000.0, "steady_p99_ms": 631.0, "worst_window_ratio": 1.41,
    ...     "whole_ratio": 1.58, "process_seconds": 80.2, "exact": True}]).splitlines()[-1])
    | 1 | 9.5 | 891 | 1,000 | 631 | 1.41 | 1.58 | 80.2 | yes |
    """
    lines = [
        "| round | command -> first applied (s) | worst 5 s p99 (ms) | whole-run p99 (ms) "
        "| steady p99 (ms) | worst 5 s / steady | whole run / steady | demo process (s) | exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        cells = [
            or_dash(row["first_applied_seconds"], ".1f"),
            or_dash(row["worst_window_p99_ms"], ",.0f"),
            or_dash(row["whole_p99_ms"], ",.0f"),
            or_dash(row["steady_p99_ms"], ",.0f"),
            or_dash(row["worst_window_ratio"], ".2f"),
            or_dash(row["whole_ratio"], ".2f"),
            f"{row['process_seconds']:.1f}",
            "yes" if row["exact"] else "NO",
        ]
        lines.append(f"| {row['round']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def timeline_table(timeline: Sequence[dict[str, Any]]) -> str:
    """The demo's start-up timeline: event, seconds since the command, gap since the previous.

    >>> print(timeline_table([{"event": "command started", "seconds": 0.0},
    ...                       {"event": "services checked", "seconds": 0.57}]))
    | event | seconds since the command | gap (s) |
    |---|---:|---:|
    | command started | 0.00 |  |
    | services checked | 0.57 | +0.57 |
    """
    lines = ["| event | seconds since the command | gap (s) |", "|---|---:|---:|"]
    previous: float | None = None
    for entry in timeline:
        gap = "" if previous is None else f"+{entry['seconds'] - previous:.2f}"
        lines.append(f"| {entry['event']} | {entry['seconds']:.2f} | {gap} |")
        previous = entry["seconds"]
    return "\n".join(lines)


def window_table(windows: Sequence[dict[str, Any]], steady_p99_ms: float | None) -> str:
    """The demo's latency per 5 s of wall time, each p99 also over the steady p99.

    >>> print(window_table([{"start_s": 15.0, "records": 46400, "p50_ms": 501.2,
    ...                      "p99_ms": 891.3}], 631.0))
    | window start (s since the command) | records | p50 (ms) | p99 (ms) | p99 / steady p99 |
    |---:|---:|---:|---:|---:|
    | 15.0 | 46,400 | 501 | 891 | 1.41 |
    """
    lines = [
        "| window start (s since the command) | records | p50 (ms) | p99 (ms) | p99 / steady p99 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for w in windows:
        lines.append(
            f"| {w['start_s']:.1f} | {w['records']:,} | {or_dash(w['p50_ms'], ',.0f')} "
            f"| {or_dash(w['p99_ms'], ',.0f')} | {ratio_or_dash(w['p99_ms'], steady_p99_ms)} |"
        )
    return "\n".join(lines)


def demo_part(
    records: int, rate: float, rounds: int, log: Callable[[str], None]
) -> tuple[list[str], dict[str, Any]]:
    """Part 1: ``rounds`` demo processes; its markdown lines and data."""
    env = environment(archive=True)
    demos: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for index in range(rounds):
        demo = demo_round(records, rate, env)
        demos.append(demo)
        rows.append({"round": index + 1, **demo_figures(demo)})
        first = or_dash(demo["first_applied_seconds"], ".1f")
        whole, steady = demo["latency_p99_ms"], demo["latency_steady_p99_ms"]
        log(
            f"demo round {index + 1}: first applied {first} s, p99 whole/steady {whole}/{steady} ms"
        )
    by_start = sorted(range(rounds), key=lambda i: rows[i]["first_applied_seconds"] or float("inf"))
    median = by_start[(rounds - 1) // 2]
    shown = demos[median]
    firsts = [row["first_applied_seconds"] for row in rows]
    worst = [row["worst_window_ratio"] for row in rows]
    whole = [row["whole_ratio"] for row in rows]
    lines = [
        "## Command to first result",
        "",
        f"`skewer demo --scheme pkg --records {records} --rate {rate:g} --json`: "
        f"{records:,} records at {rate:,.0f} records/s, W = 8 workers, 2 sources, zero CPU cost.",
        "",
        demo_table(rows),
        "",
        f"- command -> first applied record: median {or_dash(median_or_none(firsts), '.1f')} s "
        f"(target <= {TARGET_FIRST_APPLIED_SECONDS:g} s: "
        f"{verdict(firsts, TARGET_FIRST_APPLIED_SECONDS)});",
        f"- worst 5 s window p99 / steady p99: median {or_dash(median_or_none(worst), '.2f')} "
        f"(target <= {TARGET_P99_RATIO:g}: {verdict(worst, TARGET_P99_RATIO)});",
        f"- whole-run p99 / steady p99: median {or_dash(median_or_none(whole), '.2f')} "
        f"(target <= {TARGET_P99_RATIO:g}: {verdict(whole, TARGET_P99_RATIO)});",
        f"- every count exact: {'yes' if all(row['exact'] for row in rows) else 'NO'}.",
        "",
        f"Start-up timeline of the median round (round {median + 1}):",
        "",
        timeline_table(shown["timeline"]),
        "",
        f"Latency per 5 s of wall time, round {median + 1}:",
        "",
        window_table(shown["latency_windows"], shown["latency_steady_p99_ms"]),
    ]
    data = {
        "records": records,
        "rate": rate,
        "rows": rows,
        "median_round": median + 1,
        "timeline": shown["timeline"],
        "latency_windows": shown["latency_windows"],
    }
    return lines, data


# Part 2: a cold worker stage against a cold Spark application.


def spark_application(topic: str) -> dict[str, float]:
    """The Spark contender, in its own process: a session as the worker job builds its own,
    Spark's windowed count over ``topic`` to its end, the session stopped; its seconds."""
    from pipeline.io.spark_session import build_spark_session

    settings = config.load()
    slots = max(worker_job.default_tasks(WORKERS), 2)
    began = time.perf_counter()
    spark = build_spark_session(
        SPARK_APP_NAME,
        master=f"local[{slots},{worker_job.TASK_ATTEMPTS}]",
        shuffle_partitions=slots,
        settings=settings,
    )
    session_seconds = time.perf_counter() - began
    try:
        query_seconds = spark_group_by_count(spark, settings.kafka_bootstrap, topic)
    finally:
        spark.stop()
    return {"session_seconds": session_seconds, "query_seconds": query_seconds}


def spark_cold(topic: str, env: dict[str, str]) -> dict[str, Any]:
    """One Spark contender process over ``topic``, launch to exit."""
    command = [sys.executable, "-m", "bench.startup", "--topic", topic]
    seconds, stdout = launch(command, env, CONTENDER_TIMEOUT)
    return {"seconds": seconds, **last_json(stdout)}


def skewer_cold(
    settings: config.Settings, prefix: str, expected: Expected, env: dict[str, str]
) -> dict[str, Any]:
    """One ``skewer work --until-end`` process over the topic ``{prefix}work``, launch to exit,
    under a fresh run id and checkpoint; its counts checked, then its Redis keys deleted."""
    run_id = f"bench-startup-{uuid.uuid4().hex[:8]}"
    folder = Path(tempfile.mkdtemp(prefix="skewer-bench-startup-"))
    command = [sys.executable, "-m", "pipeline.cli", "work", "--workers", str(WORKERS)]
    command += ["--sources", "1", "--window-ms", str(WINDOW_MS), "--topic-prefix", prefix]
    command += ["--run-id", run_id, "--checkpoint", str(folder / "checkpoint")]
    store = StateStore.from_url(settings.redis_url, run_id)
    try:
        seconds, stdout = launch([*command, "--until-end", "--json"], env, CONTENDER_TIMEOUT)
        summary = last_json(stdout)
        exact = summary["finished"] and counts_exact(store, expected)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        store.delete_run()
        store.client.close()
    # The job's own clock: its query's start to the session stopped (WorkSummary.seconds).
    return {"seconds": seconds, "job_seconds": summary["seconds"], "exact": exact}


def contender_name(who: str, archive: bool) -> str:
    """>>> contender_name("Spark", False)
    'Spark, no archive'
    """
    return f"{who}, {'archive' if archive else 'no archive'}"


def cold_table(rows: Sequence[dict[str, Any]]) -> str:
    """Part 2's seconds per round and contender, the medians and skewer / Spark per variant."""
    names = [contender_name(*c) for c in CONTENDERS]
    lines = [
        "| round | " + " (s) | ".join(names) + " (s) | skewer / Spark, archive "
        "| skewer / Spark, no archive | skewer exact |",
        "|---" + "|---:" * (len(names) + 2) + "|---|",
    ]
    for row in [*rows, {"round": "median", **cold_medians(rows)}]:
        seconds = [or_dash(row.get(name), ".1f") for name in names]
        ratios = [cold_ratio(row, archive) for archive in (True, False)]
        exact = "" if row["round"] == "median" else ("yes" if row["exact"] else "NO")
        lines.append(
            f"| {row['round']} | "
            + " | ".join([*seconds, *(or_dash(r, ".2f") for r in ratios), exact])
            + " |"
        )
    return "\n".join(lines)


def cold_medians(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Each contender's median seconds over the rounds."""
    return {
        name: median_or_none(row[name] for row in rows)
        for name in (contender_name(*c) for c in CONTENDERS)
    }


def cold_ratio(row: dict[str, Any], archive: bool) -> float | None:
    """skewer's seconds over Spark's in ``row``, for one variant."""
    return ratio_or_none(
        row.get(contender_name("skewer", archive)), row.get(contender_name("Spark", archive))
    )


def cold_part(
    settings: config.Settings, work_records: int, rounds: int, log: Callable[[str], None]
) -> tuple[list[str], dict[str, Any]]:
    """Part 2: one filled topic, a warm-up launch of each, then ``rounds`` rounds of the four
    contenders; its markdown lines and data."""
    prefix = f"bench-startup-{uuid.uuid4().hex[:8]}-"
    topic = kafka_io.RunNames(topic_prefix=prefix).work_topic
    rows: list[dict[str, Any]] = []
    details: list[dict[str, Any]] = []
    try:
        began = time.perf_counter()
        expected = prefill(settings.kafka_bootstrap, topic, work_records)
        log(f"prefilled {work_records:,} records in {time.perf_counter() - began:.1f} s")
        warm = [
            skewer_cold(settings, prefix, expected, environment(archive=True)),
            spark_cold(topic, environment(archive=True)),
        ]
        log(f"warm-up: skewer {warm[0]['seconds']:.1f} s, Spark {warm[1]['seconds']:.1f} s")
        for index in range(rounds):
            order = CONTENDERS if index % 2 == 0 else CONTENDERS[::-1]
            row: dict[str, Any] = {"round": index + 1, "exact": True}
            for who, archive in order:
                env = environment(archive)
                if who == "skewer":
                    outcome = skewer_cold(settings, prefix, expected, env)
                    row["exact"] = row["exact"] and outcome["exact"]
                else:
                    outcome = spark_cold(topic, env)
                name = contender_name(who, archive)
                row[name] = outcome["seconds"]
                details.append({"round": index + 1, "contender": name, **outcome})
                log(f"cold round {index + 1}, {name}: {outcome['seconds']:.1f} s")
            rows.append(row)
    finally:
        kafka_io.delete_topics(settings.kafka_bootstrap, [topic])
    medians = cold_medians(rows)
    ratios = {archive: cold_ratio(medians, archive) for archive in (True, False)}
    shipped = ratio_or_none(
        medians[contender_name("skewer", True)], medians[contender_name("Spark", False)]
    )
    saved = {
        who: _difference(medians[contender_name(who, False)], medians[contender_name(who, True)])
        for who in ("skewer", "Spark")
    }
    exact = warm[0]["exact"] and all(row["exact"] for row in rows)
    archive = class_archive_path(settings)
    present = archive is not None and archive.is_file()
    tasks = worker_job.default_tasks(WORKERS)
    lines = [
        "## A cold worker stage against a cold Spark application",
        "",
        f"{work_records:,} records of `{WORKLOAD}` routed by PKG into W = {WORKERS} partitions; "
        f"each contender's own session `local[{max(tasks, 2)}]`. The driver's class archive "
        f"was {'present' if present else 'absent (both variants ran without it)'} during "
        "the runs.",
        "",
        cold_table(rows),
        "",
        f"- skewer as it ships (archive) / a Spark application (no archive): "
        f"{or_dash(shipped, '.2f')} (target <= {TARGET_COLD_RATIO:.1f}: "
        f"{_met(shipped, TARGET_COLD_RATIO)});",
        f"- like for like: skewer / Spark, both with the archive {or_dash(ratios[True], '.2f')}, "
        f"both without {or_dash(ratios[False], '.2f')};",
        f"- what the archive saves (median without - median with): skewer "
        f"{or_dash(saved['skewer'], '+.1f')} s, Spark {or_dash(saved['Spark'], '+.1f')} s;",
        f"- every skewer count exact (the warm-up's too): {'yes' if exact else 'NO'}.",
    ]
    data = {
        "work_records": work_records,
        "workers": WORKERS,
        "tasks": tasks,
        "class_archive_present": present,
        "rows": rows,
        "medians": medians,
        "ratio_shipped": shipped,
        "ratio_archive": ratios[True],
        "ratio_no_archive": ratios[False],
        "exact": exact,
        "warm_up": warm,
        "runs": details,
    }
    return lines, data


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _met(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= target else "NOT met"


def run(
    *,
    records: int = RECORDS,
    rate: float = RATE,
    rounds: int = ROUNDS,
    work_records: int = WORK_RECORDS,
    parts: Sequence[str] = PARTS,
    log: Callable[[str], None] = lambda _line: None,
) -> ExperimentResult:
    """Run the chosen parts, one after the other; the services must answer."""
    if records < 1 or work_records < 1 or rounds < 1 or not rate > 0:
        raise ValueError("records, work records and rounds must be >= 1, rate > 0")
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(sorted(unknown))}; valid: {', '.join(PARTS)}")
    settings = config.load()
    kafka_io.require_kafka(settings.kafka_bootstrap)
    body: list[str] = []
    data: dict[str, Any] = {}
    if "demo" in parts:
        lines, data["demo"] = demo_part(records, rate, rounds, log)
        body += ["", *lines]
    if "cold" in parts:
        lines, data["cold"] = cold_part(settings, work_records, rounds, log)
        body += ["", *lines]
    method = re.sub(r":\w+:`", "`", method_markdown(METHOD))
    return ExperimentResult(
        name="startup",
        title="Start-up: command to first result, and a cold worker stage against cold Spark",
        markdown=method + "\n" + "\n".join(body) + "\n",
        data=data,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.startup --topic TOPIC``: the Spark contender; its seconds as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=main.__doc__)
    parser.add_argument("--topic", required=True, help="the filled work topic")
    args = parser.parse_args(argv)
    print(json.dumps(spark_application(args.topic)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

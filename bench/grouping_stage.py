"""The grouping stage's throughput against a consume-and-produce passthrough, per commit interval.

``skewer bench grouping`` writes ``bench/results/grouping_stage.md`` (and ``.json``), headed by
the command and the machine. Needs a running broker and Redis (``skewer services up``).

What is compared. One input topic ``keys`` (one partition) holds ``--records`` records of
``zipf:z=1.2,keys=100000`` written by :mod:`producers.kafka_producer`. Each measurement runs one
source over the whole partition from offset 0, with its own consumer group and
``transactional.id``, into a ``work`` topic of W partitions:

- **passthrough**: :class:`Passthrough`, the stage's own loop (same clients, batch size,
  commit interval, one transaction per batch with the consumed offset, the same Redis counter
  update per batch) whose batch step only forwards each consumed record's key and value to
  partition ``i mod W``: no decoding, validation or routing.
- **a scheme**: :class:`~pipeline.stages.grouping.GroupingSource` itself.

Both stop when they have consumed every input record (the last batch asks for just the records
left, so no run waits out an interval at its end); the rate is records divided by the wall time
from the arrival of the first batch to the last commit. Measurements come in pairs, passthrough
and scheme back to back (the order alternating), and each ratio divides the scheme's rate by
its own pair's passthrough, so a busy neighbour slows both sides alike. Each pair runs at one
``--commit-interval-ms`` (the longest a source waits to fill a batch); with several, each
repeat runs a scheme's pairs at every interval in turn (the order rotating): the intervals are
measured side by side, on the same machine and load.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bench.experiment import ExperimentResult
from operators import registry
from pipeline.io import config, kafka_io
from pipeline.io.dead_letters import REASONS
from pipeline.io.redis_client import connect_redis
from pipeline.io.state_store import StateStore
from pipeline.stages import grouping
from pipeline.stages.grouping import BatchOutput, GroupingSource, SourceWatermark, StageConfig

TARGET_RATIO = 0.8
WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"
WORKERS = 8


def live_schemes() -> list[str]:
    """Every registered scheme a live source can run (simulator-only ones excluded)."""
    return [name for name in registry.names() if name not in registry.SIMULATOR_ONLY]


class TimedSource(GroupingSource):
    """The stage's source, timed from the arrival of its first batch to the end of its last."""

    started_at = ended_at = 0.0
    cpu_started_at = cpu_ended_at = 0.0
    thread_started_at = thread_ended_at = 0.0
    #: The input's records, when known: the last batch asks for no more than are left, so it
    #: does not wait out the commit interval for records that never come (that wait, up to
    #: an interval per run, is no part of the loop's throughput).
    total: int | None = None

    def process(self, messages: list[Any]) -> None:
        # The clock starts when the first batch has arrived: the consumer's first fetch after
        # start-up (connections, offset lookup; 0.5 s or so, in steps of the poll timeout) is
        # no part of the loop's throughput and made short runs bimodal.
        if self.started_at == 0.0:
            self.started_at = time.perf_counter()
            self.cpu_started_at = time.process_time()
            self.thread_started_at = time.thread_time()
        super().process(messages)
        self.ended_at = time.perf_counter()
        self.cpu_ended_at = time.process_time()
        self.thread_ended_at = time.thread_time()
        left = None if self.total is None else self.total - self.summary.records
        if left is not None and 0 < left < self.config.batch_size:
            self.config = dataclasses.replace(self.config, batch_size=left)

    @property
    def rate(self) -> float:
        """Records per wall-clock second."""
        return self.summary.records / max(self.ended_at - self.started_at, 1e-9)

    @property
    def thread_us(self) -> float:
        """CPU microseconds per record of the source's own thread (the Python loop)."""
        return 1e6 * (self.thread_ended_at - self.thread_started_at) / max(self.summary.records, 1)

    @property
    def cpu_rate(self) -> float:
        """Records per CPU-second of this process (all its threads: librdkafka's too)."""
        return self.summary.records / max(self.cpu_ended_at - self.cpu_started_at, 1e-9)


class Passthrough(TimedSource):
    """The same loop and transactions, forwarding records unread to partition ``i mod W``."""

    def route_batch(self, messages: list[Any], watermark: SourceWatermark) -> BatchOutput:
        n = len(messages)
        keys = [m.key() for m in messages]
        values = [m.value() for m in messages]
        workers = self.config.n_workers
        first = self.summary.records % workers
        partitions = ((first + np.arange(n)) % workers).tolist()
        return BatchOutput(
            keys,
            values,  # type: ignore[arg-type]
            partitions,
            reasons=np.full(n, -1, dtype=np.int8),
            data_rows=np.arange(n),
            routed=np.bincount(partitions, minlength=workers),
            dead_letter_counts=np.zeros(len(REASONS), dtype=np.int64),
        )


def measure(
    cls: type[TimedSource], stage: StageConfig, total: int, redis_client: Any
) -> dict[str, float]:
    """Run one source of class ``cls`` over the ``total`` input records; its rate."""
    source = cls(stage, 0, redis_client)
    source.total = total
    source.run(lambda: source.summary.records >= total)
    if source.summary.records != total:
        raise RuntimeError(f"{cls.__name__} read {source.summary.records} of {total} records")
    return {
        "rate": source.rate,
        "cpu_rate": source.cpu_rate,
        "thread_us": source.thread_us,
        "seconds": source.ended_at - source.started_at,
        "records": source.summary.records,
        # committed transactions of batches (markers-only ones too; not the start's announcement)
        "transactions": source.summary.batches,
    }


def table(rows: list[dict[str, Any]], intervals: list[int]) -> str:
    """The per-scheme table: records/s and the ratio to the passthrough at each interval, and
    the median ratio of all the scheme's pairs (every interval's), which the target judges.

    Example (the table is plain markdown):
        >>> print(table([{"scheme": "key", "commit_interval_ms": 100, "rate": 2e5,
        ...     "passthrough": 2.2e5, "ratio": 0.909, "ratios": [0.909, 0.95, 0.7]}], [100]))
        | scheme | 100 ms: records/s | passthrough | ratio | all pairs' median | >= 0.8 |
        |---|---:|---:|---:|---:|---|
        | key | 200,000 | 220,000 | 0.91 | 0.91 | yes |
    """
    header = ["scheme"]
    for ms in intervals:
        header += [f"{ms} ms: records/s", "passthrough", "ratio"]
    header.append("all pairs' median")
    lines = [
        "| " + " | ".join(header) + " | >= 0.8 |",
        "|---|" + "---:|" * (len(header) - 1) + "---|",
    ]
    by_key = {(row["scheme"], row["commit_interval_ms"]): row for row in rows}
    for scheme in dict.fromkeys(row["scheme"] for row in rows):
        cells = [scheme]
        ratios: list[float] = []
        for ms in intervals:
            row = by_key[(scheme, ms)]
            ratios += row["ratios"]
            cells += [f"{row['rate']:,.0f}", f"{row['passthrough']:,.0f}", f"{row['ratio']:.2f}"]
        median = float(np.median(ratios))
        met = "yes" if median >= TARGET_RATIO else "**no**"
        lines.append("| " + " | ".join(cells) + f" | {median:.2f} | {met} |")
    return "\n".join(lines)


def interval_rows(rows: list[dict[str, Any]], intervals: list[int]) -> list[dict[str, Any]]:
    """Per commit interval, the medians over the schemes' rows; ``vs_first`` divides the
    median scheme rate by the first interval's.

    >>> rows = [{"commit_interval_ms": ms, "rate": r, "passthrough": 2 * r, "ratio": 0.5,
    ...     "cpu_rate": r, "thread_us": 1.0, "transactions": 10, "records": 1000}
    ...     for ms, r in ((100, 4.0), (100, 6.0), (5, 3.0))]
    >>> [(r["commit_interval_ms"], r["rate"], r["vs_first"]) for r in interval_rows(rows, [100, 5])]
    [(100, 5.0, 1.0), (5, 3.0, 0.6)]
    """
    out: list[dict[str, Any]] = []
    for ms in intervals:
        at = [row for row in rows if row["commit_interval_ms"] == ms]
        summary: dict[str, Any] = {"commit_interval_ms": ms}
        for name in ("rate", "passthrough", "ratio", "cpu_rate", "thread_us", "transactions"):
            summary[name] = float(np.median([row[name] for row in at]))
        summary["records_per_transaction"] = float(
            np.median([row["records"] / max(row["transactions"], 1) for row in at])
        )
        out.append(summary)
    for summary in out:
        summary["vs_first"] = summary["rate"] / out[0]["rate"]
    return out


def interval_table(summaries: list[dict[str, Any]]) -> str:
    """The per-interval table: the schemes' medians at each commit interval.

    Example (a row of the table; its header names the columns in this order):
        >>> print(interval_table([{"commit_interval_ms": 5, "rate": 2e5, "passthrough": 2.5e5,
        ...     "ratio": 0.8, "vs_first": 0.9, "cpu_rate": 3e5, "thread_us": 2.0,
        ...     "transactions": 60.0, "records_per_transaction": 5000.0}]).splitlines()[-1])
        | 5 ms | 200,000 | 0.90 | 250,000 | 0.80 | 300,000 | 2.00 | 60 | 5,000 |
    """
    lines = [
        "| commit interval | records/s | vs first | passthrough records/s | ratio "
        "| records per CPU-s | loop thread us/record | transactions | records per transaction |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['commit_interval_ms']} ms | {s['rate']:,.0f} | {s['vs_first']:.2f} | "
            f"{s['passthrough']:,.0f} | {s['ratio']:.2f} | {s['cpu_rate']:,.0f} | "
            f"{s['thread_us']:.2f} | {s['transactions']:,.0f} | "
            f"{s['records_per_transaction']:,.0f} |"
        )
    return "\n".join(lines)


def interval_finding(summaries: list[dict[str, Any]], batch_size: int) -> str:
    """What the transactions column says about the interval: whether it closed any batch.

    >>> interval_finding([{"transactions": 16.0}, {"transactions": 16.0}], 20_000)[:40]
    'At every interval the batches filled to '
    """
    if len({s["transactions"] for s in summaries}) == 1:
        return (
            f"At every interval the batches filled to {batch_size:,} records before the "
            "interval ran out (the same transactions per run), so over a backlog the commit "
            "interval costs no throughput. It closes a batch only when fewer records than that "
            "arrive per interval, as at a paced rate R, where a transaction carries about "
            "R x interval records; there a shorter interval means more, smaller transactions."
        )
    return (
        "The intervals with more transactions per run closed batches before they filled to "
        f"{batch_size:,} records: there the stage commits more, smaller transactions."
    )


def cpu_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scheme | commit interval | records per CPU-s | passthrough per CPU-s | ratio "
        "| loop thread us/record | passthrough us/record | ratio | wall ratios of the pairs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['scheme']} | {row['commit_interval_ms']} ms | {row['cpu_rate']:,.0f} | "
            f"{row['cpu_passthrough']:,.0f} | {row['cpu_ratio']:.2f} | {row['thread_us']:.2f} | "
            f"{row['thread_us_passthrough']:.2f} | {row['thread_ratio']:.2f} | "
            f"{', '.join(f'{r:.2f}' for r in row['ratios'])} |"
        )
    return "\n".join(lines)


def summarize(scheme: str, ms: int, pairs: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """One scheme's row at one interval: the pair with the median ratio, CPU medians."""
    ratios = [p["scheme"]["rate"] / p["passthrough"]["rate"] for p in pairs]
    cpu_ratios = [p["scheme"]["cpu_rate"] / p["passthrough"]["cpu_rate"] for p in pairs]
    # The pair with the median ratio (of an even count, the lower of the two middle ones).
    middle = int(np.argsort(ratios)[(len(ratios) - 1) // 2])

    def median(mode: str, name: str) -> float:
        return float(np.median([p[mode][name] for p in pairs]))

    row = {
        "scheme": scheme,
        "commit_interval_ms": ms,
        "rate": pairs[middle]["scheme"]["rate"],
        "passthrough": pairs[middle]["passthrough"]["rate"],
        "ratio": ratios[middle],
        "ratios": ratios,
        "cpu_rate": median("scheme", "cpu_rate"),
        "cpu_passthrough": median("passthrough", "cpu_rate"),
        "cpu_ratio": float(np.median(cpu_ratios)),
        "thread_us": median("scheme", "thread_us"),
        "thread_us_passthrough": median("passthrough", "thread_us"),
        "transactions": median("scheme", "transactions"),
        "records": pairs[middle]["scheme"]["records"],
    }
    row["thread_ratio"] = row["thread_us_passthrough"] / row["thread_us"]
    return row


def run(
    records: int,
    workers: int = WORKERS,
    batch_size: int = grouping.DEFAULT_BATCH_SIZE,
    schemes: Sequence[str] | None = None,
    repeats: int = 3,
    commit_intervals_ms: Sequence[int] = (grouping.COMMIT_INTERVAL_MS,),
    log: Callable[[str], None] = print,
) -> ExperimentResult:
    """Measure every scheme (default: every live one) against the passthrough at every commit
    interval; the tables and their data."""
    from producers.kafka_producer import produce_stream
    from producers.workloads import parse

    schemes = list(schemes or live_schemes())
    intervals = list(commit_intervals_ms)
    settings = config.load()
    bootstrap = settings.kafka_bootstrap
    kafka_io.require_kafka(bootstrap)
    redis_client = connect_redis(settings.redis_url)
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench-stage-{tag}-"
    setup = kafka_io.RunNames(f"bench-stage-{tag}", prefix)
    measured_runs: list[str] = []  # each measurement's own run id (its Redis counters)
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    try:
        kafka_io.ensure_run_topics(bootstrap, setup, sources=1, workers=workers)
        keys = dataclasses.replace(parse(WORKLOAD), n=records).keys()
        produce_stream(keys, bootstrap=bootstrap, redis_client=redis_client, names=setup, sources=1)
        # every input record: the DATA records and the producer's watermarks
        total = _end_offset(bootstrap, setup.keys_topic)
        for i, scheme in enumerate(schemes):
            pairs: dict[int, list[dict[str, dict[str, float]]]] = {ms: [] for ms in intervals}
            for repeat in range(repeats):
                shift = (i + repeat) % len(intervals)
                for j, ms in enumerate(intervals[shift:] + intervals[:shift]):
                    first_mode = "passthrough" if (i + repeat + j) % 2 == 0 else "scheme"
                    pair = {}
                    for mode in [first_mode, *({"passthrough", "scheme"} - {first_mode})]:
                        run_id = f"{setup.run_id}-{scheme}-{ms}-{mode}-{repeat}"
                        measured_runs.append(run_id)
                        stage = StageConfig(
                            bootstrap=bootstrap,
                            redis_url=settings.redis_url,
                            names=kafka_io.RunNames(run_id, prefix),
                            scheme=scheme,
                            n_workers=workers,
                            n_sources=1,
                            batch_size=batch_size,
                            commit_interval_ms=ms,
                        )
                        cls = Passthrough if mode == "passthrough" else TimedSource
                        pair[mode] = measure(cls, stage, total, redis_client)
                    pairs[ms].append(pair)
            for ms in intervals:
                row = summarize(scheme, ms, pairs[ms])
                rows.append(row)
                log(
                    f"{scheme:>14} at {ms:>4} ms: {row['rate']:>10,.0f} records/s, passthrough "
                    f"{row['passthrough']:>10,.0f}, ratio {row['ratio']:.2f} "
                    f"({', '.join(f'{r:.2f}' for r in row['ratios'])}); per CPU-second ratio "
                    f"{row['cpu_ratio']:.2f}; {row['transactions']:,.0f} transactions"
                )
    finally:
        kafka_io.delete_topics(
            bootstrap,
            [
                setup.keys_topic,
                setup.work_topic,
                setup.dead_letters_topic,
                setup.late_topic,
                setup.results_topic,
            ],
        )
        for run_id in [setup.run_id, *measured_runs]:
            StateStore(redis_client, run_id).delete_run()
        redis_client.close()
    data = {
        "records": records,
        "workers": workers,
        "batch_size": batch_size,
        "repeats": repeats,
        "commit_intervals_ms": intervals,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "intervals": interval_rows(rows, intervals),
        "rows": rows,
    }
    return ExperimentResult(
        name="grouping_stage",
        title="Grouping stage throughput vs a consume-and-produce passthrough, per commit interval",
        markdown=body(data),
        data=data,
    )


def body(data: dict[str, Any]) -> str:
    """The results page below its header."""
    rows, intervals = data["rows"], data["commit_intervals_ms"]
    worst = min(rows, key=lambda row: row["ratio"])
    before, after = (
        " ".join(f"{x:.2f}" for x in data[k]) for k in ("load_average_before", "load_average_after")
    )
    return (
        f"One source, W = {data['workers']}, {data['records']:,} records of `{WORKLOAD}` "
        f"(one `keys` partition), batches of at most {data['batch_size']:,} records, one Kafka "
        "transaction per batch, at each commit interval (`--commit-interval-ms`: the longest "
        "a source waits to fill a batch) in turn. Each scheme is measured back to back with a "
        "passthrough that runs the same loop, clients, transactions, commit interval and Redis "
        "counter update but forwards the records unread (module docstring of "
        f"`bench/grouping_stage.py`), {data['repeats']} pairs per scheme and interval with "
        "alternating order; the ratio divides the scheme's rate by its own pair's passthrough, "
        "and the tables show the pair with the median ratio (of an even count, the lower "
        "middle one). Wall-clock rates: the machine is shared, so absolute numbers move with "
        "its load; the ratios are the result.\n\n"
        f"Load average (1, 5, 15 min) before: {before}; after: {after}.\n\n"
        "Per commit interval, the medians over the schemes: records/s, and that divided by the "
        f"first interval's ({intervals[0]} ms); the passthrough; CPU per record; transactions "
        "per run and records per transaction:\n\n"
        f"{interval_table(data['intervals'])}\n\n"
        f"{interval_finding(data['intervals'], data['batch_size'])}\n\n"
        f"Per scheme; the target (>= {TARGET_RATIO}) judges the median ratio of all its pairs, "
        "at every interval:\n\n"
        f"{table(rows, intervals)}\n\n"
        f"Lowest ratio of a row: {worst['scheme']} at {worst['ratio']:.2f}, "
        f"{worst['commit_interval_ms']} ms.\n\n"
        "The same runs measured in CPU time, which a busy neighbour does not inflate (medians "
        "over the pairs): records per CPU-second of the whole process (librdkafka's threads "
        "included), and CPU microseconds per record of the source's own thread -- the Python "
        "loop, the serial part that bounds one source's throughput when librdkafka's threads "
        "have a core of their own:\n\n"
        f"{cpu_table(rows)}\n"
    )


def _end_offset(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_io.consumer_config(bootstrap, f"bench-{uuid.uuid4().hex}"))
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()

"""Throughput of the grouping stage against a plain consume-and-produce passthrough.

``python -m bench.grouping_stage`` writes ``bench/results/grouping.md`` (and ``.json``),
headed by the command and the machine (:func:`bench.harness.header`). Needs a running broker
and Redis (``skewer services up``).

What is compared. One input topic ``keys`` (one partition) holds ``--records`` records of
``zipf:z=1.2,keys=100000`` written by :mod:`producers.kafka_producer`. Each measurement runs one
source over the whole partition from offset 0, with its own consumer group and
``transactional.id``, into a ``work`` topic of W partitions:

- **passthrough**: :class:`Passthrough`, the stage's own loop (same consumer and transactional
  producer settings, same batch size, one transaction per batch with the consumed offset,
  the same Redis counter update per batch) whose batch step only forwards each consumed
  record's key and value to partition ``i mod W``: no decoding, validation or routing.
- **a scheme**: :class:`~pipeline.stages.grouping.GroupingSource` itself (decode, validate,
  route with the scheme object, re-encode, markers).

Both stop when they have consumed every input record; the rate is records divided by the
wall time from the arrival of the first batch (start-up and the consumer's first fetch are
left out) to the last commit.
Measurements come in pairs, passthrough and scheme back to back (the order alternating from one
pair to the next), and each ratio divides the scheme's rate by its own pair's passthrough, so
a busy neighbour on a shared machine slows both sides of a ratio alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from operators import registry
from pipeline.io import config, kafka_io
from pipeline.io.dead_letters import REASONS
from pipeline.io.redis_client import connect_redis
from pipeline.io.state_store import StateStore
from pipeline.stages import grouping
from pipeline.stages.grouping import BatchOutput, GroupingSource, SourceWatermark, StageConfig

TARGET_RATIO = 0.8
WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"


def live_schemes() -> list[str]:
    """Every registered scheme a live source can run (simulator-only ones excluded)."""
    return [name for name in registry.names() if name not in registry.SIMULATOR_ONLY]


class TimedSource(GroupingSource):
    """The stage's source, timed from the arrival of its first batch to the end of its last."""

    started_at = ended_at = 0.0
    cpu_started_at = cpu_ended_at = 0.0
    thread_started_at = thread_ended_at = 0.0

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
    source.run(lambda: source.summary.records >= total)
    if source.summary.records != total:
        raise RuntimeError(f"{cls.__name__} read {source.summary.records} of {total} records")
    return {
        "rate": source.rate,
        "cpu_rate": source.cpu_rate,
        "thread_us": source.thread_us,
        "seconds": source.ended_at - source.started_at,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The results table, plain markdown.

    Example (the table is plain markdown):
        >>> print(table([{"scheme": "key", "rate": 2e5, "passthrough": 2.2e5, "ratio": 0.909}]))
        | scheme | records/s | passthrough records/s | ratio | >= 0.8 |
        |---|---:|---:|---:|---|
        | key | 200,000 | 220,000 | 0.91 | yes |
    """
    lines = [
        "| scheme | records/s | passthrough records/s | ratio | >= 0.8 |",
        "|---|---:|---:|---:|---|",
    ]
    for row in rows:
        met = "yes" if row["ratio"] >= TARGET_RATIO else "**no**"
        lines.append(
            f"| {row['scheme']} | {row['rate']:,.0f} | {row['passthrough']:,.0f} | "
            f"{row['ratio']:.2f} | {met} |"
        )
    return "\n".join(lines)


def cpu_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scheme | records per CPU-s | passthrough per CPU-s | ratio | loop thread us/record "
        "| passthrough us/record | ratio | wall ratios of the pairs |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['scheme']} | {row['cpu_rate']:,.0f} | {row['cpu_passthrough']:,.0f} | "
            f"{row['cpu_ratio']:.2f} | {row['thread_us']:.2f} | "
            f"{row['thread_us_passthrough']:.2f} | {row['thread_ratio']:.2f} | "
            f"{', '.join(f'{r:.2f}' for r in row['ratios'])} |"
        )
    return "\n".join(lines)


def run(
    records: int,
    workers: int,
    batch_size: int,
    schemes: list[str],
    repeats: int = 3,
    log: Any = print,
) -> dict[str, Any]:
    """Measure every scheme against the passthrough; the rows and the setup."""
    from producers.kafka_producer import produce_stream
    from producers.workloads import parse

    settings = config.load()
    bootstrap = settings.kafka_bootstrap
    kafka_io.require_kafka(bootstrap)
    redis_client = connect_redis(settings.redis_url)
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench-stage-{tag}-"
    setup = kafka_io.RunNames(f"bench-stage-{tag}", prefix)
    rows: list[dict[str, Any]] = []
    try:
        kafka_io.ensure_run_topics(bootstrap, setup, sources=1, workers=workers)
        keys = dataclasses.replace(parse(WORKLOAD), n=records).keys()
        produce_stream(keys, bootstrap=bootstrap, redis_client=redis_client, names=setup, sources=1)
        # every input record: the DATA records and the producer's watermarks
        total = _end_offset(bootstrap, setup.keys_topic)
        for i, scheme in enumerate(schemes):
            pairs = []
            for repeat in range(repeats):
                stages = {
                    mode: StageConfig(
                        bootstrap=bootstrap,
                        redis_url=settings.redis_url,
                        names=kafka_io.RunNames(f"{setup.run_id}-{scheme}-{mode}-{repeat}", prefix),
                        scheme=scheme,
                        n_workers=workers,
                        n_sources=1,
                        batch_size=batch_size,
                    )
                    for mode in ("passthrough", "scheme")
                }
                first_mode = "passthrough" if (i + repeat) % 2 == 0 else "scheme"
                order = [first_mode, "scheme" if first_mode == "passthrough" else "passthrough"]
                pair = {}
                for mode in order:
                    cls = Passthrough if mode == "passthrough" else TimedSource
                    pair[mode] = measure(cls, stages[mode], total, redis_client)
                pairs.append(pair)
            ratios = [p["scheme"]["rate"] / p["passthrough"]["rate"] for p in pairs]
            cpu_ratios = [p["scheme"]["cpu_rate"] / p["passthrough"]["cpu_rate"] for p in pairs]
            middle = int(np.argsort(ratios)[len(ratios) // 2])  # the pair with the median ratio
            row = {
                "scheme": scheme,
                "rate": pairs[middle]["scheme"]["rate"],
                "passthrough": pairs[middle]["passthrough"]["rate"],
                "ratio": ratios[middle],
                "ratios": ratios,
                "cpu_rate": float(np.median([p["scheme"]["cpu_rate"] for p in pairs])),
                "cpu_passthrough": float(np.median([p["passthrough"]["cpu_rate"] for p in pairs])),
                "cpu_ratio": float(np.median(cpu_ratios)),
                "thread_us": float(np.median([p["scheme"]["thread_us"] for p in pairs])),
                "thread_us_passthrough": float(
                    np.median([p["passthrough"]["thread_us"] for p in pairs])
                ),
            }
            row["thread_ratio"] = row["thread_us_passthrough"] / row["thread_us"]
            rows.append(row)
            log(
                f"{scheme:>14}: {row['rate']:>10,.0f} records/s, passthrough "
                f"{row['passthrough']:>10,.0f}, ratio {row['ratio']:.2f} "
                f"({', '.join(f'{r:.2f}' for r in ratios)}); per CPU-second ratio "
                f"{row['cpu_ratio']:.2f}; loop thread {row['thread_us']:.2f} vs "
                f"{row['thread_us_passthrough']:.2f} us/record ({row['thread_ratio']:.2f})"
            )
    finally:
        kafka_io.delete_topics(
            bootstrap,
            [setup.keys_topic, setup.work_topic, setup.dead_letters_topic, setup.results_topic],
        )
        StateStore(redis_client, setup.run_id).delete_run()
        redis_client.close()
    return {
        "records": records,
        "workers": workers,
        "batch_size": batch_size,
        "repeats": repeats,
        "rows": rows,
    }


def _end_offset(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_io.consumer_config(bootstrap, f"bench-{uuid.uuid4().hex}"))
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    from bench import harness

    parser = argparse.ArgumentParser(prog="python -m bench.grouping_stage", description=__doc__)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=grouping.DEFAULT_BATCH_SIZE)
    parser.add_argument("--schemes", nargs="+", default=live_schemes())
    parser.add_argument("--repeats", type=int, default=3, help="pairs per scheme (median)")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    args = parser.parse_args(argv)
    command = "python -m bench.grouping_stage " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    info = harness.machine_info()
    load_before = os.getloadavg()
    began = time.perf_counter()
    data = run(args.records, args.workers, args.batch_size, args.schemes, args.repeats, log=print)
    seconds = time.perf_counter() - began
    load_after = os.getloadavg()
    data["load_average_before"] = load_before
    data["load_average_after"] = load_after
    rows = data["rows"]
    worst = min(rows, key=lambda row: row["ratio"])
    body = (
        f"One source, W = {args.workers}, {args.records:,} records of `{WORKLOAD}` "
        f"(one `keys` partition), batches of {args.batch_size:,} records, one Kafka "
        "transaction per batch. Each scheme is measured back to back with a passthrough that "
        "runs the same loop, clients, transactions and Redis counter update but forwards the "
        "records unread (see the module docstring of `bench/grouping.py`), "
        f"{args.repeats} pairs per scheme with alternating order; the ratio divides the "
        "scheme's rate by its own pair's passthrough, and the table shows the pair with the "
        "median ratio. Wall-clock rates: the machine is shared (2 cores), so absolute numbers "
        "move with its load; the ratios are the result.\n\n"
        f"Load average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; "
        f"after: {' '.join(f'{x:.2f}' for x in load_after)}.\n\n"
        f"{table(rows)}\n\n"
        f"Lowest ratio: {worst['scheme']} at {worst['ratio']:.2f} (target >= {TARGET_RATIO}).\n\n"
        "The same runs measured in CPU time, which a busy neighbour does not inflate (medians "
        "over the pairs): records per CPU-second of the whole process (librdkafka's threads "
        "included), and CPU microseconds per record of the source's own thread -- the Python "
        "loop, the serial part that bounds one source's throughput when librdkafka's threads "
        "have a core of their own:\n\n"
        f"{cpu_table(rows)}\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    title = "Grouping stage throughput vs a consume-and-produce passthrough"
    (args.out / "grouping.md").write_text(
        harness.header(title, command.strip(), info, seconds) + body, "utf-8"
    )
    (args.out / "grouping.json").write_text(json.dumps(data, indent=1) + "\n", "utf-8")
    print(f"written: {args.out / 'grouping.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The grouping stage on a user's own topic against the same stage on skewer's own format.

``skewer bench own-topic`` writes ``bench/results/own_topic.md`` (and ``.json``), headed by the
command and the machine (:func:`bench.harness.header`). Needs a running broker and Redis
(``skewer services up``).

What is compared. The same stream -- ``--records`` keys of ``zipf:z=1.2,keys=100000`` with
event times 1 ms apart -- is written three times, each into a topic of one partition:

- **skewer's format**: by :mod:`producers.kafka_producer` (Kafka key = the key, value = the
  24-byte header), read as the stage always reads ``keys``;
- **JSON**: value ``{"user": KEY, "ts": "ISO-8601 time", "bytes": N, "path": "/..."}``, read
  with ``--key json:user --time json:ts:iso`` (:mod:`pipeline.io.extractors`: Arrow's JSON
  reader over the whole batch);
- **bytes**: Kafka key = the key, value = 32 opaque bytes, Kafka timestamp = the event time,
  read with ``--key kafka-key --time kafka-timestamp``.

Each measurement runs one source (:class:`bench.grouping_stage.TimedSource`, the stage's own
:class:`~pipeline.stages.grouping.GroupingSource`) of one scheme over the whole partition into a
``work`` topic of W partitions; the clock runs from the first batch's arrival to the last
commit. Measurements come in rounds, the three inputs back to back in an order that rotates
from round to round, and each ratio divides a user topic's rate by skewer's format in the same
round; the table shows the round with the median ratio.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bench.experiment import ExperimentResult
from bench.grouping_stage import TimedSource, measure
from pipeline.io import config, extractors, kafka_io
from pipeline.io.redis_client import connect_redis
from pipeline.io.state_store import StateStore
from pipeline.stages.grouping import DEFAULT_BATCH_SIZE, StageConfig
from pipeline.stages.user_topic import UserTopic

TARGET_RATIO = 0.7
WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"
#: The stream's first event time, a day ago: brokers refuse Kafka timestamps more than an hour
#: ahead (``log.message.timestamp.after.max.ms``).
START_MS = (int(time.time() * 1000) - 86_400_000) // 60_000 * 60_000
INPUTS = {
    "JSON": ("json:user", "json:ts:iso"),
    "bytes": ("kafka-key", "kafka-timestamp"),
}


def table(rows: list[dict[str, Any]]) -> str:
    """The results table, plain markdown.

    Example (the table is plain markdown):
        >>> print(table([{"input": "JSON", "rate": 2e5, "own": 2.5e5, "ratio": 0.8}]))
        | input | records/s | skewer's format records/s | ratio | >= 0.7 |
        |---|---:|---:|---:|---|
        | JSON | 200,000 | 250,000 | 0.80 | yes |
    """
    lines = [
        "| input | records/s | skewer's format records/s | ratio | >= 0.7 |",
        "|---|---:|---:|---:|---|",
    ]
    for row in rows:
        met = "yes" if row["ratio"] >= TARGET_RATIO else "**no**"
        lines.append(
            f"| {row['input']} | {row['rate']:,.0f} | {row['own']:,.0f} | "
            f"{row['ratio']:.2f} | {met} |"
        )
    return "\n".join(lines)


def _write_user_topics(bootstrap: str, keys: list[bytes], topics: dict[str, str]) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka_io.producer_config(bootstrap))
    rng = np.random.default_rng(1)
    sizes = rng.integers(100, 100_000, len(keys)).tolist()
    opaque = rng.bytes(32)
    for i, key in enumerate(keys):
        t = START_MS + i
        stamp = datetime.fromtimestamp(t / 1000, UTC).isoformat(timespec="milliseconds")
        value = (
            f'{{"user": "{key.decode()}", "ts": "{stamp[:-6]}Z", "bytes": {sizes[i]}, '
            f'"path": "/p/{i % 97}"}}'
        ).encode()
        kafka_io.produce_blocking(producer, topics["JSON"], value, None, 0)
        while True:
            try:
                producer.produce(topics["bytes"], opaque, key, 0, timestamp=t)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise RuntimeError("the user topics were not all written")


def run(
    records: int,
    workers: int,
    scheme: str = "pkg",
    rounds: int = 3,
    batch_size: int = DEFAULT_BATCH_SIZE,
    log: Any = print,
) -> ExperimentResult:
    """Measure the stage on each input, ``rounds`` times; the table and its data."""
    from producers.kafka_producer import produce_stream
    from producers.workloads import parse

    settings = config.load()
    bootstrap = settings.kafka_bootstrap
    kafka_io.require_kafka(bootstrap)
    redis_client = connect_redis(settings.redis_url)
    tag = uuid.uuid4().hex[:8]
    prefix = f"bench-own-{tag}-"
    setup = kafka_io.RunNames(f"bench-own-{tag}", prefix)
    topics = {name: f"{prefix}{name.lower()}" for name in INPUTS}
    created = [setup.keys_topic, setup.work_topic, *topics.values()]
    measured: dict[str, list[float]] = {"own": [], **{name: [] for name in INPUTS}}
    try:
        kafka_io.ensure_run_topics(bootstrap, setup, sources=1, workers=workers)
        for topic in topics.values():
            kafka_io.ensure_topic(bootstrap, topic, 1, {"max.message.bytes": "4194304"})
        keys = dataclasses.replace(parse(WORKLOAD), n=records).keys().to_list()
        produce_stream(
            parse(f"{WORKLOAD},n={records}").keys(),
            bootstrap=bootstrap,
            redis_client=redis_client,
            names=setup,
            sources=1,
        )
        _write_user_topics(bootstrap, keys, topics)
        totals = {"own": _end_offset(bootstrap, setup.keys_topic)}
        totals.update({name: _end_offset(bootstrap, topic) for name, topic in topics.items()})
        order = ["own", *INPUTS]
        for round_ in range(rounds):
            shift = round_ % len(order)
            for name in order[shift:] + order[:shift]:
                names = kafka_io.RunNames(f"{setup.run_id}-{name}-{round_}", prefix)
                spec = None
                if name != "own":
                    key, time_spec = INPUTS[name]
                    spec = UserTopic(
                        topic=topics[name],
                        extractor=extractors.Extractor(
                            key=extractors.parse_key(key), time=extractors.parse_time(time_spec)
                        ),
                    )
                stage = StageConfig(
                    bootstrap=bootstrap,
                    redis_url=settings.redis_url,
                    names=names,
                    scheme=scheme,
                    n_workers=workers,
                    n_sources=1,
                    batch_size=batch_size,
                    input=spec,
                )
                result = measure(TimedSource, stage, totals[name], redis_client)
                measured[name].append(result["rate"])
                log(f"round {round_ + 1}: {name:>5} {result['rate']:>10,.0f} records/s")
    finally:
        kafka_io.delete_topics(bootstrap, [*created, *_run_topics(setup)])
        StateStore(redis_client, setup.run_id).delete_run()
        redis_client.close()
    rows = []
    for name in INPUTS:
        ratios = [r / own for r, own in zip(measured[name], measured["own"], strict=True)]
        middle = int(np.argsort(ratios)[len(ratios) // 2])
        rows.append(
            {
                "input": name,
                "key": INPUTS[name][0],
                "time": INPUTS[name][1],
                "rate": measured[name][middle],
                "own": measured["own"][middle],
                "ratio": ratios[middle],
                "ratios": ratios,
            }
        )
    data = {
        "records": records,
        "workers": workers,
        "scheme": scheme,
        "batch_size": batch_size,
        "rounds": rounds,
        "rates": measured,
        "rows": rows,
    }
    return ExperimentResult(
        name="own_topic",
        title="Grouping stage on a user's own topic vs skewer's own format",
        markdown=body(data),
        data=data,
    )


def _run_topics(setup: kafka_io.RunNames) -> list[str]:
    return [setup.dead_letters_topic, setup.late_topic, setup.results_topic]


def _end_offset(bootstrap: str, topic: str) -> int:
    held = kafka_io.topic_records(bootstrap, topic)
    assert held is not None
    return held[0]


def body(data: dict[str, Any]) -> str:
    """The results page below its header."""
    rows = data["rows"]
    return (
        f"One source of `{data['scheme']}`, W = {data['workers']}, {data['records']:,} records "
        f"of `{WORKLOAD}` with event times 1 ms apart, each input in a topic of one partition, "
        f"batches of {data['batch_size']:,} records, one Kafka transaction per batch. "
        f"{data['rounds']} rounds; in each the three inputs run back to back (the order "
        "rotates), and a ratio divides a user topic's rate by skewer's own format in the same "
        "round; the table shows the round with the median ratio (module docstring of "
        "`bench/own_topic.py`).\n\n"
        f"{table(rows)}\n\n"
        "Ratios of every round: "
        + "; ".join(f"{r['input']} {', '.join(f'{x:.2f}' for x in r['ratios'])}" for r in rows)
        + ".\n"
    )

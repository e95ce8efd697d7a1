"""`skewer demo`: a smoke run of the pipeline's first hop through the real Kafka broker.

It draws a skewed key stream (``--workload``, a :mod:`producers.workloads` spec; ``--records``
sets its length), routes every key with a grouping scheme (``--scheme``, default ``key``), and
produces each record into a fresh topic of ``--workers`` partitions at exactly the partition the
scheme chose: partition w IS worker w. Then it reads the topic back from the beginning and
prints, per partition, how many records were produced and how many were read, plus the
imbalance of the routing (max - avg, and max/avg). Exit code 0 when every partition reads back
exactly what was produced, 1 otherwise, and 1 with one line when Kafka does not answer.

Later issues grow this into the full demo (Spark workers, Redis state, the controller).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

import numpy as np

from pipeline import config, services
from pipeline.cli import UsageError

DEFAULT_WORKLOAD = "zipf:z=1.1,keys=1000,seed=7"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="route a skewed stream into Kafka (partition w = worker w) and read it back",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument("--records", type=int, default=100_000, help="records to produce")
    parser.add_argument("--workers", type=int, default=8, help="partitions of the topic (W)")
    parser.add_argument("--scheme", default="key", help="grouping scheme (default: key)")
    parser.add_argument(
        "--workload",
        default=DEFAULT_WORKLOAD,
        help=f"key stream spec without n (default: {DEFAULT_WORKLOAD})",
    )
    parser.add_argument("--keep-topic", action="store_true", help="do not delete the topic")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def _route(scheme_name: str, workers: int, keys: object) -> np.ndarray:
    from operators import registry

    return registry.create(scheme_name, workers).route(keys)


def produce_routed(bootstrap: str, topic: str, keys: list[bytes], partitions: np.ndarray) -> None:
    """Send record i (key ``keys[i]``, value its index) to partition ``partitions[i]``."""
    from confluent_kafka import Producer

    # Idempotence: no duplicates and each partition in production order, even across retries.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "log_level": 0,
        }
    )
    failures: list[str] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    for index, (key, partition) in enumerate(zip(keys, partitions.tolist(), strict=True)):
        while True:
            try:
                producer.produce(
                    topic,
                    key=key,
                    value=str(index).encode(),
                    partition=partition,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                # The local queue is full: let librdkafka deliver some before retrying.
                producer.poll(0.1)
    remaining = producer.flush(60)
    if remaining or failures:
        detail = failures[0] if failures else f"{remaining} records undelivered"
        raise services.ServiceError(f"kafka: producing to {topic!r} failed: {detail}")


def read_partition_counts(
    bootstrap: str, topic: str, partitions: int, timeout: float = 60.0
) -> list[int]:
    """Records per partition of ``topic``, read from the beginning up to the end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"skewer-demo-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
            for p in range(partitions)
        ]
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        counts = [0] * partitions
        positions = [0] * partitions
        deadline = time.monotonic() + timeout
        while positions != ends and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if message.error() is not None:
                    continue
                counts[message.partition()] += 1
                positions[message.partition()] = message.offset() + 1
        return counts
    finally:
        consumer.close()


def run(args: argparse.Namespace) -> int:
    from producers import workloads

    if args.records < 1:
        raise UsageError(f"--records must be >= 1, got {args.records}")
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    try:
        spec = args.workload if "n=" in args.workload else f"{args.workload},n={args.records}"
        workload = workloads.parse(spec)
    except workloads.WorkloadError as error:
        raise UsageError(str(error)) from None
    if workload.records != args.records:
        raise UsageError(f"the workload has {workload.records} records, --records {args.records}")

    settings = config.load()
    if not services.kafka_answers(settings.kafka_bootstrap, timeout=5.0):
        print(
            f"skewer demo: Kafka does not answer at {settings.kafka_bootstrap}; "
            "run `skewer services up` first",
            file=sys.stderr,
        )
        return 1

    started = time.perf_counter()
    keys = workload.keys()
    partitions = _route(args.scheme, args.workers, keys)
    produced = np.bincount(partitions, minlength=args.workers).astype(int).tolist()
    topic = f"skewer-demo-{uuid.uuid4().hex[:12]}"
    try:
        services.create_topic(settings.kafka_bootstrap, topic, args.workers)
        produce_routed(settings.kafka_bootstrap, topic, keys.to_list(), partitions)
        consumed = read_partition_counts(settings.kafka_bootstrap, topic, args.workers)
    except services.ServiceError as error:
        print(f"skewer demo: {error}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_topic:
            services.delete_topics(settings.kafka_bootstrap, [topic])
    seconds = time.perf_counter() - started

    average = args.records / args.workers
    report = {
        "topic": topic,
        "bootstrap": settings.kafka_bootstrap,
        "workload": workload.spec,
        "scheme": args.scheme,
        "records": args.records,
        "workers": args.workers,
        "produced": produced,
        "consumed": consumed,
        "exact": produced == consumed,
        "imbalance": max(produced) - average,
        "max_avg_ratio": max(produced) / average,
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{args.records} records of {workload.spec}, scheme {args.scheme}, "
            f"into topic {topic} ({args.workers} partitions, partition w = worker w)"
        )
        print(f"{'worker':>6} {'produced':>9} {'read back':>9}")
        for worker, (sent, read) in enumerate(zip(produced, consumed, strict=True)):
            print(f"{worker:>6} {sent:>9} {read:>9}")
        print(
            f"imbalance max-avg = {report['imbalance']:.1f} records, "
            f"max/avg = {report['max_avg_ratio']:.3f}; "
            f"read back {'exactly' if report['exact'] else 'NOT'} what was produced "
            f"({seconds:.1f} s)"
        )
    return 0 if report["exact"] else 1

"""Scaling out: the workers on 1, 2 and 4 Spark executors, and the grouping stage on topics of
one replica against three.

What it measures and how: :data:`METHOD`, the prose of bench/results/scale.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bench.end_to_end import row, traced_run
from bench.experiment import ExperimentResult, method_markdown, ratio_or_dash
from bench.grouping_stage import TimedSource, measure
from pipeline.io import config, kafka_io
from pipeline.io.redis_client import connect_redis
from pipeline.io.state_store import StateStore
from pipeline.services import manager, spark_standalone
from pipeline.services.kafka_broker import node_name

#: What the benchmark measures and how: the prose of bench/results/scale.md.
METHOD = """\
``skewer bench scale`` writes ``bench/results/scale.md`` (and ``.json``), headed by the command
and the machine. Both parts are ratios measured side by side in the one run.

**Executors.** The whole live pipeline (``skewer demo``'s stages as subprocesses), pkg on
``zipf:z=1.2`` with W = 4 workers and one source, its workers on the Spark standalone cluster
of ``skewer services up --spark-workers 2`` (started here under a lease if it is not running: a
master and two workers of 8 cores). Each run asks for n executors of one core and 512 MiB
(``spark.executor.cores=1``, ``spark.cores.max=n``) and runs n tasks per micro-batch
(``skewer work --tasks n``), each holding W / n workers. The per-record cost is the workers'
own CPU (decoding, counting, the Redis apply), C = 0 by default: ``--cpu-cost-us`` is a wait
that emulates W servers side by side whatever the executors (the cost model's
machines), so it would hide what executors add rather than measure it. Throughput is the
steady rate (records the workers processed per second between 20 % and 90 % of the records,
with a backlog, in micro-batches of at most 20,000 records), and the ratio divides it by
the one-executor run's. Every executor shares the
machine's cores with Kafka, Redis, the driver and the other stages: on a machine of two cores
that, not Spark, caps what a third and fourth executor add.

**Replication.** One grouping source (pkg, W = 8) over the same records in a ``keys`` topic,
its run's topics created with one replica, then with three (``min.insync.replicas=2``; every
producer here writes with ``acks=all``), on a cluster of three KRaft nodes: the configured Kafka
if it has three brokers, else one started here under a lease (ports 100 above the configured
ones, its own run folder). Pairs run back to back in alternating order, and the ratio divides
the three-replica rate by its own pair's one-replica rate; the table shows the pair with the
median ratio (the loop and timing of ``bench/grouping_stage.py``).
"""

EXECUTORS = (1, 2, 4)
WORKERS = 4
WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"
#: µs of emulated cost per record (``skewer work --cpu-cost-us``); 0: the workers' own CPU.
CPU_COST_US = 0.0
EXECUTOR_RECORDS = 400_000
#: Offsets per micro-batch (``skewer work --max-records-per-batch``): a backlog runs as many
#: batches, so the steady rate has batches to measure, not one that took it all.
BATCH_RECORDS = 20_000
REPLICATION_RECORDS = 300_000
REPLICATION_WORKERS = 8
PAIRS = 5
#: Where the bench's own Kafka cluster listens: this far above the configured ports.
CLUSTER_PORT_OFFSET = 100

Log = Callable[[str], None]


@contextlib.contextmanager
def standalone_cluster(settings: config.Settings) -> Iterator[str]:
    """The native standalone master and two workers, under a lease; the master's URL."""
    names = [spark_standalone.MASTER_NAME, *(spark_standalone.worker_name(i) for i in (1, 2))]
    manager.acquire(settings, names)
    try:
        yield settings.spark_standalone_url
    finally:
        manager.release(settings, names)


def executor_rows(settings: config.Settings, records: int, cpu_cost_us: float, log: Log) -> list:
    """One pipeline run per executor count, on the standalone cluster."""
    from pipeline.runs.plan import plan_run

    rows = []
    with standalone_cluster(settings) as master:
        for executors in EXECUTORS:
            plan = plan_run(
                settings,
                run_prefix="bench-scale",
                scheme="pkg",
                records=records,
                workers=WORKERS,
                sources=1,
                workload=WORKLOAD,
                cpu_cost_us=cpu_cost_us,
                spark_master=master,
                tasks=executors,
                max_records_per_batch=BATCH_RECORDS,
            )
            # PySpark passes these to spark-submit when the work stage starts its session.
            confs = {
                "spark.executor.cores": "1",
                "spark.executor.memory": "512m",
                "spark.cores.max": str(executors),
            }
            submit = " ".join(f"--conf {key}={value}" for key, value in confs.items())
            environ = {**os.environ, "PYSPARK_SUBMIT_ARGS": f"{submit} pyspark-shell"}
            began = time.monotonic()
            summary, trace = traced_run(plan, settings, environ)
            figures = {**row(summary, trace), "executors": executors}
            rows.append(figures)
            log(
                f"{executors} executor(s): steady {figures['steady_rate'] or 0:,.0f} records/s, "
                f"run {summary.throughput or 0:,.0f}/s, exact {summary.exact} "
                f"({time.monotonic() - began:.0f} s)"
            )
    return rows


@contextlib.contextmanager
def kafka_cluster(settings: config.Settings, log: Log) -> Iterator[str]:
    """The bootstrap list of a cluster of three brokers: the configured Kafka if it is one,
    else nodes started here (under a lease, in their own run folder)."""
    kafka_io.require_kafka(settings.kafka_bootstrap)
    if kafka_io.cluster_brokers(settings.kafka_bootstrap) >= config.KAFKA_CLUSTER_NODES:
        yield settings.kafka_bootstrap
        return
    host = settings.kafka_host
    controller = config.host_ports(settings.kafka_controller, config.ENV_KAFKA_CONTROLLER)[0][0]
    own = config.load(
        {
            **settings.environ(),
            config.ENV_RUN_DIR: str(settings.run_dir / "bench-kafka-cluster"),
            config.ENV_KAFKA_BOOTSTRAP: f"{host}:{settings.kafka_port + CLUSTER_PORT_OFFSET}",
            config.ENV_KAFKA_CONTROLLER: (
                f"{controller}:{settings.kafka_controller_port + CLUSTER_PORT_OFFSET}"
            ),
        }
    )
    nodes = [node_name(node) for node in range(1, config.KAFKA_CLUSTER_NODES + 1)]
    log(f"starting a Kafka cluster of three at {own.kafka_cluster_bootstrap} ...")
    manager.acquire(own, nodes)
    try:
        yield own.kafka_cluster_bootstrap
    finally:
        manager.release(own, nodes)


def replication_rows(settings: config.Settings, records: int, log: Log) -> list:
    """Pairs of one grouping source on topics of one replica and of three."""
    from pipeline.stages.grouping import StageConfig
    from producers.kafka_producer import produce_stream
    from producers.workloads import parse

    redis_client = connect_redis(settings.redis_url)
    tag = uuid.uuid4().hex[:8]
    setups = {
        replicas: kafka_io.RunNames(f"bench-replicas-{tag}-{replicas}", f"bench-r{replicas}-{tag}-")
        for replicas in (1, 3)
    }
    pairs: list[dict[int, dict[str, float]]] = []
    with kafka_cluster(settings, log) as bootstrap:
        try:
            keys = dataclasses.replace(parse(WORKLOAD), n=records).keys()
            totals = {}
            for replicas, names in setups.items():
                kafka_io.ensure_run_topics(
                    bootstrap,
                    names,
                    sources=1,
                    workers=REPLICATION_WORKERS,
                    replication=replicas,
                )
                produce_stream(
                    keys, bootstrap=bootstrap, redis_client=redis_client, names=names, sources=1
                )
                totals[replicas] = sum(kafka_io.topic_records(bootstrap, names.keys_topic) or [])
            for pair in range(PAIRS):
                order = (1, 3) if pair % 2 == 0 else (3, 1)
                measured = {}
                for replicas in order:
                    names = setups[replicas]
                    stage = StageConfig(
                        bootstrap=bootstrap,
                        redis_url=settings.redis_url,
                        names=kafka_io.RunNames(f"{names.run_id}-{pair}", names.topic_prefix),
                        scheme="pkg",
                        n_workers=REPLICATION_WORKERS,
                        n_sources=1,
                        replication=replicas,
                    )
                    measured[replicas] = measure(TimedSource, stage, totals[replicas], redis_client)
                pairs.append(measured)
                log(
                    f"pair {pair + 1}: 1 replica {measured[1]['rate']:,.0f} records/s, "
                    f"3 replicas {measured[3]['rate']:,.0f}"
                )
        finally:
            for names in setups.values():
                topics = [names.keys_topic, names.work_topic, names.dead_letters_topic]
                kafka_io.delete_topics(bootstrap, [*topics, names.late_topic, names.results_topic])
                StateStore(redis_client, names.run_id).delete_run()
            redis_client.close()
    return [
        {"one": p[1]["rate"], "three": p[3]["rate"], "ratio": p[3]["rate"] / p[1]["rate"]}
        for p in pairs
    ]


def executor_table(rows: list[dict[str, Any]]) -> str:
    """The executors' table (one task per executor): steady rate and its ratio to one
    executor's.

    >>> print(executor_table([{"executors": 1, "steady_rate": 1800.0, "throughput": 1500.0,
    ...     "exact": True, "max_avg_ratio": 1.2}]))
    | executors | steady records/s | vs 1 | run records/s | max/avg | exact |
    |---:|---:|---:|---:|---:|---|
    | 1 | 1,800 | 1.00 | 1,500 | 1.20 | yes |
    """
    base = rows[0]["steady_rate"] if rows else None
    lines = [
        "| executors | steady records/s | vs 1 | run records/s | max/avg | exact |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        steady = r["steady_rate"]
        vs = ratio_or_dash(steady, base)
        lines.append(
            f"| {r['executors']} | {f'{steady:,.0f}' if steady else '-'} | {vs} | "
            f"{r['throughput'] or 0:,.0f} | {r['max_avg_ratio']:.2f} | "
            f"{'yes' if r['exact'] else '**no**'} |"
        )
    return "\n".join(lines)


def replication_table(pairs: list[dict[str, float]]) -> str:
    """The replication pairs, the one with the median ratio first.

    >>> print(replication_table([{"one": 2e5, "three": 1.5e5, "ratio": 0.75}]))
    | | 1 replica records/s | 3 replicas records/s | ratio |
    |---|---:|---:|---:|
    | median pair | 200,000 | 150,000 | 0.75 |
    <BLANKLINE>
    Ratios of every pair: 0.75.
    """
    middle = pairs[int(np.argsort([p["ratio"] for p in pairs])[len(pairs) // 2])]
    ratios = ", ".join(f"{p['ratio']:.2f}" for p in pairs)
    return (
        "| | 1 replica records/s | 3 replicas records/s | ratio |\n|---|---:|---:|---:|\n"
        f"| median pair | {middle['one']:,.0f} | {middle['three']:,.0f} | {middle['ratio']:.2f} |"
        f"\n\nRatios of every pair: {ratios}."
    )


def run(
    *,
    executor_records: int = EXECUTOR_RECORDS,
    replication_records: int = REPLICATION_RECORDS,
    cpu_cost_us: float = CPU_COST_US,
    log: Log = lambda _line: None,
) -> ExperimentResult:
    """Both parts, in one run; the services (Kafka, Redis) must answer."""
    settings = config.load()
    load_average = " ".join(f"{x:.2f}" for x in os.getloadavg())
    executors = executor_rows(settings, executor_records, cpu_cost_us, log)
    replication = replication_rows(settings, replication_records, log)
    body = (
        f"Load average (1, 5, 15 min) when the run started: {load_average}.\n\n"
        f"### Workers on 1, 2 and 4 executors\n\n{executor_records:,} records of `{WORKLOAD}`, "
        f"W = {WORKERS}, one source, micro-batches of at most {BATCH_RECORDS:,} records, "
        f"C = {cpu_cost_us:g} µs of emulated cost per record.\n\n"
        f"{executor_table(executors)}\n\n"
        f"### The grouping stage on topics of 1 and 3 replicas\n\n{replication_records:,} "
        f"records, one source of pkg, W = {REPLICATION_WORKERS}, {PAIRS} pairs.\n\n"
        f"{replication_table(replication)}\n"
    )
    return ExperimentResult(
        name="scale",
        title="Scaling out: Spark executors, and Kafka replication",
        markdown=method_markdown(METHOD) + "\n\n" + body,
        data={
            "cpu_cost_us": cpu_cost_us,
            "executor_rows": executors,
            "replication_pairs": replication,
        },
    )

"""Load and faults for a long while (``skewer bench soak``): a routing-table run and a pkg run
side by side on the cluster services, a seeded schedule of kill -9s (:mod:`bench.chaos`), the
pipeline and its processes sampled once a second, and at the end every (key, window) count of
both runs checked, nothing lost or doubled, and the flatness checks
(docs/performance.md#the-soak).

The samples: :mod:`bench.soak_samples`; the checks and the page: :mod:`bench.soak_checks`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import chaos
from bench.experiment import ExperimentResult
from bench.soak_checks import figure, markdown, results
from bench.soak_samples import Sample, Sampler

#: The soak's page's title.
TITLE = "An hour under load and faults: both runs exact, nothing leaking, nothing drifting"
#: Workers per run: the two runs take the cluster's 2 x 8 executor cores, half of them spare.
WORKERS = 4
SOURCES = 2
WINDOW_MS = 10_000
#: The schemes of the two runs: a routing-table scheme (its controller migrates keys) and pkg.
SCHEMES = ("mixed", "pkg")
#: The drifting stream: its hot set moves every ``DRIFT_SECONDS`` of the soak.
DRIFT_SECONDS = 30.0
WORKLOAD = (
    "drift:mode=fluctuate,z=1.0,keys=5000,intervals={intervals},workers={workers},seed={seed}"
)
#: Seconds a final window's result stays in Redis once checked against the truth: an hour of
#: windows' results would otherwise grow Redis all along (``skewer aggregate --keep-results``).
KEEP_RESULTS_SECONDS = 10
#: A micro-batch holds at most this many seconds of a run's rate (Spark's
#: ``maxOffsetsPerTrigger``), as a deployment that must catch up after an outage sets it:
#: without it the first batch after a fault takes the whole backlog, and one slow task of it
#: (an executor's first, while its JVM and Python start) holds the run until it ends, where
#: speculation copies a slow task of a small batch within seconds.
BATCH_SECONDS = 5
#: Records of the saturating run that measures the cluster's capacity: enough that its
#: start-up is a small part of its time.
CAPACITY_RECORDS = 1_000_000
#: Shares of the saturating rate the capacity measure tries, highest first, for the two runs
#: together; if none keeps up the soak stops and says so.
SUSTAIN_SHARES = (0.8, 0.65, 0.5, 0.4)
#: Seconds each of those tries produces for. The runs start with a backlog (records produced
#: while their Spark applications plan their first batches and their JVMs warm) that grows for
#: most of a minute before it drains, so the first third of a try is its start-up and only the
#: later two thirds say whether the runs keep up.
SUSTAIN_SECONDS = 180
#: Bytes of the Kafka nodes' logs per record a run plans: its keys and work topics (the grouping
#: stage's transactions included) on three replicas, kept until the run is checked.
KAFKA_BYTES_PER_RECORD = 280
#: Free disk the soak asks for beyond its estimate of the Kafka logs.
DISK_MARGIN = 1.25


class SoakError(Exception):
    """The soak cannot run here (a service it needs is missing); one line."""


def require_cluster(settings: Any) -> None:
    """SoakError unless the cluster services answer: 3 Kafka nodes, a Spark master with two
    workers, Redis behind Sentinel (``skewer services up --kafka-brokers 3 --spark-workers 2
    --redis-sentinel``)."""
    from pipeline.io import config, probes
    from pipeline.services.spark_standalone import SparkMasterService

    wanted = "skewer services up --kafka-brokers 3 --spark-workers 2 --redis-sentinel"
    nodes = settings.kafka_bootstrap.split(",")
    if len(nodes) < config.KAFKA_CLUSTER_NODES:
        raise SoakError(
            "the soak runs on a Kafka cluster of 3 nodes, all named in SKEWER_KAFKA_BOOTSTRAP "
            f"(start them: {wanted})"
        )
    if not settings.redis_url.startswith("redis+sentinel://"):
        raise SoakError(f"the soak runs on Redis with Sentinel (start it: {wanted})")
    status = probes.spark_status(SparkMasterService(settings).master_web_url)
    alive = [w for w in (status or {}).get("workers", []) if w.get("state") == "ALIVE"]
    if len(alive) < 2:
        raise SoakError(f"the soak runs on a Spark master with two workers (start them: {wanted})")


def require_disk(settings: Any, records: int) -> None:
    """SoakError unless the disk of the Kafka nodes' logs has room for ``records`` (every run's
    planned records together, :data:`KAFKA_BYTES_PER_RECORD` each, with :data:`DISK_MARGIN`): a
    full disk would stop every node at once, in the middle of the hour."""
    import shutil

    from pipeline.services.kafka_broker import KafkaNodeService

    directory = KafkaNodeService(settings, 1).data_dir
    while not directory.exists():
        directory = directory.parent
    need = records * KAFKA_BYTES_PER_RECORD * DISK_MARGIN
    free = shutil.disk_usage(directory).free
    if free < need:
        raise SoakError(
            f"the soak's Kafka logs need about {need / 1e9:.1f} GB ({records:,} records, "
            f"{KAFKA_BYTES_PER_RECORD} bytes each on 3 replicas, x{DISK_MARGIN}) and "
            f"{directory} has {free / 1e9:.1f} GB free: free space, or lower --minutes or --load"
        )


def plan_of(settings: Any, scheme: str, rate: float, seconds: float, seed: int) -> Any:
    from pipeline.runs.plan import plan_run

    return plan_run(
        settings,
        run_prefix=f"soak-{scheme}",
        scheme=scheme,
        workers=WORKERS,
        sources=SOURCES,
        workload=WORKLOAD.format(
            intervals=max(1, round(seconds / DRIFT_SECONDS)), workers=WORKERS, seed=seed
        ),
        rate=rate,
        records=int(rate * seconds),
        window_ms=WINDOW_MS,
        spark_master=settings.spark_standalone_url,
        keep_results_s=KEEP_RESULTS_SECONDS,
        max_records_per_batch=max(1, int(rate * BATCH_SECONDS)),
    )


def measure_capacity(settings: Any, log: Callable[[str], None]) -> float:
    """The cluster's sustainable rate (records/s) for the soak's two runs side by side: the
    highest total rate, of :data:`SUSTAIN_SHARES` of the saturating rate
    (:func:`saturating_rate`), at which both runs, paced as the soak paces them, keep up
    (:func:`keeps_up`); :class:`SoakError` at none.

    The sustainable throughput of "Benchmarking Distributed Stream Data Processing Systems"
    (Karimov et al., ICDE 2018): a micro-batch pipeline applies a backlog in large batches, so
    its rate under a saturating offer is above the rate it keeps up with in batches of a
    second, and a load measured against it leaves too little room to catch up after a fault."""
    saturating = saturating_rate(settings)
    log(f"capacity: pkg alone on the cluster under a saturating offer, {saturating:,.0f} records/s")
    rate = saturating
    for share in SUSTAIN_SHARES:
        rate = share * saturating
        plans = [
            plan_of(settings, scheme, rate / len(SCHEMES), SUSTAIN_SECONDS, seed=0)
            for scheme in SCHEMES
        ]
        held = keeps_up(settings, plans)
        verdict = "kept up" if held else "fell behind"
        log(f"capacity: the two runs at {rate:,.0f} records/s: {verdict}")
        if held:
            return rate
    raise SoakError(
        f"the two runs kept up with none of {', '.join(f'{s:.0%}' for s in SUSTAIN_SHARES)}"
        f" of the saturating {saturating:,.0f} records/s: give each run's rate with --rate"
    )


def saturating_rate(settings: Any) -> float:
    """pkg's rate on the cluster under a saturating offer (records/s), one run alone: the
    records it applied over the seconds from its first record to its last, which the slowest
    stage sets."""
    from bench.end_to_end import Trace, row, traced_run
    from pipeline.runs.plan import plan_run

    plan = plan_run(
        settings,
        run_prefix="soak-capacity",
        scheme="pkg",
        workers=WORKERS,
        sources=SOURCES,
        workload="zipf:z=1.2,keys=100000,seed=0",
        records=CAPACITY_RECORDS,
        spark_master=settings.spark_standalone_url,
    )
    trace = Trace()
    summary, _ = traced_run(plan, settings, trace=trace)
    return float(row(summary, trace)["throughput"] or 0)


def keeps_up(settings: Any, plans: Sequence[Any]) -> bool:
    """Whether the runs of ``plans``, started side by side, keep up with their producers
    (:func:`kept_up` on each run's lag, sampled once a second). The runs are stopped and
    deleted after their producers' seconds."""
    from pipeline.runs.orchestrator import Pipeline, start_together

    pipelines = [Pipeline(plan, settings) for plan in plans]
    lags: list[list[int]] = [[] for _ in pipelines]
    try:
        start_together(pipelines)
        seconds = max(plan.records / plan.rate for plan in plans)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for run, pipeline in enumerate(pipelines):
                pipeline.check()
                progress = pipeline.progress()
                lags[run].append(progress.produced - progress.processed)
            time.sleep(1.0)
    finally:
        for pipeline in pipelines:
            pipeline.stop()
            pipeline.cleanup()
            pipeline.close()
    return all(kept_up(lag, plan.rate) for lag, plan in zip(lags, plans, strict=True))


def kept_up(lags: Sequence[int], rate: float) -> bool:
    """Whether a run kept up with its producer at ``rate`` records/s, from its lag (records
    produced, not applied) sampled while it produced: the mean over the last third at most one
    second of its rate above the mean over the middle third. A run that falls behind by a
    sixtieth of its rate over a three-minute try piles up more than that; the first third, its
    start-up's backlog, is not looked at.

    >>> kept_up([0, 500, 900, 700, 400, 300], rate=100.0)  # its start-up's backlog drains
    True
    >>> kept_up([0, 100, 200, 300, 400, 500], rate=100.0)  # 100 more behind every sample
    False
    """
    middle, last = lags[len(lags) // 3 : 2 * len(lags) // 3], lags[2 * len(lags) // 3 :]
    return _mean(last) <= _mean(middle) + rate


def _mean(values: Sequence[int]) -> float:
    return sum(values) / len(values) if values else math.inf


def run(
    *,
    minutes: float,
    load: float,
    faults: int,
    seed: int,
    kinds: Sequence[str] = chaos.KINDS,
    rate: float | None = None,
    services: Any = None,
    log: Callable[[str], None] = lambda _line: None,
) -> ExperimentResult:
    """The soak; ``rate`` (records/s of each run) instead of ``load`` x the measured capacity
    shared by the two runs. ``services``: the settings the native services were started with,
    if not the environment's (where a Sentinel URL stands for Redis's default ports); the runs
    take the environment's."""
    from confluent_kafka import KafkaException
    from redis.exceptions import RedisError

    from pipeline.io import config
    from pipeline.runs.orchestrator import Pipeline, start_together

    if not minutes > 0 or not 0 < load <= 1:
        raise ValueError("--minutes must be > 0 and --load in (0, 1]")
    seconds = minutes * 60
    schedule = chaos.schedule(faults, seconds, seed, kinds)
    settings = config.load()
    services = services or settings
    require_cluster(settings)
    capacity = None
    if rate is None:
        capacity = measure_capacity(settings, log)
        rate = load * capacity / len(SCHEMES)
    plans = [plan_of(settings, scheme, rate, seconds, seed) for scheme in SCHEMES]
    require_disk(services, sum(p.records for p in plans))
    log(
        f"soak: {minutes:g} min, {', '.join(p.run_id for p in plans)} at {rate:,.0f} records/s "
        f"each, {len(schedule)} faults (seed {seed})"
    )
    pipelines = [Pipeline(plan, settings) for plan in plans]
    began = time.monotonic()
    try:
        start_together(pipelines)
        origin = time.monotonic()
        sampler = Sampler(settings, services, pipelines, origin)
        sampler.start()
        injector = chaos.Injector(
            services, pipelines, origin, log, applied=lambda: all_applied(sampler, pipelines)
        )
        injector.launch(schedule)
        stopped = watch(pipelines, injector, sampler, seconds, log)
        injector.join()
        time.sleep(2.0)  # a last sample after the end
        sampler.stop()  # before the checks: both read the pipelines' Kafka consumers
        summaries = [finish(p) for p in pipelines]
        services_down = [s.line() for s in _services_not_running(services)]
    finally:
        for pipeline in pipelines:
            pipeline.stop()
            try:
                # The stage logs stay: an hour's record, to read when a check fails.
                pipeline.cleanup(logs=False)
            except (KafkaException, RedisError) as error:  # a service down at the end
                log(f"{pipeline.plan.run_id}: its topics or keys stay: {error}")
            pipeline.close()
            log(f"{pipeline.plan.run_id}: stage logs in {pipeline.log_dir}")
    data = results(
        plans=plans,
        rate=rate,
        capacity=capacity,
        load=load,
        seed=seed,
        seconds=seconds,
        samples=sampler.samples,
        struck=injector.struck,
        summaries=summaries,
        stopped=stopped,
        services_down=services_down,
        ran_s=time.monotonic() - began,
    )
    return ExperimentResult(
        name="soak",
        title=TITLE,
        markdown=markdown(data),
        figures={"series": figure(data)},
        data=data,
    )


def recheck(data: dict[str, Any]) -> ExperimentResult:
    """The soak recorded in ``data`` (the JSON of its page) judged by this version's checks:
    its samples, the faults it struck and its runs' summaries as they were recorded, the
    verdict, tables and picture made again. The checks read only the record, so a check whose
    definition changes needs no second hour."""
    from types import SimpleNamespace

    plans = [
        SimpleNamespace(run_id=run, scheme=scheme, workload=data["workload"], workers=WORKERS)
        for run, scheme in zip(data["runs"], data["schemes"], strict=True)
    ]
    struck = [chaos.Struck.from_dict(f) for f in data["faults"]]
    samples = [Sample.from_dict(x) for x in data["samples"]]
    checked = results(
        plans=plans,
        rate=data["rate"],
        capacity=data["capacity"],
        load=data["load"],
        seed=data["seed"],
        seconds=data["seconds"],
        samples=samples,
        struck=struck,
        summaries=data["summaries"],
        stopped=data["stopped"],
        services_down=data["services_down"],
        ran_s=data["ran_s"],
    )
    return ExperimentResult(
        name="soak",
        title=TITLE,
        markdown="The checks below judge the hour's record again (`skewer bench soak --recheck "
        "JSON`): its samples, faults and runs as they were recorded.\n\n" + markdown(checked),
        figures={"series": figure(checked)},
        data=checked,
    )


def command_of(data: dict[str, Any]) -> str:
    """The command line of the soak recorded in ``data``.

    >>> command_of({"seconds": 3600, "load": 0.5, "faults": [{}] * 24, "seed": 1,
    ...             "capacity": None, "rate": 6855.0})
    'skewer bench soak --minutes 60 --load 0.5 --faults 24 --seed 1 --rate 6855'
    """
    words = f"skewer bench soak --minutes {data['seconds'] / 60:g} --load {data['load']:g}"
    words += f" --faults {len(data['faults'])} --seed {data['seed']}"
    return words + (f" --rate {data['rate']:g}" if data["capacity"] is None else "")


def watch(
    pipelines: Sequence[Any],
    injector: chaos.Injector,
    sampler: Sampler,
    seconds: float,
    log: Callable[[str], None],
) -> list[str]:
    """Until every run applied its records and every fault recovered: start the stages faults
    ask for, and start again, as a supervisor would, a stage that exited non-zero when no fault
    had it down (named in the result: a defect)."""
    stopped: list[str] = []
    deadline = time.monotonic() + seconds * 2 + 600
    while time.monotonic() < deadline:
        injector.serve()
        for run, pipeline in enumerate(pipelines):
            for stage, running in list(pipeline.stages.items()):
                code = running.exit_code()
                if code not in (None, 0) and (run, stage) not in injector.down:
                    stopped.append(f"{pipeline.plan.run_id} {stage} exited {code}")
                    log(f"{pipeline.plan.run_id}: {stage} exited {code} on its own; started again")
                    pipeline.start(stage)
        if all_applied(sampler, pipelines) and not injector.busy:
            return stopped
        time.sleep(0.2)
    stopped.append("the soak did not end within twice its time")
    return stopped


def all_applied(sampler: Sampler, pipelines: Sequence[Any]) -> bool:
    """Whether the last sample has every run's records all applied."""
    last = sampler.samples[-1] if sampler.samples else None
    return last is not None and all(
        applied is not None and applied >= p.plan.records
        for applied, p in zip(last.applied, pipelines, strict=True)
    )


def finish(pipeline: Any) -> dict[str, Any]:
    """Wait for ``pipeline``'s stages to end, then check the run."""
    try:
        pipeline.wait(timeout=300)
    except Exception as error:
        return {"run_id": pipeline.plan.run_id, "failed": str(error)}
    summary = pipeline.summary()
    verification = summary.verification
    return {
        "run_id": pipeline.plan.run_id,
        "scheme": pipeline.plan.scheme,
        "records": pipeline.plan.records,
        "produced": summary.records_produced,
        "processed": summary.records_processed,
        "exact": bool(verification.exact),
        "verification": verification.lines(),
        "restarts": dict(summary.restarts),
    }


def _services_not_running(settings: Any) -> list[Any]:
    from pipeline.services import manager

    return [s for s in manager.status(settings) if s.state not in ("running", "external")]

"""The plan of one run: ``skewer demo``'s flags, resolved, and each stage's command line.

A :class:`RunPlan` is pure data: the scheme, the stream, the sizes and the run's names. It checks
itself (:meth:`RunPlan.validate`: the numbers, the workload spec and the scheme with the grouping
stage's own check) and spells the ``skewer`` arguments each stage process is started with
(:meth:`RunPlan.argv`), so the demo runs exactly the commands a user would type. (layer: runs)

Example (the commands of a run; nothing is started):
    >>> plan = RunPlan(scheme="pkg", records=1000, workers=4, sources=2, run_id="r1")
    >>> plan.names.work_topic, plan.names.redis_prefix
    ('r1-work', 'skewer:r1:')
    >>> " ".join(plan.argv("group"))
    'group --scheme pkg --workers 4 --sources 2 --run-id r1 --topic-prefix r1- --until-end --json'
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.io import config, kafka_io
from pipeline.io.spark_session import JIT_MODES, is_local
from producers.kafka_producer import DEFAULT_EVENT_RATE
from producers.workloads import DEFAULT_WORKLOAD

if TYPE_CHECKING:
    from pipeline.stages.user_topic import UserTopic
    from pipeline.stages.worker_job import WorkOptions

#: Start order: the workers first (the slowest to start), the producer last. ``control`` runs
#: for routing-table schemes only (:attr:`RunPlan.stages`).
STAGES = ("work", "aggregate", "control", "group", "produce")


def new_run_id(prefix: str = "demo") -> str:
    """A fresh run id, ``{prefix}-`` and 8 hex digits: every run gets its own topics and Redis
    keys."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class RunPlan:
    """What one run does: the demo's flags, resolved. ``topic_prefix`` None = ``{run_id}-``."""

    scheme: str
    records: int
    workers: int = 8
    sources: int = 2
    workload: str = DEFAULT_WORKLOAD
    rate: float | None = None
    window_ms: int = 10_000
    event_rate: float = DEFAULT_EVENT_RATE
    cpu_cost_us: float = 0.0
    top_k: int = 10
    lateness_ms: int = 0
    run_id: str = field(default_factory=new_run_id)
    topic_prefix: str | None = None
    checkpoint: Path | None = None
    max_records_per_batch: int | None = None
    #: Seconds between the controller's statistics rounds (routing-table schemes).
    control_interval: float = 2.0
    #: Rounds every this many records of all sources instead (``--control-every``): each
    #: source reports after every N/S of its own, as the simulator's per-source rounds.
    control_every: int | None = None
    #: The scheme's parameters as ``NAME=VALUE`` (``--param``), for the grouping stage and the
    #: controller alike.
    params: tuple[str, ...] = ()
    #: A user's own topic to read instead of producing (``--input-topic``): no producer runs,
    #: one source per partition, key and time from ``key`` and ``time`` (extractor specs), and
    #: a number to sum per (key, window) from ``sum`` (``--sum``; None: count only).
    input_topic: str | None = None
    key: str = "kafka-key"
    time: str = "kafka-timestamp"
    sum: str | None = None
    max_out_of_order_ms: int = 5_000
    idle_timeout_ms: int = 10_000
    #: Where the run ends in ``input_topic``, one offset per partition (``--ending-offsets``);
    #: None: each partition's end when the grouping stage starts.
    ending_offsets: tuple[int, ...] | None = None
    #: The run's query (``--query``) when it was given as one; ``input_topic``, ``key``,
    #: ``time``, ``sum`` and ``window_ms`` are then what it says, and its WHERE filters.
    query: str | None = None
    #: Where the workers' Spark tasks run (``--spark-master``); ``local`` by default.
    spark_master: str = config.DEFAULT_SPARK_MASTER
    #: Spark tasks per micro-batch (``skewer work --tasks``); None: the worker job's default.
    tasks: int | None = None
    #: How the workers' driver JVM compiles (``skewer work --jit``); None: :attr:`worker_jit`.
    jit: str | None = None
    #: The grouping stage's transaction cadence (``skewer group --commit-interval-ms``).
    commit_interval_ms: int = kafka_io.COMMIT_INTERVAL_MS
    #: The workers' Spark trigger (``skewer work --trigger``: micro-batch or real-time).
    trigger: str = config.MICRO_BATCH
    #: Seconds a published window's result stays in Redis (``skewer aggregate
    #: --keep-results``); None: until the run is deleted.
    keep_results_s: int | None = None

    @property
    def worker_jit(self) -> str:
        """``jit``, else ``quick`` for a paced run on a local master and ``peak`` otherwise.

        A paced run's first records wait for the JIT as long as C2 still compiles, for about
        20 s on two cores; C1 alone is warm within a second, and its half of C2's peak rate for
        the JVM's part of a record leaves a paced stream far below capacity room. A run over a
        backlog wants the peak (docs/performance.md#start-up). In Real-Time Mode C2's compiling
        also takes the cores from the producers and the grouping stage, whose records then wait.

        >>> RunPlan("pkg", 10, rate=1000.0).worker_jit, RunPlan("pkg", 10).worker_jit
        ('quick', 'peak')
        """
        if self.jit is not None:
            return self.jit
        return "quick" if self.rate is not None and is_local(self.spark_master) else "peak"

    def user_topic(self) -> UserTopic | None:
        """How the grouping stage reads ``input_topic`` (ValueError for a bad spec)."""
        from pipeline.stages.user_topic import UserTopic, topic_extractor

        if self.input_topic is None:
            return None
        return UserTopic(
            topic=self.input_topic,
            extractor=topic_extractor(self.key, self.time, self.sum, self.query),
            max_out_of_order_ms=self.max_out_of_order_ms,
            idle_timeout_ms=self.idle_timeout_ms,
            window_ms=self.window_ms,
            lateness_ms=self.lateness_ms,
            ending_offsets=self.ending_offsets,
            query=self.query,
        )

    def _aggregated(self) -> list[str]:
        """The query's aggregates of a column, as written (``sum(bytes)``)."""
        from pipeline.io.query.parse import parse_query

        if not self.query:
            return []
        job = parse_query(self.query)
        return [f"{a.function}({a.column})" for a in job.aggregates if a.column is not None]

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this run starts: ``control`` only for a routing-table scheme."""
        from pipeline.stages.controller import table_schemes

        table = self.scheme in table_schemes()
        skipped = {"control"} if not table else set()
        if self.input_topic is not None:
            skipped.add("produce")
        return tuple(s for s in STAGES if s not in skipped)

    @property
    def names(self) -> kafka_io.RunNames:
        prefix = f"{self.run_id}-" if self.topic_prefix is None else self.topic_prefix
        return kafka_io.RunNames(self.run_id, prefix)

    @property
    def topics(self) -> list[str]:
        """The run's own topics (never a user's input topic: cleaning up deletes these)."""
        names = self.names
        keys = [names.keys_topic] if self.input_topic is None else []
        return [
            *keys,
            names.work_topic,
            names.dead_letters_topic,
            names.late_topic,
            names.results_topic,
        ]

    def checkpoint_dir(self, settings: config.Settings) -> Path:
        return (self.checkpoint or settings.cache_dir / "checkpoints" / self.run_id).resolve()

    def validate(self) -> None:
        """ValueError (one line) for a bad number; SchemeError for a bad scheme or W."""
        from pipeline.stages import grouping
        from producers.workloads import WorkloadError, parse

        for name, value in (
            ("--records", self.records),
            ("--workers", self.workers),
            ("--sources", self.sources),
            ("--window", self.window_ms),
            ("--commit-interval-ms", self.commit_interval_ms),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not self.control_interval > 0:
            raise ValueError(f"--control-interval must be > 0, got {self.control_interval}")
        if self.control_every is not None and self.control_every < 1:
            raise ValueError(f"--control-every must be >= 1, got {self.control_every}")
        if self.cpu_cost_us < 0:
            raise ValueError(f"--cpu-cost-us must be >= 0, got {self.cpu_cost_us}")
        if self.keep_results_s is not None and self.keep_results_s < 0:
            raise ValueError(f"--keep-results must be >= 0, got {self.keep_results_s}")
        if self.keep_results_s is not None and self.input_topic is not None:
            raise ValueError(
                "--keep-results checks each window against the producers' ground truth; a run "
                "on --input-topic has none, and verify --recount reads its results from Redis"
            )
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0, got {self.rate}")
        if not self.event_rate > 0:
            raise ValueError(f"--event-rate must be > 0, got {self.event_rate}")
        if self.trigger not in config.TRIGGERS:
            raise ValueError(
                f"--trigger must be one of {', '.join(config.TRIGGERS)}, got {self.trigger!r}"
            )
        if self.query and self.sum:
            raise ValueError("--query says the job's aggregates: drop --sum")
        aggregated = self._aggregated()
        if self.trigger == config.REAL_TIME and (self.sum or aggregated):
            said = f"--query's {aggregated[0]}" if aggregated else "--sum"
            raise ValueError(
                f"{said} is for --trigger micro-batch: the real-time writer keeps counts only"
            )
        if self.jit is not None and self.jit not in JIT_MODES:
            raise ValueError(f"--jit must be one of {', '.join(JIT_MODES)}, got {self.jit!r}")
        # RunKeys refuses run ids that would break key names or glob patterns.
        from pipeline.io.redis_layout import RunKeys

        RunKeys(self.run_id)
        user_topic = self.user_topic()  # ExtractorSpecError is a ValueError
        if user_topic is not None:
            user_topic.validate()
        try:
            parse(self.workload)
        except WorkloadError as error:
            raise ValueError(f"--workload: {error}") from None
        # The live stage's own check: unknown, simulator-only or badly parameterised schemes.
        stage = self.stage_config(config.load({}))
        for source in range(self.sources):
            grouping.create_scheme(stage, source)

    def stage_config(self, settings: config.Settings) -> Any:
        from operators.params import parse_params
        from pipeline.stages import grouping

        return grouping.StageConfig(
            bootstrap=settings.kafka_bootstrap,
            redis_url=settings.redis_url,
            names=self.names,
            scheme=self.scheme,
            n_workers=self.workers,
            n_sources=self.sources,
            params=parse_params(list(self.params)),
            commit_interval_ms=self.commit_interval_ms,
            input=self.user_topic(),
            replication=settings.kafka_replication,
        )

    def argv(self, stage: str, settings: config.Settings | None = None) -> list[str]:
        """The ``skewer`` arguments of ``stage`` (checkpoint resolved with ``settings``)."""
        names = self.names
        run = ["--run-id", self.run_id, "--topic-prefix", names.topic_prefix]
        workers = ["--workers", str(self.workers)]
        window = ["--window-ms", str(self.window_ms)]
        if stage in ("produce", "work", "aggregate"):
            run += ["--scheme", self.scheme]  # only a label of their metrics (pipeline/metrics)
        if stage == "produce":
            out = ["produce", "--workload", self.workload, "--records", str(self.records)]
            out += ["--sources", str(self.sources), *window]
            out += ["--event-rate", _number(self.event_rate)]
            if self.rate is not None:
                out += ["--rate", _number(self.rate)]
            if self.trigger == config.REAL_TIME:
                out += ["--linger-ms", str(kafka_io.REAL_TIME_LINGER_MS)]
            return [*out, *run, "--json"]
        params = [word for item in self.params for word in ("--param", item)]
        if stage == "group":
            out = ["group", "--scheme", self.scheme, *workers, "--sources", str(self.sources)]
            if self.control_every is not None:
                out += ["--control-every", str(self.control_every)]
            if self.commit_interval_ms != kafka_io.COMMIT_INTERVAL_MS:
                out += ["--commit-interval-ms", str(self.commit_interval_ms)]
            if self.query is not None:
                # The query says the topic, key, time, sum and window.
                out += ["--query", self.query, "--lateness-ms", str(self.lateness_ms)]
                out += ["--max-out-of-order", f"{self.max_out_of_order_ms}ms"]
                out += ["--idle-timeout", f"{self.idle_timeout_ms}ms"]
            elif self.input_topic is not None:
                out += ["--input-topic", self.input_topic, "--key", self.key]
                out += ["--time", self.time, *window, "--lateness-ms", str(self.lateness_ms)]
                out += ["--max-out-of-order", f"{self.max_out_of_order_ms}ms"]
                out += ["--idle-timeout", f"{self.idle_timeout_ms}ms"]
                if self.sum:
                    out += ["--sum", self.sum]
            if self.input_topic is not None and self.ending_offsets is not None:
                out += ["--ending-offsets", ",".join(map(str, self.ending_offsets))]
            return [*out, *params, *run, "--until-end", "--json"]
        if stage == "work":
            checkpoint = self.checkpoint_dir(settings or config.load())
            out = ["work", *workers, "--sources", str(self.sources), *window]
            out += ["--cpu-cost-us", _number(self.cpu_cost_us), "--checkpoint", str(checkpoint)]
            if self.max_records_per_batch is not None:
                out += ["--max-records-per-batch", str(self.max_records_per_batch)]
            out += ["--spark-master", self.spark_master, "--jit", self.worker_jit]
            out += ["--trigger", self.trigger]
            if self.tasks is not None:
                out += ["--tasks", str(self.tasks)]
            return [*out, *run, "--until-end", "--verbose", "--json"]
        if stage == "control":
            out = ["control", "--scheme", self.scheme, *workers, "--sources", str(self.sources)]
            out += ["--interval", _number(self.control_interval), *params]
            if self.control_every is not None:
                out += ["--every", str(self.control_every)]
            return [*out, *run, "--until-end", "--json"]
        if stage == "aggregate":
            out = ["aggregate", *workers, *window, "--lateness-ms", str(self.lateness_ms)]
            out += ["--top-k", str(self.top_k)]
            if self.keep_results_s is not None:
                out += ["--keep-results", str(self.keep_results_s)]
            return [*out, *run, "--until-end", "--json"]
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")

    def work_options(self, settings: config.Settings) -> WorkOptions:
        """The worker job's options of this run, for running it in-process (tests)."""
        from pipeline.stages.worker_job import WorkOptions

        return WorkOptions(
            workers=self.workers,
            sources=self.sources,
            kafka_bootstrap=settings.kafka_bootstrap,
            redis_url=settings.redis_url,
            checkpoint=self.checkpoint_dir(settings),
            work_topic=self.names.work_topic,
            window_ms=self.window_ms,
            cpu_cost_us=self.cpu_cost_us,
            run_id=self.run_id,
            until_end=True,
            max_records_per_batch=self.max_records_per_batch,
            spark_master=self.spark_master,
            tasks=self.tasks,
            jit=self.worker_jit,
            trigger=self.trigger,
        )


def plan_run(
    settings: config.Settings,
    *,
    run_id: str | None = None,
    run_prefix: str = "demo",
    spark_master: str | None = None,
    **fields: Any,
) -> RunPlan:
    """The checked plan of one run, the one way from options to a :class:`RunPlan`.

    ``fields`` are :class:`RunPlan`'s; one given as None takes its default. The workers run on
    ``spark_master`` (default: the settings'); the run id is ``run_id``, else a fresh
    ``{run_prefix}-XXXXXXXX``. ValueError with one line for a bad option (a SchemeError is
    one).

    >>> plan = plan_run(config.load({}), scheme="key", records=10, rate=None, run_prefix="t")
    >>> plan.run_id.startswith("t-"), plan.rate, plan.spark_master
    (True, None, 'local')
    >>> plan_run(config.load({}), scheme="key", records=0)
    Traceback (most recent call last):
    ...
    ValueError: --records must be >= 1, got 0
    """
    plan = RunPlan(
        run_id=run_id or new_run_id(run_prefix),
        spark_master=spark_master or settings.spark_master,
        **{name: value for name, value in fields.items() if value is not None},
    )
    plan.validate()
    return plan


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))

"""Is a run on a user's topic exact? Recount the topic with a Spark batch query and compare.

Layer: runs.

A run on a user's topic (``--input-topic``) has no ground truth from skewer's producers.
``skewer verify --run-id R --recount`` makes one as a Spark user would: one batch query over the
topic up to the offsets the run's sources committed, extracting key, event time and the columns
of the run's state fields with the run's own extractor, leaving out the records the run reported
late, and counting per (window, key) with ``groupBy().count()`` (and Spark's ``count``, ``sum``,
``min`` and ``max`` of each column for its fields). Every value must equal the run's
final result, every recounted window must be final, and the records left out must be exactly
the run's late records and dead letters. See docs/own-topic.md.

Example (a report with one difference):
    >>> report = RecountVerification(
    ...     windows=2, keys=3, recounted=10, result_records=9, late=1, run_late=1,
    ...     invalid=0, run_dead_letters=0, missing_windows=[],
    ...     mismatches=[(0, b"a", 5, 4)], mismatch_count=1)
    >>> report.exact
    False
    >>> print(report.lines()[0])
    NOT exact: 1 (key, window) count(s) differ from the recount (2 windows, 3 keys)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from pipeline.io import kafka_io, kafka_security, records
from pipeline.io.extractors import Extractor, format_amount, values_and_mask
from pipeline.io.grouping_store import GroupingStore
from pipeline.io.query.job import Column, Predicate
from pipeline.io.query.predicate import kept
from pipeline.io.state_store import Differences, mismatch_rows
from pipeline.runs import query_check
from pipeline.runs.query_check import RowComparison

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.io.state_store import StateStore
    from pipeline.stages.user_topic import UserTopic

#: Mismatches kept for the report (the count covers all of them).
MAX_REPORTED = 20
#: The rows :class:`ExtractWindows` yields to Spark.
RECOUNT_SCHEMA = (
    "partition int, offset long, key binary, window long, valid boolean, passed boolean"
)


@dataclass(frozen=True)
class RecountVerification:
    """The outcome of :func:`verify_recount`."""

    windows: int
    keys: int
    recounted: int
    result_records: int
    #: Records the recount left out as late, and what the run reported late.
    late: int
    run_late: int
    #: Records the extractor refused, and the run's dead letters.
    invalid: int
    run_dead_letters: int
    #: Recounted windows that are not final in the run.
    missing_windows: list[int]
    #: The first few ``(window, key, recount, result)`` that differ.
    mismatches: list[tuple[int, bytes, int, int]] = field(default_factory=list)
    mismatch_count: int = 0
    #: Runs with state fields (``--sum``, a query's aggregates of columns): (key, window) values
    #: compared, and the first few that differ as ``(field, window, key, recount, result)``
    #: (None: NULL).
    fields_compared: int = 0
    field_mismatches: list[tuple[str, int, bytes, int | None, int | None]] = field(
        default_factory=list
    )
    field_mismatch_count: int = 0
    #: Runs with a query's WHERE: records it left out in the recount, and in the run.
    filtered: int = 0
    run_filtered: int = 0
    #: A query's run: its rows against the query's own text run on Spark SQL
    #: (:mod:`pipeline.runs.query_check`); None without a query.
    rows: RowComparison | None = None

    @property
    def exact(self) -> bool:
        return (
            self.mismatch_count == 0
            and self.field_mismatch_count == 0
            and not self.missing_windows
            and self.late == self.run_late
            and self.invalid == self.run_dead_letters
            and self.filtered == self.run_filtered
            and (self.rows is None or (self.rows.mismatch_count == 0 and self.rows.compared > 0))
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "exact": self.exact,
            "windows": self.windows,
            "keys": self.keys,
            "recounted": self.recounted,
            "result_records": self.result_records,
            "late": self.late,
            "run_late": self.run_late,
            "invalid": self.invalid,
            "run_dead_letters": self.run_dead_letters,
            "filtered": self.filtered,
            "run_filtered": self.run_filtered,
            "missing_windows": self.missing_windows,
            "mismatch_count": self.mismatch_count,
            "mismatches": mismatch_rows(self.mismatches, "recount"),
            "fields_compared": self.fields_compared,
            "field_mismatch_count": self.field_mismatch_count,
            "rows": None if self.rows is None else vars(self.rows),
            "field_mismatches": [
                {
                    "field": name,
                    "window": window,
                    "key": key.decode("utf-8", "replace"),
                    "recount": _shown(expected),
                    "result": _shown(got),
                }
                for name, window, key, expected, got in self.field_mismatches
            ],
        }

    def lines(self) -> list[str]:
        scope = f"({self.windows} windows, {self.keys} keys)"
        if self.exact:
            what = "count and state field" if self.fields_compared else "count"
            head = f"exact: every (key, window) {what} equals the recount {scope}"
        else:
            head = (
                f"NOT exact: {self.mismatch_count} (key, window) count(s) differ from the "
                f"recount {scope}"
            )
        out = [head]
        out += [
            f"  window {window} key {key!r}: recount {expected}, result {got}"
            for window, key, expected, got in self.mismatches
        ]
        if self.fields_compared:
            out.append(
                f"  state fields: {self.fields_compared:,} (key, window) values compared, "
                f"{self.field_mismatch_count} differ"
            )
            out += [
                f"  window {window} key {key!r}: {name} recount {_shown(expected)}, "
                f"result {_shown(got)}"
                for name, window, key, expected, got in self.field_mismatches
            ]
        if self.rows is not None:
            out.append(
                f"  query rows: {self.rows.compared:,} compared with the query run on Spark SQL, "
                f"{self.rows.mismatch_count} on one side only"
            )
            out += [f"  {row}" for row in self.rows.mismatches]
        if self.missing_windows:
            out.append(f"  windows not final: {self.missing_windows[:10]}")
        out.append(
            f"  records: recounted {self.recounted:,}, results {self.result_records:,}; "
            f"late {self.late:,} (run reported {self.run_late:,}); not extractable "
            f"{self.invalid:,} (run's dead letters {self.run_dead_letters:,})"
            + (
                f"; left out by WHERE {self.filtered:,} (run {self.run_filtered:,})"
                if self.filtered or self.run_filtered
                else ""
            )
        )
        return out


@dataclass(frozen=True)
class ExtractWindows:
    """The function each Spark task of the recount runs (``mapInArrow``): the run's extractor
    over Arrow batches of ``partition, offset, key, value, timestamp_ms``."""

    extractor: Extractor
    window_ms: int
    #: The run's query's WHERE: a row it leaves out is ``passed`` false.
    where: Predicate | None = None
    #: The columns of the run's state fields (None: ``--sum``'s amount; the others must be
    #: among the extractor's columns), each yielded as :func:`recount_column` names it, NULL
    #: where a record has no value.
    columns: tuple[str | None, ...] = ()
    #: A query's columns, yielded under their names for Spark SQL (:mod:`.query_check`).
    view: tuple[Column, ...] = ()

    @property
    def schema(self) -> str:
        """The Spark schema of what :meth:`__call__` yields."""
        extra = "".join(f", {recount_column(i)} long" for i in range(len(self.columns)))
        view = f", {query_check.view_schema(self.view)}" if self.view else ""
        return RECOUNT_SCHEMA + extra + view

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if not batch.num_rows:
                continue
            extracted = self.extractor.extract(
                batch.column("value"),
                batch.column("key"),
                batch.column("timestamp_ms").to_numpy(zero_copy_only=False),
            )
            valid = extracted.reasons < 0
            passed = valid if self.where is None else kept(self.where, extracted.columns)
            windows = records.window_start(extracted.event_time_ms, self.window_ms)
            # A query's columns are among the extractor's own (recount() gives it them all).
            read: dict[str | None, tuple[np.ndarray, np.ndarray]] = {
                c: values_and_mask(extracted.columns[c]) for c in self.columns if c is not None
            }
            if None in self.columns:
                read[None] = (extracted.amount_micros, valid)
            values = [pa.array(read[c][0], pa.int64(), mask=~read[c][1]) for c in self.columns]
            view_names: list[str] = []
            if self.view:
                view_names, view_arrays = query_check.view_arrays(
                    self.view, extracted.columns, extracted.event_time_ms
                )
                values += view_arrays
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column("partition"),
                    batch.column("offset"),
                    pa.array(extracted.keys.to_list(), pa.binary()),
                    pa.array(np.where(valid, windows, 0), pa.int64()),
                    pa.array(valid),
                    pa.array(passed),
                    *values,
                ],
                names=[
                    "partition",
                    "offset",
                    "key",
                    "window",
                    "valid",
                    "passed",
                    *(recount_column(i) for i in range(len(self.columns))),
                    *view_names,
                ],
            )


def recount_column(index: int) -> str:
    """The name of the recount's ``index``-th column of state fields."""
    return f"column_{index}"


def _shown(value: int | None) -> str:
    """A state field's value in a report: exact decimal text of millionths, or NULL."""
    return "NULL" if value is None else format_amount(value)


def consumed_offsets(bootstrap: str, names: kafka_io.RunNames, topic: str) -> dict[int, int]:
    """Per partition of ``topic``: the offset the run's grouping source committed (the next it
    would read), i.e. where what the run read ends."""
    from confluent_kafka import Consumer, TopicPartition

    partitions = kafka_io.topic_partitions(bootstrap, topic)
    if partitions is None:
        raise kafka_io.KafkaIOError(f"kafka: no topic {topic!r} to recount")
    ends: dict[int, int] = {}
    for source in range(partitions):
        consumer = Consumer(kafka_io.consumer_config(bootstrap, names.consumer_group(source)))
        try:
            tp = TopicPartition(topic, source)
            committed = kafka_io.committed_offset(consumer, tp).offset
            low = kafka_io.watermark_offsets(consumer, tp, timeout=30)[0]
        finally:
            consumer.close()
        ends[source] = max(committed, low)
    return ends


def reported_late(bootstrap: str, names: kafka_io.RunNames) -> list[tuple[int, int]]:
    """(partition, offset) of every input record the run sent to its ``late`` topic."""
    if kafka_io.topic_partitions(bootstrap, names.late_topic) is None:
        return []
    stored = kafka_io.read_topic(bootstrap, names.late_topic)
    return sorted(
        {
            (int(doc["partition"]), int(doc["offset"]))
            for doc in (json.loads(record.value or b"{}") for record in stored)
        }
    )


def recount(
    spark: SparkSession,
    bootstrap: str,
    user_topic: UserTopic,
    ends: dict[int, int],
    late: list[tuple[int, int]],
) -> Recount:
    """Counts, and each state field's value (:attr:`UserTopic.state_fields`), per window and
    key of the run's topic up to ``ends``, without the ``late`` records and those the query's
    WHERE leaves out."""
    from pyspark.sql import functions

    topic, fields = user_topic.topic, user_topic.state_fields
    job = user_topic.job
    if not any(ends.values()):
        return Recount({}, [{} for _ in fields], 0, 0, 0, 0, [] if job else None)
    view = () if job is None else tuple(c for c in job.columns if c.spec.source != "kafka-key")
    extractor = user_topic.extractor
    if view:  # the extractor reads every column the query names, for Spark SQL
        extractor = dataclasses.replace(extractor, columns=view)
    extract = ExtractWindows(
        extractor,
        user_topic.window_ms,
        user_topic.where,
        tuple(dict.fromkeys(f.column for f in fields)),
        view,
    )
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
        .options(**kafka_security.from_environ().spark_options())
        .load()
        .select(
            "partition",
            "offset",
            "key",
            "value",
            functions.expr("unix_millis(timestamp)").alias("timestamp_ms"),
        )
        .mapInArrow(extract, extract.schema)
        .cache()
    )
    invalid = frame.filter(~functions.col("valid")).count()
    filtered = frame.filter(functions.col("valid") & ~functions.col("passed")).count()
    valid = frame.filter("valid AND passed")
    late_frame = spark.createDataFrame(late, "partition int, offset long")
    # Every readable record but the late ones; those the WHERE keeps are what the run counted.
    readable = frame.filter("valid").join(late_frame, ["partition", "offset"], "left_anti")
    kept = readable.filter("passed")
    left_out = valid.count() - kept.count()
    spark_functions = {
        "count": functions.count,
        "sum": functions.sum,
        "min": functions.min,
        "max": functions.max,
    }
    aggregates = [functions.count(functions.lit(1)).alias("count")]
    aggregates += [
        spark_functions[f.part](recount_column(extract.columns.index(f.column))).alias(f"field_{i}")
        for i, f in enumerate(fields)
    ]
    counts: dict[int, dict[bytes, int]] = {}
    values: list[dict[int, dict[bytes, int]]] = [{} for _ in fields]
    total = 0
    for row in kept.groupBy("window", "key").agg(*aggregates).collect():
        window, key = int(row["window"]), bytes(row["key"])
        counts.setdefault(window, {})[key] = int(row["count"])
        for i, per_window in enumerate(values):
            if row[f"field_{i}"] is not None:  # SQL's NULL: no value
                per_window.setdefault(window, {})[key] = int(row[f"field_{i}"])
        total += int(row["count"])
    sql_rows = None
    if job is not None:
        # The query itself on Spark SQL, over every readable record but the late ones: its
        # WHERE, windows and aggregates are Spark's. Only the query's columns: the recount's
        # own (``window`` among them) would shadow the query's names.
        names = [query_check.EVENT_TIME, *(c.name for c in view)]
        columns = readable.select(*(functions.col(f"`{name}`") for name in names))
        columns.createOrReplaceTempView(query_check.VIEW)
        sql_rows = [tuple(row) for row in spark.sql(query_check.spark_sql_text(job)).collect()]
    frame.unpersist()
    return Recount(counts, values, total, left_out, invalid, filtered, sql_rows)


def verify_recount(
    spark: SparkSession,
    store: StateStore,
    bootstrap: str,
    names: kafka_io.RunNames,
    user_topic: UserTopic,
) -> RecountVerification:
    """Recount the run's topic as the run read it and compare with its final results."""
    fields = user_topic.state_fields
    ends = consumed_offsets(bootstrap, names, user_topic.topic)
    late = reported_late(bootstrap, names)
    recounted = recount(spark, bootstrap, user_topic, ends, late)
    counts = recounted.counts
    final = set(store.final_windows())
    count_diff = Differences(MAX_REPORTED)
    field_diffs = [Differences(MAX_REPORTED) for _ in fields]
    result_records = 0
    keys: set[bytes] = set()
    for window in sorted(set(counts) | final):
        expected = counts.get(window, {})
        got = store.result(window) if window in final else {}
        result_records += sum(got.values())
        keys.update(expected, got)
        count_diff.compare(window, expected, got)
        got_fields = store.result_fields(window) if window in final else [{} for _ in fields]
        for diff, per_window, got_field in zip(
            field_diffs, recounted.fields, got_fields, strict=True
        ):
            diff.compare(window, per_window.get(window, {}), got_field, missing=None)
    counters = GroupingStore(store.client, names.run_id)
    run_late = sum(counters.late_per_source().values())
    run_dead = sum(counters.dead_letters_by_reason().values())
    field_mismatches = [
        (declared.name, *mismatch)
        for declared, diff in zip(fields, field_diffs, strict=True)
        for mismatch in diff.first
    ]
    return RecountVerification(
        windows=len(set(counts) | final),
        keys=len(keys),
        recounted=recounted.records,
        result_records=result_records,
        late=recounted.late,
        run_late=run_late,
        invalid=recounted.invalid,
        run_dead_letters=run_dead,
        missing_windows=sorted(set(counts) - final),
        mismatches=count_diff.first,
        mismatch_count=count_diff.count,
        fields_compared=sum(diff.compared for diff in field_diffs),
        field_mismatches=field_mismatches[:MAX_REPORTED],
        field_mismatch_count=sum(diff.count for diff in field_diffs),
        filtered=recounted.filtered,
        run_filtered=sum(counters.filtered_per_source().values()),
        rows=None
        if recounted.sql_rows is None
        else _compare_rows(store, user_topic, final, recounted.sql_rows),
    )


def _compare_rows(
    store: StateStore, user_topic: UserTopic, final: set[int], sql_rows: list[tuple[Any, ...]]
) -> RowComparison:
    """The run's rows of every final window (as its aggregator publishes them) against the
    query's own on Spark SQL."""
    from pipeline.io.query.job import output_row
    from pipeline.io.state_store import key_text

    job = user_topic.job
    assert job is not None  # a query's run
    ours = [
        output_row(job, window, key_text(key), count, fields)
        for window in sorted(final)
        for fields in [store.result_fields(window)]
        for key, count in sorted(store.result(window).items())
    ]
    return query_check.compare_rows(job, ours, sql_rows)


class Recount(NamedTuple):
    """What :func:`recount` found: per window, key -> count, and for each state field per
    window, key -> its value (absent: NULL)."""

    counts: dict[int, dict[bytes, int]]
    fields: list[dict[int, dict[bytes, int]]]
    records: int
    #: Late records left out, records the extractor refused, and those the WHERE left out.
    late: int
    invalid: int
    filtered: int
    #: A query's run: the rows of the query's own text on Spark SQL, else None.
    sql_rows: list[tuple[Any, ...]] | None = None

"""The aggregator: closes windows once every worker's watermark has passed them, merges.

Layer: stages.

A window is final when the pipeline's watermark (the minimum of the workers' ``wm:{worker}``)
has passed its end plus the lateness (:func:`operators.windows.closable_windows`). Then, per
window: close it and read the partials (one MULTI), merge and take the top-k (pure), finalize
(one guarded Lua script: result, top-k, partials freed, ``windows:final``), and publish its
records to ``results`` in one Kafka transaction (``windows:published`` once it committed; a
restarted aggregator first marks what the topic holds); with ``keep_results_s``, check it
against the truth and let its keys expire. A crash anywhere leaves a state the next pass
completes without doing anything twice (docs/design.md#closing-a-window). Records of
``results``: :func:`result_records`, or a query's rows, one per (key, window)
(:func:`query_rows`).

Example (the records of one window):
    >>> [(key, json.loads(value)["counts"]) for key, value in result_records(
    ...     "r", 0, 10, {b"a": 2, b"b": 1}, [(b"a", 2)], keys_per_record=1)]
    [(b'0', {'a': 2}), (b'0', {'b': 1})]
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators.aggregates import StateField, merge_maps
from operators.windows import closable_windows, merge_partials, state_entries, top_k
from pipeline.io.extractors import format_amount
from pipeline.io.query.job import Job, output_row
from pipeline.io.records import END_OF_STREAM
from pipeline.io.state_store import StateStore, key_text
from pipeline.observe.timeline import TimelineSampler
from pipeline.stages import user_topic

#: Keys per ``results`` record: ~40 bytes each keeps a record well under Kafka's 1 MiB default.
KEYS_PER_RECORD = 20_000


@dataclass(frozen=True)
class AggregateOptions:
    workers: int
    window_ms: int = 10_000
    lateness_ms: int = 0
    top_k: int = 10
    run_id: str = "default"
    until_end: bool = False
    #: Seconds a published window's result and truth stay in Redis after it is checked
    #: against the truth (``--keep-results``); None: until the run is deleted.
    keep_results_s: int | None = None

    def validate(self) -> None:
        """ValueError with one line for the user unless every setting makes sense."""
        if self.keep_results_s is not None and self.keep_results_s < 0:
            raise ValueError(f"--keep-results must be >= 0, got {self.keep_results_s}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.window_ms < 1:
            raise ValueError(f"--window-ms must be >= 1, got {self.window_ms}")
        if self.lateness_ms < 0 or self.top_k < 0:
            raise ValueError("--lateness-ms and --top-k must be >= 0")


@dataclass
class AggregateSummary:
    finalized: list[int] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    finished: bool = False


def result_records(
    run_id: str,
    window: int,
    window_ms: int,
    counts: Mapping[bytes, int],
    top: Sequence[tuple[bytes, int]],
    keys_per_record: int = KEYS_PER_RECORD,
    fields: Sequence[tuple[StateField, Mapping[bytes, int]]] = (),
) -> list[tuple[bytes, bytes]]:
    """``(kafka key, JSON value)`` of a window's result, in parts of ``keys_per_record`` keys;
    each of the run's state ``fields`` (with its value per key) as a map of its own, named as
    the field is (``sums`` for ``--sum``): counts as integers, the rest as exact decimal text,
    null for a key without a value."""
    ordered = sorted(counts.items())
    parts = max(1, -(-len(ordered) // keys_per_record))
    header: dict[str, Any] = {
        "run_id": run_id,
        "window": window,
        "window_end": window + window_ms,
        "records": sum(counts.values()),
        "distinct_keys": len(counts),
        "top_k": [[key_text(key), count] for key, count in top],
    }
    out = []
    for part in range(parts):
        chunk = ordered[part * keys_per_record : (part + 1) * keys_per_record]
        value = {**header, "counts": {key_text(key): count for key, count in chunk}}
        for declared, values in fields:
            shown = int if declared.part == "count" else format_amount
            value[declared.name] = {
                key_text(key): shown(values[key]) if key in values else None for key, _ in chunk
            }
        value.update(part=part, parts=parts)
        out.append((str(window).encode(), json.dumps(value).encode()))
    return out


def query_rows(
    job: Job,
    window: int,
    counts: Mapping[bytes, int],
    fields: Sequence[Mapping[bytes, int]],
) -> list[tuple[bytes, bytes]]:
    """``(kafka key, JSON row)`` per key of a window of a query's run, in key order: the
    query's output columns as it names them (:func:`pipeline.io.query.job.output_row`;
    ``fields``: each of :attr:`Job.state_fields`' final values per key)."""
    return [
        (
            str(window).encode(),
            json.dumps(output_row(job, window, key_text(key), count, fields)).encode(),
        )
        for key, count in sorted(counts.items())
    ]


class Aggregator:
    """One pass at a time over the run's windows (:meth:`step`), or a loop (:meth:`run`).

    ``publish`` sends a window's records to ``results`` and returns once Kafka acknowledged
    them (it raises otherwise); tests pass a list's ``extend`` or a real producer.
    """

    def __init__(
        self,
        store: StateStore,
        options: AggregateOptions,
        publish: Callable[[list[tuple[bytes, bytes]]], None],
    ) -> None:
        options.validate()
        self.store = store
        self.options = options
        self.publish = publish
        self._job: Job | None = None
        self._job_read = False

    def resume(self, published: Collection[int]) -> None:
        """Mark final windows whose records ``results`` holds already as published: an
        aggregator killed after Kafka committed a window's transaction and before Redis heard
        of it does not publish the window twice."""
        for window in self.store.unpublished_windows():
            if window in published:
                self.store.mark_published(window)

    def job(self) -> Job | None:
        """The run's query, once its grouping stage has recorded how it reads its topic (it
        has by the time any window is final); None for a run without one."""
        if not self._job_read:
            found = user_topic.recorded(self.store.client, self.store.keys.run_id)
            if found is not None:  # recorded once, before any record is routed: final
                self._job, self._job_read = found[0].job, True
        return self._job

    def check_config(self) -> None:
        """The workers' window length must be ours (they record it; see worker_job.prepare)."""
        differing = self.store.claim_config(
            window_ms=self.options.window_ms, workers=self.options.workers
        )
        if differing:
            name, (recorded, given) = next(iter(differing.items()))
            raise ValueError(
                f"run {self.options.run_id!r} uses {name}={recorded}, not {given}: "
                f"pass --{name.replace('_', '-')} {recorded}"
            )

    def step(self) -> AggregateSummary:
        """Finalize every closable window, then publish every final, unpublished one."""
        summary = AggregateSummary()
        workers = self.options.workers
        watermark = self.store.min_watermark(workers)
        closable = closable_windows(
            np.array(self.store.open_windows(), dtype=np.int64),
            watermark,
            self.options.window_ms,
            self.options.lateness_ms,
        )
        declared_fields = self.store.declared_fields()
        for window in closable.tolist():
            partials = self.store.close_window(window, workers)
            merged = merge_partials(partials.counts)
            fields = [
                merge_maps(declared.merge, per_worker)
                for declared, per_worker in zip(declared_fields, partials.fields, strict=True)
            ]
            top = top_k(merged, self.options.top_k)
            entries = state_entries(partials.counts)
            if self.store.finalize_window(window, workers, merged, top, entries, fields):
                summary.finalized.append(window)
        for window in self.store.unpublished_windows():
            job = self.job()
            if job is not None:
                records = query_rows(
                    job, window, self.store.result(window), self.store.result_fields(window)
                )
            else:
                records = result_records(
                    self.options.run_id,
                    window,
                    self.options.window_ms,
                    self.store.result(window),
                    self.store.topk(window),
                    fields=list(
                        zip(declared_fields, self.store.result_fields(window), strict=True)
                    ),
                )
            self.publish(records)
            self.store.mark_published(window)
            summary.published.append(window)
        if self.options.keep_results_s is not None:
            for window in self.store.unchecked_windows():
                self.store.retire_window(window, self.options.keep_results_s)
        summary.finished = (
            watermark == END_OF_STREAM
            and not self.store.open_windows()
            and not self.store.unpublished_windows()
        )
        return summary

    def run(
        self,
        poll_seconds: float = 0.25,
        on_step: Callable[[AggregateSummary], None] | None = None,
    ) -> AggregateSummary:
        """Step until every window is final and published after END_OF_STREAM (``until_end``),
        or forever."""
        total = AggregateSummary()
        # The run report's timeline: a sample about once a second and a last one on the way out.
        timeline = TimelineSampler(self.store, self.options.workers)
        try:
            while True:
                summary = self.step()
                timeline.tick()
                total.finalized += summary.finalized
                total.published += summary.published
                if on_step is not None and (summary.finalized or summary.published):
                    on_step(summary)
                if self.options.until_end and summary.finished:
                    total.finished = True
                    return total
                time.sleep(poll_seconds)
        finally:
            timeline.close()


class KafkaPublisher:
    """Publishes a window's result records to a topic in one Kafka transaction, and returns
    once it committed (RuntimeError with one line if it cannot)."""

    #: Attempts of one window's transaction the broker aborts before the aggregator gives up.
    ATTEMPTS = 5

    def __init__(self, bootstrap: str, topic: str, transactional_id: str) -> None:
        from confluent_kafka import Producer

        from pipeline.io import kafka_io

        self.bootstrap = bootstrap
        self.topic = topic
        config = kafka_io.transactional_producer_config(
            bootstrap, transactional_id, **{"linger.ms": 5}
        )
        self._producer = Producer(config)
        # Fences an aggregator before this one, and aborts a transaction it left open.
        self._producer.init_transactions(60)

    def published_windows(self) -> set[int]:
        """The windows whose records the topic holds, committed."""
        from pipeline.io import kafka_io

        return {
            int(record.key or b"-1") for record in kafka_io.read_topic(self.bootstrap, self.topic)
        }

    def __call__(self, records: list[tuple[bytes, bytes]]) -> None:
        from confluent_kafka import KafkaException

        from pipeline.io import kafka_io

        producer = self._producer
        for _attempt in range(self.ATTEMPTS):
            try:
                producer.begin_transaction()
                for key, value in records:
                    kafka_io.produce_blocking(producer, self.topic, value, key, 0)
                kafka_io.commit_transaction(producer)
                return
            except KafkaException as exception:
                error = exception.args[0]
                if error.fatal() or not error.txn_requires_abort():
                    raise RuntimeError(f"results not committed by Kafka: {error.str()}") from None
                producer.abort_transaction(60)
        raise RuntimeError(f"results not committed by Kafka: aborted {self.ATTEMPTS} times")

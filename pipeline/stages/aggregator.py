"""The aggregator: closes windows once every worker's watermark has passed them, merges.

Layer: stages.

A window is final when the pipeline's watermark (the minimum of the workers' ``wm:{worker}``)
has passed its end plus the lateness (:func:`operators.windows.closable_windows`). Then, per
window: close it and read the partials (one MULTI), merge and take the top-k (pure), finalize
(one guarded Lua script: result, top-k, partials freed, ``windows:final``), and publish its
record to ``results`` (``windows:published`` once Kafka acknowledged it); with
``keep_results_s``, check it against the truth and let its keys expire. A crash anywhere
leaves a state the next pass completes without doing anything twice
(docs/design.md#closing-a-window). Records of ``results``: :func:`result_records`.

Example (the records of one window):
    >>> [(key, json.loads(value)["counts"]) for key, value in result_records(
    ...     "r", 0, 10, {b"a": 2, b"b": 1}, [(b"a", 2)], keys_per_record=1)]
    [(b'0', {'a': 2}), (b'0', {'b': 1})]
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators.aggregates import StateField, merge_maps
from operators.windows import closable_windows, merge_partials, state_entries, top_k
from pipeline.io.extractors import format_amount
from pipeline.io.records import END_OF_STREAM
from pipeline.io.state_store import StateStore, key_text
from pipeline.observe.timeline import TimelineSampler

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
            records = result_records(
                self.options.run_id,
                window,
                self.options.window_ms,
                self.store.result(window),
                self.store.topk(window),
                fields=list(zip(declared_fields, self.store.result_fields(window), strict=True)),
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
    """Publishes result records to a topic and waits for Kafka's acknowledgement."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer

        from pipeline.io import kafka_io

        self.topic = topic
        self._producer = Producer(kafka_io.producer_config(bootstrap, **{"linger.ms": 5}))

    def __call__(self, records: list[tuple[bytes, bytes]]) -> None:
        failures: list[str] = []

        def on_delivery(error: object, _message: object) -> None:
            if error is not None:
                failures.append(str(error))

        for key, value in records:
            self._producer.produce(self.topic, key=key, value=value, on_delivery=on_delivery)
        if self._producer.flush(60) != 0 or failures:
            raise RuntimeError(
                f"results not acknowledged by Kafka: {failures[0] if failures else 'timeout'}"
            )

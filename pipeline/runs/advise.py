"""The sample ``skewer advise`` replays: a user's topic read as the live grouping stage reads it,
a workload dealt to sources as ``skewer produce`` deals it, or a file of keys.

Layer: runs. A topic's partition ``p`` is source ``p``; its first records in offset order
(``read_committed``) are decoded by the run's own :class:`~pipeline.io.extractors.Extractor`,
records it would dead-letter or find late (:func:`pipeline.stages.user_topic.late_rows`) are
counted and left out, and each record arrives at its event time. The model: docs/advise.md.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from operators.advice import Advice, Sample
from operators.keys import KeyBatch
from pipeline.io import kafka_io
from pipeline.io.dead_letters import REASONS
from pipeline.io.errors import KafkaIOError
from pipeline.stages.user_topic import DataWatermark, UserTopic, late_rows
from producers.kafka_producer import plan_stream
from producers.workloads import Workload

#: Records sampled unless told otherwise (or the whole topic, if it holds fewer).
DEFAULT_SAMPLE = 1_000_000
#: Records decoded per extractor call.
DECODE_CHUNK = 100_000
#: Seconds a topic read may go without a new record before it gives up.
STALL_SECONDS = 30.0

#: ``progress(records read, records wanted)``.
Progress = Callable[[int, int], None]


class SampleError(ValueError):
    """No sample can be taken; the message is one line for the user (exit 2)."""


@dataclass
class StreamSample:
    """A sample and how it was taken: what was read, and what the live stage would refuse."""

    sample: Sample
    #: Where it came from, e.g. ``topic clicks`` or a workload's canonical spec.
    origin: str
    read: int
    #: Records per second the stream comes at: a workload's given rate, a topic's as its
    #: records' times show (None if they span no time).
    rate: float | None
    dead_letters: dict[str, int] = field(default_factory=dict)
    late: int = 0

    @property
    def refused(self) -> int:
        return sum(self.dead_letters.values()) + self.late

    def summary(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "read": self.read,
            "used": len(self.sample.keys),
            "rate": self.rate,
            "dead_letters": dict(self.dead_letters),
            "late": self.late,
        }


def dealt_sample(keys: KeyBatch, n_sources: int, rate: float, origin: str) -> StreamSample:
    """``keys`` dealt as ``skewer produce`` deals a stream (:func:`plan_stream`: record ``i`` to
    source ``i mod S``), record ``i`` arriving at ``i / rate`` seconds: the producer stamps that
    time floored to a millisecond, which would make records arrive in bursts of ``rate / 1000``."""
    plan = plan_stream(len(keys), n_sources, rate, start_ms=0)
    arrival_ms = np.arange(len(keys), dtype=np.float64) * (1000.0 / rate)
    sample = Sample(keys, plan.producer.astype(np.int32), arrival_ms, n_sources)
    return StreamSample(sample, origin, read=len(keys), rate=rate)


def quotas(held: list[int], limit: int) -> list[int]:
    """Records to read from each partition: all of them up to ``limit`` in total, else shares
    in proportion to what each holds (so the partitions' prefixes cover about the same time).

    >>> quotas([10, 30], 100), quotas([10, 30], 20), quotas([1, 1, 1], 2)
    ([10, 30], [5, 15], [1, 1, 0])
    """
    total = sum(held)
    if total <= limit:
        return list(held)
    shares = [h * limit // total for h in held]
    short = limit - sum(shares)
    for p in range(len(held)):
        if short and shares[p] < held[p]:
            shares[p] += 1
            short -= 1
    return shares


def _read(
    bootstrap: str, topic: str, wanted: list[int], progress: Progress | None
) -> list[list[tuple[Any, Any, int]]]:
    """The first ``wanted[p]`` records (key, value, timestamp) of each partition ``p``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(kafka_io.consumer_config(bootstrap, f"skewer-advise-{uuid.uuid4().hex}"))
    records: list[list[tuple[Any, Any, int]]] = [[] for _ in wanted]
    try:
        marks = [
            kafka_io.watermark_offsets(consumer, TopicPartition(topic, p))
            for p in range(len(wanted))
        ]
        partitions = [TopicPartition(topic, p, low) for p, (low, _) in enumerate(marks)]
        consumer.assign(partitions)
        total = sum(wanted)
        read = 0
        last_record = time.monotonic()
        open_ = {p for p, n in enumerate(wanted) if n > 0}
        while open_:
            got = consumer.consume(num_messages=50_000, timeout=0.2)
            for message in got:
                p = message.partition()
                if message.error() is not None or p not in open_:
                    continue
                records[p].append((message.key(), message.value(), message.timestamp()[1]))
                read += 1
                if len(records[p]) >= wanted[p]:
                    open_.discard(p)
                    consumer.pause([TopicPartition(topic, p)])
            # A partition whose position reached its end holds no more (transaction markers
            # count in the offsets but are never returned).
            for tp in consumer.position([TopicPartition(topic, p) for p in sorted(open_)]):
                if tp.offset >= marks[tp.partition][1]:
                    open_.discard(tp.partition)
            if got:
                last_record = time.monotonic()
            elif time.monotonic() - last_record > STALL_SECONDS:
                raise KafkaIOError(f"kafka: reading {topic!r} stalled for {STALL_SECONDS:.0f} s")
            if progress is not None:
                progress(read, total)
    finally:
        consumer.close()
    return records


def topic_sample(
    bootstrap: str, spec: UserTopic, limit: int, progress: Progress | None = None
) -> StreamSample:
    """Up to ``limit`` records of ``spec.topic``, decoded as the grouping stage decodes them;
    :class:`SampleError` if there is no such topic, it is empty or nothing in it is usable."""
    topic = spec.topic
    held = kafka_io.topic_records(bootstrap, topic)
    if held is None:
        raise SampleError(f"--input-topic {topic}: no such topic")
    if not sum(held):
        raise SampleError(f"--input-topic {topic}: the topic holds no records")
    raw = _read(bootstrap, topic, quotas(held, limit), progress)
    dead = np.zeros(len(REASONS), dtype=np.int64)
    late = 0
    streams: list[tuple[KeyBatch, np.ndarray]] = []
    for records in raw:
        watermark = DataWatermark(spec.max_out_of_order_ms)
        keys: list[KeyBatch] = []
        times: list[np.ndarray] = []
        for first in range(0, len(records), DECODE_CHUNK):
            chunk = records[first : first + DECODE_CHUNK]
            stamps = np.fromiter((r[2] for r in chunk), dtype=np.int64, count=len(chunk))
            out = spec.extractor.extract([r[1] for r in chunk], [r[0] for r in chunk], stamps)
            valid = out.reasons < 0
            dead += np.bincount(out.reasons[~valid], minlength=len(REASONS))
            is_late = late_rows(out.event_time_ms, valid, watermark, spec.window_ms, 0)
            late += int(is_late.sum())
            kept = np.flatnonzero(valid & ~is_late)
            watermark.observe(out.event_time_ms[kept])
            keys.append(out.keys.take(kept))
            times.append(out.event_time_ms[kept])
        if not keys:  # an empty partition
            keys, times = [KeyBatch.from_bytes([])], [np.zeros(0, dtype=np.int64)]
        streams.append((KeyBatch.concat(keys), np.concatenate(times)))
    read = sum(len(r) for r in raw)
    dead_letters = {REASONS[r]: int(n) for r, n in enumerate(dead) if n}
    if not sum(len(k) for k, _ in streams):
        reasons = ", ".join(f"{name} {n:,}" for name, n in dead_letters.items())
        what = f"a dead letter ({reasons})" if dead_letters else "late"
        raise SampleError(
            f"--input-topic {topic}: every one of the {read:,} sampled records is {what}; "
            "check --key and --time"
        )
    sample = Sample.interleaved(streams)
    return StreamSample(sample, f"topic {topic}", read, sample.rate, dead_letters, late)


def workload_sample(
    workload: Workload, limit: int | None, n_sources: int, rate: float
) -> StreamSample:
    """A workload's stream (``n`` = ``limit`` if given), dealt as ``skewer produce`` deals it;
    :class:`producers.workloads.WorkloadError` if it cannot be made (a file without keys)."""
    if limit is not None and any(f.name == "n" for f in dataclasses.fields(workload)):
        workload = replace(workload, n=limit)  # type: ignore[type-var]
    keys = workload.keys()
    if limit is not None and len(keys) > limit:
        keys = keys.slice(0, limit)
    return dealt_sample(keys, n_sources, rate, workload.spec)


#: The picture's size in inches (at the report's dots per inch).
PICTURE_INCHES = (12.0, 7.0)


def draw(advice: Advice, path: Path) -> Path:
    """A PNG at ``path``: per ranked scheme its load per worker (relative to the average) and
    its predicted p99 latency; :class:`~pipeline.runs.report.ReportError` if it cannot be
    written."""
    from matplotlib.figure import Figure

    from pipeline.runs.report import save_figure

    ranked = advice.ranking
    figure = Figure(figsize=PICTURE_INCHES, layout="constrained")
    figure.suptitle(
        f"skewer advise: W = {advice.n_workers}, C = {advice.cpu_cost_us:g} µs, "
        f"R = {advice.rate:,.0f} records/s, {advice.records:,} records; ranked for {advice.goal}"
    )
    loads_axes, latency_axes = figure.subplots(1, 2, sharey=True, width_ratios=(3, 2))
    rows = np.arange(len(ranked))
    for row, c in zip(rows, ranked, strict=True):
        relative = c.final_loads / c.final_loads.mean()
        loads_axes.scatter(relative, np.full(relative.shape[0], row), s=14, color="#1f77b4")
        loads_axes.plot([relative.max()], [row], marker="|", markersize=14, color="#d62728")
    loads_axes.axvline(1.0, color="black", linewidth=0.8, linestyle=":")
    loads_axes.set_yticks(rows, [c.label for c in ranked])
    loads_axes.invert_yaxis()
    loads_axes.set_xlabel("load per worker / average (red: the busiest)")
    p99 = [c.p99_ms for c in ranked]
    latency_axes.barh(rows, p99, color="#7f7f7f")
    for row, value in zip(rows, p99, strict=True):
        latency_axes.annotate(f" {value:.3g}", (value, row), va="center", fontsize=8)
    latency_axes.set_xlabel("predicted p99 latency, ms")
    if min(p99) > 0:  # at C = 0 every latency is 0: a log axis would show nothing
        latency_axes.set_xscale("log")
    return save_figure(figure, path)

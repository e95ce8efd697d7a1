"""The live pipeline's producers: a workload's key stream into topic ``keys``, plus the truth.

Layer: stages (the producer process).

The stream of a workload (:mod:`producers.workloads`) is dealt to ``S`` producers as the
simulator deals it to sources: record ``i`` goes to producer ``p = i mod S`` as its record
``seq = i div S``, in partition ``p`` of ``keys`` (producer p IS source p). Record ``i``
carries ``event_time_ms = start + floor(i * 1000 / E)`` (``--event-rate`` E; with ``--rate``
real time is paced instead). Each producer sends a WATERMARK record before its first record of
each new window and one at END_OF_STREAM. Before sending, the count of every (key, window) is
added to the run's ``truth:{window}`` hash, and after every record is acknowledged
``producer:{p}:sent`` grows, each addition made once (:func:`~pipeline.io.state_store.add_once`).
See docs/design.md#records-and-topics and docs/design.md#exactness-invariants.

Example (the plan of a stream; nothing is sent):
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> plan = plan_stream(5, sources=2, event_rate=1000, start_ms=0)
    >>> plan.producer.tolist(), plan.seq.tolist(), plan.event_time_ms.tolist()
    ([0, 1, 0, 1, 0], [0, 0, 1, 1, 2], [0, 1, 2, 3, 4])
    >>> truth = ground_truth(KeyBatch.from_strings(["a", "b", "a", "a", "b"]),
    ...                      np.array([0, 0, 5, 10, 12]), window_ms=10)
    >>> {window: dict(counts) for window, counts in truth.items()}
    {0: {b'a': 2, b'b': 1}, 10: {b'a': 1, b'b': 1}}
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.keys import KeyBatch
from operators.schemes.hashing import FIRST_SEED
from pipeline.io import kafka_io
from pipeline.io.records import END_OF_STREAM, Kind, encode_input, window_start
from pipeline.io.redis_layout import RunKeys
from pipeline.io.state_store import add_once

if TYPE_CHECKING:
    import redis

#: Default ``E``: records per second of event time (200k records = five 10 s windows).
DEFAULT_EVENT_RATE = 4_000.0
DEFAULT_WINDOW_MS = 10_000
#: Fields per HINCRBY pipeline command when writing the truth.
TRUTH_CHUNK = 10_000
#: Records planned, counted and encoded at a time: a producer's memory is its keys plus this
#: many records' plan, however long the stream (an hour's plan at once would hold gigabytes).
PLAN_BLOCK = 65_536


@dataclass(frozen=True)
class StreamPlan:
    """Producer, sequence number and event time of every record, in send order."""

    producer: np.ndarray
    seq: np.ndarray
    event_time_ms: np.ndarray
    sources: int


def plan_stream(
    records: int, sources: int, event_rate: float, start_ms: int, first: int = 0
) -> StreamPlan:
    """Record ``i``: producer ``i mod S``, seq ``i div S``, time ``start + floor(i*1000/E)``;
    the plan of records ``first`` .. ``records - 1`` of the stream."""
    if sources < 1:
        raise ValueError(f"sources must be >= 1, got {sources}")
    if not event_rate > 0:
        raise ValueError(f"event rate must be > 0, got {event_rate}")
    index = np.arange(first, records, dtype=np.int64)
    offsets = np.floor(index * (1000.0 / float(event_rate))).astype(np.int64)
    return StreamPlan(
        producer=(index % sources).astype(np.int64),
        seq=index // sources,
        event_time_ms=np.int64(start_ms) + offsets,
        sources=int(sources),
    )


def ground_truth(
    keys: KeyBatch, event_time_ms: np.ndarray, window_ms: int
) -> dict[int, list[tuple[bytes, int]]]:
    """``{window_start: [(key, count), ...]}`` of a stream: what every final count must equal.

    One ``np.unique`` of key fingerprints per window. Raises ``ValueError`` if two distinct
    keys share a 64-bit fingerprint (checked with a second, independent 64-bit hash).
    """
    key_ids = keys.key_ids()
    check = keys.hash64(FIRST_SEED)
    windows = window_start(event_time_ms, window_ms)
    out: dict[int, list[tuple[bytes, int]]] = {}
    for window in np.unique(windows).tolist():
        members = np.flatnonzero(windows == window)
        _, first, inverse, counts = np.unique(
            key_ids[members], return_index=True, return_inverse=True, return_counts=True
        )
        representative = members[first]
        if np.any(check[members] != check[representative][inverse]):
            raise ValueError("two distinct keys share a 64-bit fingerprint; truth would merge them")
        out[int(window)] = list(
            zip([keys[int(i)] for i in representative], counts.tolist(), strict=True)
        )
    return out


def stream_truth(
    keys: KeyBatch,
    *,
    sources: int,
    event_rate: float,
    start_ms: int,
    window_ms: int,
    block: int = PLAN_BLOCK,
) -> Iterator[tuple[int, list[tuple[bytes, int]]]]:
    """:func:`ground_truth` of the stream :func:`plan_stream` deals, window by window in
    window order, each as soon as its last record is counted: ``block`` records at a time, so
    only the windows still open are held (event time never goes back, so a window before the
    block's last record's is closed)."""
    n = len(keys)
    open_windows: dict[int, dict[bytes, int]] = {}
    for first in range(0, n, block):
        last = min(n, first + block)
        plan = plan_stream(last, sources, event_rate, start_ms, first)
        for window, counts in ground_truth(
            keys.slice(first, last), plan.event_time_ms, window_ms
        ).items():
            totals = open_windows.setdefault(window, {})
            for key, count in counts:
                totals[key] = totals.get(key, 0) + count
        newest = int(window_start(plan.event_time_ms[-1:], window_ms)[0])
        for window in sorted(w for w in open_windows if w < newest):
            yield window, list(open_windows.pop(window).items())
    for window in sorted(open_windows):
        yield window, list(open_windows.pop(window).items())


def write_truth(
    client: redis.Redis,
    names: kafka_io.RunNames,
    truth: Iterable[tuple[int, list[tuple[bytes, int]]]],
    *,
    write_id: str,
    replicas: int = 0,
) -> list[int]:
    """HINCRBY every (key, window) count of ``truth`` (``(window, [(key, count), ...])``
    pairs, as :func:`stream_truth` yields them) into ``truth:{window}``, in chunks of
    :data:`TRUTH_CHUNK`, each added once (:func:`~pipeline.io.state_store.add_once`, marker
    ``added:{write_id}:truth:{chunk}``) and replicated to ``replicas``; the windows written."""
    run_keys = RunKeys(names.run_id)
    windows: list[int] = []

    def increments() -> Iterator[tuple[str, bytes, int]]:
        for window, counts in truth:
            windows.append(window)
            hash_key = run_keys.truth(window)
            for key, count in counts:
                yield hash_key, key, count

    stream = increments()
    chunk = 0
    while batch := list(itertools.islice(stream, TRUTH_CHUNK)):
        add_once(client, run_keys.added_truth(write_id, chunk), batch, replicas)
        chunk += 1
    return windows


#: Seconds a gated producer waits for its run's go before it gives up (the orchestrator gives
#: Spark 180 s to start).
GATE_SECONDS = 240.0


def wait_for_go(
    client: redis.Redis, names: kafka_io.RunNames, timeout: float = GATE_SECONDS
) -> None:
    """Until the run's ``producers:go`` key is set (``skewer produce --gated``); RuntimeError
    after ``timeout`` seconds. Polled every 10 ms: the first record leaves within 10 ms."""
    key = RunKeys(names.run_id).producers_go()
    deadline = time.monotonic() + timeout
    while not client.exists(key):
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {names.run_id!r} gave no go within {timeout:.0f} s")
        time.sleep(0.01)


def open_gate(client: redis.Redis, run_id: str) -> None:
    """Let the run's gated producers send."""
    client.set(RunKeys(run_id).producers_go(), 1)


def _split_keys(keys: KeyBatch) -> list[bytes]:
    """The keys as bytes objects, sliced from one ``bytes`` copy of the buffer (fast)."""
    raw = keys.data.tobytes()
    bounds = keys.offsets.tolist()
    return [raw[a:b] for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class SendBlock:
    """Records ``first`` .. ``last - 1`` of a stream, ready to send: per record (index ``i -
    first``) its key and value, producer, seq, window start, and whether it opens a window of
    its producer (a WATERMARK goes first)."""

    first: int
    last: int
    keys: list[bytes]
    values: list[bytes]
    producers: list[int]
    seqs: list[int]
    window_starts: list[int]
    opens_window: list[bool]


def send_blocks(
    keys: KeyBatch,
    sources: int,
    event_rate: float,
    start_ms: int,
    window_ms: int,
    block: int = PLAN_BLOCK,
) -> Iterator[SendBlock]:
    """The stream :func:`plan_stream` deals, ``block`` records at a time: Python objects for
    one block only, however long the stream."""
    n = len(keys)
    for first in range(0, n, block):
        last = min(n, first + block)
        # From record first - S on: a record opens a window when its producer's previous
        # record (i - S) was in another, and that one may be in the block before.
        before = min(first, sources)
        plan = plan_stream(last, sources, event_rate, start_ms, first - before)
        windows = window_start(plan.event_time_ms, window_ms)
        opens = np.zeros(last - first + before, dtype=bool)
        opens[sources:] = windows[sources:] != windows[:-sources]
        yield SendBlock(
            first=first,
            last=last,
            keys=_split_keys(keys.slice(first, last)),
            values=encode_input(
                plan.event_time_ms[before:], plan.producer[before:], plan.seq[before:]
            ),
            producers=plan.producer[before:].tolist(),
            seqs=plan.seq[before:].tolist(),
            window_starts=windows[before:].tolist(),
            opens_window=opens[before:].tolist(),
        )


@dataclass
class ProduceResult:
    """What one :func:`produce_stream` call sent."""

    records: int
    windows: list[int]
    seconds: float
    sent_per_producer: list[int]
    watermarks: int

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "windows": len(self.windows),
            "first_window": self.windows[0] if self.windows else None,
            "seconds": round(self.seconds, 3),
            "rate": round(self.rate, 1),
            "sent_per_producer": self.sent_per_producer,
            "watermarks": self.watermarks,
        }


def produce_stream(
    keys: KeyBatch,
    *,
    bootstrap: str,
    redis_client: redis.Redis,
    names: kafka_io.RunNames,
    sources: int,
    window_ms: int = DEFAULT_WINDOW_MS,
    event_rate: float = DEFAULT_EVENT_RATE,
    rate: float | None = None,
    start_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
    on_acked: Callable[[int], None] | None = None,
    redis_replicas: int = 0,
    wait_to_start: Callable[[], None] | None = None,
    linger_ms: int = kafka_io.LINGER_MS,
) -> ProduceResult:
    """Send ``keys`` to ``keys``-topic partitions 0..S-1 and record the truth; see the module.

    Returns when every record is acknowledged; raises ``RuntimeError`` naming the first
    delivery failure if any record was not. ``on_acked(k)`` after each chunk (and at the end):
    at least the first ``k`` DATA records are acknowledged -- the records sent minus those
    still in the producer's queue (``len(producer)``, watermarks included, so a lower bound;
    exactly ``n`` once all are acknowledged). Per chunk, not per record: delivery reports
    come for failures only. ``redis_replicas``: how many Redis replicas must hold the truth
    and the counts sent before they count as written (:func:`pipeline.io.redis_client.
    replicas_to_wait`), so a failover of the primary loses neither. ``wait_to_start()`` is
    called once the stream is planned, its truth written and the producer connected, before
    the first record is sent (a gated producer waits there for its run to be ready; paced
    event times then start when it started, ahead of the first send by the wait).
    ``linger_ms``: Kafka's ``linger.ms`` of the producers.
    """
    from confluent_kafka import Producer

    n = len(keys)
    paced = rate is not None
    if paced:
        event_rate = float(rate)  # type: ignore[arg-type]
        start_ms = int(time.time() * 1000) if start_ms is None else start_ms
    elif start_ms is None:
        start_ms = int(time.time() * 1000) // window_ms * window_ms
    write_id = uuid.uuid4().hex
    windows = write_truth(
        redis_client,
        names,
        stream_truth(
            keys, sources=sources, event_rate=event_rate, start_ms=start_ms, window_ms=window_ms
        ),
        write_id=write_id,
        replicas=redis_replicas,
    )
    failures: list[str] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    # Reports of failures only: a Python callback per acknowledged record would cost more than
    # the produce call itself.
    producer = Producer(
        kafka_io.producer_config(
            bootstrap,
            on_delivery=on_delivery,
            **{"delivery.report.only.error": True, "linger.ms": linger_ms},
        )
    )
    topic = names.keys_topic
    watermarks = 0

    def send(key: bytes, value: bytes, partition: int) -> None:
        kafka_io.produce_blocking(producer, topic, value, key, partition)

    def watermark(p: int, time_ms: int, seq: int) -> None:
        nonlocal watermarks
        marker = encode_input(np.array([time_ms]), np.array([p]), np.array([seq]), Kind.WATERMARK)
        send(b"", marker[0], p)
        watermarks += 1

    if wait_to_start is not None:
        producer.list_topics(topic, timeout=30)  # connected, metadata known: no first-send wait
        wait_to_start()
    # Paced: record i is due i / R seconds after the first, sent in 10 ms chunks. From the
    # first send, not from start_ms: the time the truth took, or a gate's wait, would otherwise
    # be a backlog sent at once.
    began = time.perf_counter()
    chunk = max(1, int(rate // 100)) if paced else PLAN_BLOCK  # type: ignore[operator]
    for block in send_blocks(keys, sources, event_rate, start_ms, window_ms):
        for first in range(block.first, block.last, chunk):
            last = min(block.last, first + chunk)
            if paced:
                wait = began + first / event_rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            for i in range(first - block.first, last - block.first):
                p = block.producers[i]
                if block.opens_window[i]:
                    watermark(p, block.window_starts[i] - 1, block.seqs[i])
                try:
                    producer.produce(topic, key=block.keys[i], value=block.values[i], partition=p)
                except BufferError:
                    send(block.keys[i], block.values[i], p)
            producer.poll(0)
            if progress is not None:
                progress(last)
            if on_acked is not None:
                on_acked(max(0, last - len(producer)))
    sent = [len(range(p, n, sources)) for p in range(sources)]
    for p in range(sources):
        watermark(p, int(END_OF_STREAM), sent[p])
    remaining = producer.flush(60)
    seconds = time.perf_counter() - began
    if remaining:
        failures.append(f"{remaining} record(s) not acknowledged within 60 s")
    if failures:
        raise RuntimeError(f"kafka delivery failed: {failures[0]} ({len(failures)} failure(s))")
    if on_acked is not None:
        on_acked(n)
    run_keys = RunKeys(names.run_id)
    add_once(
        redis_client,
        run_keys.added_sent(write_id),
        [(run_keys.producer_sent(p), "", count) for p, count in enumerate(sent)],
        redis_replicas,
    )
    return ProduceResult(
        records=n,
        windows=windows,
        seconds=seconds,
        sent_per_producer=sent,
        watermarks=watermarks,
    )

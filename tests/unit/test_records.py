"""The live pipeline's wire formats and how bad input is recognised; the producer's plan.

Covers pipeline/io/records.py (round trips, every way a value can fail to decode), the grouping
stage's pure parts (validation reasons, dead-letter JSON, source watermarks) and the
producer's pure parts (the plan of a stream and its ground truth), each against numbers
worked out by hand or by a plain-Python reference.
"""

from __future__ import annotations

import base64
import json
import struct
import tracemalloc
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.keys import KeyBatch
from pipeline.io.dead_letters import REASONS, dead_letter_value
from pipeline.io.records import (
    END_OF_STREAM,
    INPUT_DTYPE,
    MAX_KEY_BYTES,
    WORK_DTYPE,
    Kind,
    decode_input,
    decode_work,
    encode_input,
    encode_marker,
    encode_work,
    window_start,
    work_headers,
    work_payloads,
)
from pipeline.stages.input_formats import NO_WATERMARK, SourceWatermark, validate, work_values
from producers.kafka_producer import ground_truth, plan_stream, send_blocks, stream_truth
from producers.workloads import parse

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)


def input_value(kind: int, time_ms: int, producer: int, seq: int, magic: bytes = b"SK") -> bytes:
    """A ``keys`` value packed by hand with struct: the layout the docstring promises."""
    return magic + struct.pack("<BBqIQ", 1, kind, time_ms, producer, seq)


# --- records.py ------------------------------------------------------------------------------


def test_layout_matches_a_hand_packed_value() -> None:
    value = encode_input(np.array([1_000]), np.array([2]), np.array([7]))[0]
    assert value == input_value(Kind.DATA, 1_000, 2, 7)
    assert INPUT_DTYPE.itemsize == 24 and WORK_DTYPE.itemsize == 36


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(INT64, UINT32, UINT64), min_size=1, max_size=40))
def test_input_round_trip(rows: list[tuple[int, int, int]]) -> None:
    times = np.array([r[0] for r in rows], dtype=np.int64)
    producers = np.array([r[1] for r in rows], dtype=np.uint32)
    seqs = np.array([r[2] for r in rows], dtype=np.uint64)
    values = encode_input(times, producers, seqs)
    assert values == [input_value(0, t, p, s) for t, p, s in rows]
    decoded, ok = decode_input(values)
    assert ok.all()
    assert decoded["event_time_ms"].tolist() == times.tolist()
    assert decoded["producer"].tolist() == producers.tolist()
    assert decoded["seq"].tolist() == seqs.tolist()
    assert (decoded["kind"] == Kind.DATA).all()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(INT64, UINT32, UINT64), min_size=1, max_size=20), UINT32, UINT64)
def test_work_round_trip_keeps_the_input_fields(
    rows: list[tuple[int, int, int]], source: int, version: int
) -> None:
    values = encode_input(
        np.array([r[0] for r in rows]),
        np.array([r[1] for r in rows], dtype=np.uint32),
        np.array([r[2] for r in rows], dtype=np.uint64),
    )
    inputs, _ = decode_input(values)
    work = encode_work(inputs, source, version)
    assert [w[:24] for w in work] == values
    assert all(w[24:] == struct.pack("<IQ", source, version) for w in work)
    decoded, ok = decode_work(work)
    assert ok.all() and decoded["source"].tolist() == [source] * len(rows)
    assert decoded["table_version"].tolist() == [version] * len(rows)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(INT64, UINT32, UINT64), min_size=0, max_size=20), UINT32, UINT64)
def test_work_values_equal_encode_work(
    rows: list[tuple[int, int, int]], source: int, version: int
) -> None:
    values = encode_input(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.uint32),
        np.array([r[2] for r in rows], dtype=np.uint64),
    )
    inputs, _ = decode_input(values)
    assert work_values(values, source, version) == encode_work(inputs, source, version)


def test_markers() -> None:
    marker = encode_marker(Kind.WATERMARK, source=3, time_ms=int(END_OF_STREAM))
    assert marker == b"SK" + struct.pack("<BBqIQIQ", 1, 1, 2**63 - 1, 0, 0, 3, 0)
    switch = encode_marker(Kind.TABLE_SWITCH, source=1, table_version=9)
    decoded, ok = decode_work([marker, switch])
    assert ok.tolist() == [True, True]
    assert decoded["kind"].tolist() == [Kind.WATERMARK, Kind.TABLE_SWITCH]
    assert decoded["table_version"].tolist() == [0, 9]
    with pytest.raises(ValueError):
        encode_marker(Kind.DATA, source=0)


def test_bad_values_do_not_decode() -> None:
    good = input_value(Kind.DATA, 5, 1, 2)
    values = [
        good,
        None,
        b"",
        good[:-1],  # 23 bytes
        good + b"x",  # 25 bytes
        input_value(Kind.DATA, 5, 1, 2, magic=b"XK"),
        b"SK" + struct.pack("<BBqIQ", 2, 0, 5, 1, 2),  # version 2
        input_value(3, 5, 1, 2),  # unknown kind
        input_value(255, 5, 1, 2),
        input_value(Kind.TABLE_SWITCH, 5, 1, 2),  # not a keys-topic kind
        input_value(Kind.WATERMARK, int(END_OF_STREAM), 1, 2),
    ]
    decoded, ok = decode_input(values)
    assert ok.tolist() == [True] + [False] * 9 + [True]
    assert decoded["seq"][0] == 2 and decoded["event_time_ms"][-1] == END_OF_STREAM
    # the bad rows come back zeroed, never garbage from a neighbour
    assert decoded["seq"][1:5].tolist() == [0, 0, 0, 0]
    # work values accept TABLE_SWITCH; a 24-byte keys value is not a work value
    _, ok_work = decode_work([encode_marker(Kind.TABLE_SWITCH, 0), good])
    assert ok_work.tolist() == [True, False]


def test_window_start() -> None:
    times = np.array([0, 9_999, 10_000, 25_001, -1, -10_000, -10_001])
    assert window_start(times, 10_000).tolist() == [
        0,
        0,
        10_000,
        20_000,
        -10_000,
        -10_000,
        -20_000,
    ]


# --- grouping stage: validation, dead letters, watermarks -------------------------------------


def test_validation_reasons_and_precedence() -> None:
    data = input_value(Kind.DATA, 10, 0, 0)
    watermark = input_value(Kind.WATERMARK, 9, 0, 1)
    huge = b"k" * (MAX_KEY_BYTES + 1)
    edge = b"k" * MAX_KEY_BYTES  # exactly the limit: valid
    keys = [b"a", None, b"", huge, edge, b"b", b"c", None, None, huge, b"d"]
    values = [data, data, data, data, data, b"junk", None, watermark, b"", b"xx", data]
    checked = validate(keys, values)
    names = [REASONS[r] if r >= 0 else "ok" for r in checked.reasons.tolist()]
    assert names == [
        "ok",
        "no-key",
        "no-key",
        "key-too-large",
        "ok",
        "undecodable-value",
        "undecodable-value",
        "ok",  # a watermark needs no key
        "undecodable-value",  # the value is checked first
        "undecodable-value",
        "ok",
    ]
    assert checked.data.tolist() == [0, 4, 10]
    assert checked.watermarks.tolist() == [7]
    assert checked.bad.tolist() == [1, 2, 3, 5, 6, 8, 9]
    assert checked.key_lengths.tolist()[:5] == [1, -1, 0, MAX_KEY_BYTES + 1, MAX_KEY_BYTES]


def test_wrong_kind_is_its_own_reason() -> None:
    values = [input_value(Kind.TABLE_SWITCH, 0, 0, 0), input_value(7, 0, 0, 0)]
    checked = validate([b"k", None], values)
    assert [REASONS[r] for r in checked.reasons.tolist()] == ["wrong-kind", "wrong-kind"]
    assert checked.data.tolist() == [] and checked.watermarks.tolist() == []


def test_validation_of_an_empty_batch() -> None:
    checked = validate([], [])
    assert checked.data.shape == (0,) and checked.reasons.shape == (0,)


def test_dead_letter_value_keeps_the_original_and_says_why() -> None:
    letter = json.loads(dead_letter_value(2, 3, b"\x00junk", "t-keys", 1, 42))
    assert letter == {
        "reason": "undecodable-value",
        "detail": "value of 5 bytes is not a 24-byte skewer v1 record",
        "topic": "t-keys",
        "partition": 1,
        "offset": 42,
        "key_bytes": 3,
        "value_b64": base64.b64encode(b"\x00junk").decode(),
    }
    missing = json.loads(dead_letter_value(0, -1, None, "k", 0, 0))
    assert missing["reason"] == "no-key" and missing["value_b64"] is None
    assert missing["key_bytes"] == 0


def test_source_watermark_is_the_minimum_over_producers() -> None:
    mark = SourceWatermark()
    mark.observe(np.array([0, 1, 0]), np.array([0]), np.array([9_999]))
    assert mark.producers == {0: 9_999, 1: NO_WATERMARK}
    assert mark.advance() is None  # producer 1 has promised nothing yet
    mark.observe(np.array([], dtype=np.int64), np.array([1, 1]), np.array([4_999, 19_999]))
    assert mark.advance() == 9_999 and mark.advance() is None
    mark.observe(np.array([2]), np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    assert mark.current() == NO_WATERMARK  # a new producer holds the watermark back
    mark.observe(np.array([]), np.array([0, 1, 2]), np.array([END_OF_STREAM] * 3))
    assert mark.advance() == END_OF_STREAM and mark.ended
    # a watermark never goes back
    mark.observe(np.array([]), np.array([0]), np.array([5]))
    assert mark.producers[0] == END_OF_STREAM


def test_source_watermark_survives_the_offset_metadata() -> None:
    mark = SourceWatermark({0: 19_999, 3: NO_WATERMARK}, forwarded=9_999)
    again = SourceWatermark.from_metadata(mark.to_metadata())
    assert again == mark
    assert SourceWatermark.from_metadata(None) == SourceWatermark()
    assert SourceWatermark.from_metadata("") == SourceWatermark()
    assert len(mark.to_metadata()) < 100  # far below the broker's 4096-byte limit


# --- producer: the plan and the truth --------------------------------------------------------


def test_plan_stream_by_hand() -> None:
    plan = plan_stream(7, sources=3, event_rate=4_000, start_ms=1_000)
    assert plan.producer.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert plan.seq.tolist() == [0, 0, 0, 1, 1, 1, 2]
    # 4 records per millisecond: floor(i / 4)
    assert plan.event_time_ms.tolist() == [1_000, 1_000, 1_000, 1_000, 1_001, 1_001, 1_001]
    with pytest.raises(ValueError):
        plan_stream(3, sources=0, event_rate=1, start_ms=0)


def test_default_event_rate_gives_five_windows_for_200k_records() -> None:
    plan = plan_stream(200_000, sources=4, event_rate=4_000, start_ms=0)
    windows = np.unique(window_start(plan.event_time_ms, 10_000))
    assert windows.tolist() == [0, 10_000, 20_000, 30_000, 40_000]
    # event time never decreases within a producer
    for p in range(4):
        assert np.all(np.diff(plan.event_time_ms[plan.producer == p]) >= 0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.binary(min_size=0, max_size=6), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=50),
)
def test_ground_truth_equals_a_counter(keys: list[bytes], window_ms: int) -> None:
    times = np.arange(len(keys), dtype=np.int64) * 3
    truth = ground_truth(KeyBatch.from_bytes(keys), times, window_ms)
    reference: dict[int, Counter[bytes]] = {}
    for key, time_ms in zip(keys, times.tolist(), strict=True):
        reference.setdefault(time_ms // window_ms * window_ms, Counter())[key] += 1
    assert {w: dict(c) for w, c in truth.items()} == {w: dict(c) for w, c in reference.items()}
    assert all(len(dict(c)) == len(c) for c in truth.values())  # no key listed twice


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from([b"a", b"b", b"cc", b""]), min_size=1, max_size=120),
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=17),
    st.integers(min_value=1, max_value=40),
)
def test_blocks_deal_the_stream_as_one_plan_does(
    keys: list[bytes], sources: int, block: int, window_ms: int
) -> None:
    """Truth and records planned ``block`` at a time equal the plan of the whole stream: every
    window's counts once, in window order; a WATERMARK before each producer's first record of
    a window, also when its previous record lies in the block before."""
    batch = KeyBatch.from_bytes(keys)
    plan = plan_stream(len(keys), sources, event_rate=2_000, start_ms=5)
    truth = ground_truth(batch, plan.event_time_ms, window_ms)
    streamed = list(
        stream_truth(
            batch, sources=sources, event_rate=2_000, start_ms=5, window_ms=window_ms, block=block
        )
    )
    assert [w for w, _ in streamed] == sorted(truth)
    assert {w: dict(c) for w, c in streamed} == {w: dict(c) for w, c in truth.items()}

    blocks = list(send_blocks(batch, sources, 2_000, 5, window_ms, block))
    assert [(b.first, b.last) for b in blocks] == [
        (f, min(len(keys), f + block)) for f in range(0, len(keys), block)
    ]
    windows = window_start(plan.event_time_ms, window_ms).tolist()
    seen: set[tuple[int, int]] = set()
    opens = []
    for p, w in zip(plan.producer.tolist(), windows, strict=True):
        opens.append((p, w) not in seen and any(q == p for q, _ in seen))
        seen.add((p, w))
    assert [k for b in blocks for k in b.keys] == keys
    assert [o for b in blocks for o in b.opens_window] == opens
    assert [w for b in blocks for w in b.window_starts] == windows
    assert [v for b in blocks for v in b.values] == encode_input(
        plan.event_time_ms, plan.producer, plan.seq
    )


def test_a_long_stream_is_planned_in_bounded_memory() -> None:
    """A producer's memory is its keys plus one block's plan, however long the stream: one
    Python object per record for the whole of an hour-long stream held gigabytes."""
    keys = parse("zipf:z=1.2,keys=100000,n=1000000,seed=0").keys()
    tracemalloc.start()
    try:
        windows = [
            w
            for w, _ in stream_truth(
                keys, sources=2, event_rate=8_000, start_ms=0, window_ms=10_000
            )
        ]
        sent = sum(len(b.keys) for b in send_blocks(keys, 2, 8_000, 0, 10_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sent == 1_000_000 and len(windows) == 13
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB at the peak"


def test_work_payloads_of_sliced_and_chunked_columns() -> None:
    """A Spark task's column is often a slice of a bigger buffer, or in chunks."""
    header = work_headers(np.array([1]), 0, np.array([0]), 0, 0)[0]
    user = [b"a", b"", b"xyz" * 100, None, b"\xff"]
    values = [None if u is None else header + u for u in user]
    values.append(header[:10])  # shorter than a header: no payload
    expected = [*user, b""]
    padded = pa.array([b"pad" * 50, *values], pa.binary()).slice(1)
    chunked = pa.chunked_array([pa.array(values[:2], pa.binary()), pa.array(values[2:])])
    for column in (values, padded, chunked, pa.array(values, pa.large_binary())):
        assert work_payloads(column).to_pylist() == expected

"""Wire formats of the live pipeline's topics: one fixed-size little-endian header per record.

Layer: io.

Topic ``keys`` (producers -> grouping stage): Kafka key = the record's key, value =
:data:`INPUT_DTYPE` (24 bytes; ``kind`` DATA, or WATERMARK for a producer's own watermark)::

    magic "SK" | version u8 = 1 | kind u8 | event_time_ms i64 | producer u32 | seq u64

Topic ``work`` (grouping stage -> workers; partition w is worker w): value =
:data:`WORK_DTYPE` (36 bytes), the input fields plus the routing source and routing-table
version; ``kind`` is DATA, WATERMARK or TABLE_SWITCH (markers have an empty key). A record of a
user's own topic is the same header followed by the user's value, byte for byte. Fixed sizes
let every stage decode a whole batch with ``np.frombuffer``. Design:
docs/design.md#records-and-topics.

Example:
    >>> import numpy as np
    >>> value = encode_input(event_time_ms=np.array([1000]), producer=np.array([2]),
    ...                      seq=np.array([7]))[0]
    >>> decoded, ok = decode_input([value, b"junk"])
    >>> len(value), ok.tolist(), int(decoded["seq"][0]), int(decoded["event_time_ms"][0])
    (24, [True, False], 7, 1000)
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

import numpy as np
import pyarrow as pa

from operators.keys import KeyBatch

MAGIC = b"SK"
VERSION = 1
#: Watermark value meaning "this source has nothing more": closes every window.
END_OF_STREAM = np.iinfo(np.int64).max
#: Keys longer than this are bad input (Kafka's default message size is 1 MiB anyway).
MAX_KEY_BYTES = 1 << 20


class Kind(IntEnum):
    DATA = 0
    WATERMARK = 1
    TABLE_SWITCH = 2


INPUT_DTYPE = np.dtype(
    [
        ("magic", "S2"),
        ("version", "u1"),
        ("kind", "u1"),
        ("event_time_ms", "<i8"),
        ("producer", "<u4"),
        ("seq", "<u8"),
    ]
)
# u8 seq after a u4 producer is packed without padding by np.dtype's default (align=False).
assert INPUT_DTYPE.itemsize == 24

#: A ``work`` value is the input header, then who routed it and by which routing table.
WORK_DTYPE = np.dtype([*INPUT_DTYPE.descr, ("source", "<u4"), ("table_version", "<u8")])
assert WORK_DTYPE.itemsize == 36


def binary_column(
    values: pa.Array | pa.ChunkedArray | Sequence[bytes | None],
) -> tuple[KeyBatch, np.ndarray]:
    """A binary column as (its bytes and offsets, mask of non-null rows), without copying.

    ``values`` is an Arrow binary array (a Spark task's column, :mod:`pipeline.stages.
    worker_job`) or a sequence of ``bytes``/``None`` (a consumed batch), which Arrow's C++
    converter packs in one pass. A null row's slice is whatever Arrow stored there (usually
    empty): callers read the mask first.

    Example:
        >>> column, valid = binary_column([b"ab", None, b"c"])
        >>> column.to_list(), valid.tolist()
        ([b'ab', b'', b'c'], [True, False, True])
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    array = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
        raise TypeError(f"need a binary column, got {array.type}")
    _, offsets_buffer, data_buffer = array.buffers()
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    window = slice(array.offset, array.offset + len(array) + 1)  # a sliced array's own rows
    offsets = np.frombuffer(offsets_buffer, dtype=width)[window].astype(np.int64)
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
        if data_buffer is not None and offsets[-1] > offsets[0]
        else np.zeros(0, dtype=np.uint8)
    )
    valid = (
        np.ones(len(array), dtype=bool)
        if array.null_count == 0
        else array.is_valid().to_numpy(zero_copy_only=False)
    )
    return KeyBatch(data, offsets - offsets[0]), valid


def _decode(
    values: pa.Array | Sequence[bytes | None], dtype: np.dtype, *, payload: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Structured array of ``values`` (bad rows zeroed) and a mask of the rows that decoded.

    With ``payload`` a value may go on after its header (a user's value wrapped in ``work``).
    """
    column, valid = binary_column(values)
    size = dtype.itemsize
    starts = column.offsets[:-1]
    lengths = np.diff(column.offsets)
    ok = valid & ((lengths >= size) if payload else (lengths == size))
    if ok.all() and (not payload or bool((lengths == size).all())):
        # the usual batch: the bytes are the records, back to back
        out = column.data.view(dtype) if len(column) else np.zeros(0, dtype=dtype)
    else:
        out = np.zeros(len(column), dtype=dtype)
        rows = column.data[starts[ok][:, None] + np.arange(size)]
        out[ok] = rows.reshape(-1).view(dtype)
    ok &= (out["magic"] == MAGIC) & (out["version"] == VERSION)
    ok &= out["kind"] <= max(Kind)
    return out, ok


def decode_input(values: pa.Array | Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Decode ``keys``-topic values: (records of :data:`INPUT_DTYPE`, mask of valid ones).

    Valid kinds are DATA and WATERMARK (a producer's promise that its later records are newer
    than ``event_time_ms``; END_OF_STREAM when it is done).
    """
    records, ok = _decode(values, INPUT_DTYPE)
    ok &= records["kind"] != Kind.TABLE_SWITCH
    return records, ok


def decode_work(values: pa.Array | Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """Decode ``work``-topic values: (records of :data:`WORK_DTYPE`, mask of valid ones); a
    value's bytes after the header (a wrapped user value) are not read."""
    return _decode(values, WORK_DTYPE, payload=True)


def _stamped(dtype: np.dtype, count: int, kind: Kind) -> np.ndarray:
    """``count`` zeroed records of ``dtype`` carrying skewer's magic, version and ``kind``."""
    records = np.zeros(count, dtype=dtype)
    records["magic"] = MAGIC
    records["version"] = VERSION
    records["kind"] = kind
    return records


def encode_input(
    event_time_ms: np.ndarray, producer: np.ndarray, seq: np.ndarray, kind: Kind = Kind.DATA
) -> list[bytes]:
    """``keys``-topic values, one bytes object per record (DATA unless ``kind`` says)."""
    records = _stamped(INPUT_DTYPE, len(seq), kind)
    records["event_time_ms"] = event_time_ms
    records["producer"] = producer
    records["seq"] = seq
    return _split(records)


def encode_work(
    inputs: np.ndarray, source: int | np.ndarray, table_version: int | np.ndarray
) -> list[bytes]:
    """``work``-topic values for routed DATA records, from decoded :data:`INPUT_DTYPE` rows."""
    records = np.zeros(len(inputs), dtype=WORK_DTYPE)
    for name in INPUT_DTYPE.names:
        records[name] = inputs[name]
    records["source"] = source
    records["table_version"] = table_version
    return _split(records)


def work_headers(
    event_time_ms: np.ndarray, partition: int, offsets: np.ndarray, source: int, table_version: int
) -> list[bytes]:
    """``work`` headers of DATA records read from a user's topic, to put before their values:
    ``producer`` is the input partition and ``seq`` the record's offset there."""
    records = _stamped(WORK_DTYPE, len(offsets), Kind.DATA)
    records["event_time_ms"] = event_time_ms
    records["producer"] = partition
    records["seq"] = offsets
    records["source"] = source
    records["table_version"] = table_version
    return _split(records)


def work_payloads(values: pa.Array | pa.ChunkedArray | Sequence[bytes | None]) -> pa.Array:
    """The user's values wrapped in ``work`` values: each value without its header (empty for
    a marker or a value shorter than the header; null stays null), as one Arrow column.

    Example:
        >>> header = work_headers(np.array([1]), 0, np.array([0]), 0, 0)[0]
        >>> work_payloads([header + b"user", header, None]).to_pylist()
        [b'user', b'', None]
    """
    column, valid = binary_column(values)
    ends = column.offsets[1:]
    starts = np.minimum(column.offsets[:-1] + WORK_DTYPE.itemsize, ends)
    lengths = ends - starts
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    # each payload byte's index in the column's data: its payload's start plus its position
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(column),
        [validity, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(column.data[index])],
    )


def encode_marker(kind: Kind, source: int, time_ms: int = 0, table_version: int = 0) -> bytes:
    """A WATERMARK or TABLE_SWITCH value for the ``work`` topic."""
    if kind is Kind.DATA:
        raise ValueError("markers are WATERMARK or TABLE_SWITCH")
    record = _stamped(WORK_DTYPE, 1, kind)
    record["event_time_ms"] = time_ms
    record["source"] = source
    record["table_version"] = table_version
    return record.tobytes()


def _split(records: np.ndarray) -> list[bytes]:
    raw = records.tobytes()
    size = records.dtype.itemsize
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def window_start(event_time_ms: np.ndarray, window_ms: int) -> np.ndarray:
    """Start of the tumbling event-time window of each record (windows are [start, start+len))."""
    return (np.asarray(event_time_ms, dtype=np.int64) // window_ms) * window_ms

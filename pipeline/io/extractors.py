"""Key, event time and amount of each record of a user's own topic, a whole batch at a time.

Layer: io.

The ``--key``/``--time``/``--sum`` specs (:mod:`pipeline.io.extract.specs`) make an
:class:`Extractor`; it reads a consumed batch or a Spark task's Arrow column with compiled
scanners (:mod:`pipeline.io.extract`) into one :class:`Extraction`: per record a key, an event
time in ms, an amount in millionths and -- for a record it cannot use -- a reason from
:data:`pipeline.io.dead_letters.REASONS`. Design: docs/design.md#records-and-topics.

Example:
    >>> extractor = Extractor(parse_key("json:user"), parse_time("json:ts:iso"),
    ...                       parse_amount("json:bytes"))
    >>> out = extractor.extract(
    ...     [b'{"user": "u1", "ts": "2026-11-25T10:00:00.123Z", "bytes": 512}',
    ...      b'{"user": 42, "ts": "2026-11-25T11:00:00+01:00", "bytes": 1.5}',
    ...      b'{"ts": "2026-11-25T10:00:00Z", "bytes": 1}', b"not json"],
    ...     None, None)
    >>> out.keys.to_list(), out.event_time_ms.tolist(), format_amount(out.amount_micros.sum())
    ([b'u1', b'42', b'', b''], [1795600800123, 1795600800000, 0, 0], '513.5')
    >>> [REASONS[r] if r >= 0 else "ok" for r in out.reasons]
    ['ok', 'ok', 'no-key', 'undecodable-value']
    >>> extractor.detail(NO_KEY)
    "json:user: no string or integer field 'user'"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from operators.keys import KeyBatch
from pipeline.io.dead_letters import (
    BAD_AMOUNT,
    BAD_TIME,
    KEY_TOO_LARGE,
    NO_KEY,
    REASONS,
    UNDECODABLE,
)
from pipeline.io.extract import csv_scan, json_scan
from pipeline.io.extract.compound import json_arrays
from pipeline.io.extract.numbers_times import (
    AMOUNT_DIGITS,
    TIME_LIMIT_MS,
    field_amounts,
    field_times,
    format_amount,
)
from pipeline.io.extract.spans import K_INT, K_STRING, Field, gather
from pipeline.io.extract.specs import (
    AMOUNT_SOURCES,
    KEY_SOURCES,
    TIME_SOURCES,
    TIME_UNITS,
    ExtractorSpecError,
    FieldSpec,
    check_together,
    parse_amount,
    parse_key,
    parse_time,
)
from pipeline.io.query.job import NUMBER, Column
from pipeline.io.records import MAX_KEY_BYTES, binary_column

__all__ = [
    "AMOUNT_DIGITS",
    "AMOUNT_SOURCES",
    "BAD_AMOUNT",
    "BAD_TIME",
    "KEY_SOURCES",
    "KEY_TOO_LARGE",
    "NO_KEY",
    "REASONS",
    "TIME_LIMIT_MS",
    "TIME_SOURCES",
    "TIME_UNITS",
    "UNDECODABLE",
    "Extraction",
    "Extractor",
    "ExtractorSpecError",
    "FieldSpec",
    "Values",
    "format_amount",
    "parse_amount",
    "parse_key",
    "parse_time",
]

Values = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


class Extraction(NamedTuple):
    """What an :class:`Extractor` read from a batch, one entry per record."""

    #: One key per record; empty on failing records.
    keys: KeyBatch
    #: int64 event time in ms; 0 on failing records.
    event_time_ms: np.ndarray
    #: int64 amount in millionths (:data:`AMOUNT_DIGITS`); 0 without an amount spec and on
    #: failing records.
    amount_micros: np.ndarray
    #: int8: -1 if the record is usable, else an index into :data:`REASONS`.
    reasons: np.ndarray
    #: The extractor's query columns by name (:meth:`Extractor.read_columns`).
    columns: Mapping[str, pa.Array] = MappingProxyType({})


def _timestamps(stamps: np.ndarray | pa.Array | pa.ChunkedArray | None, n: int) -> np.ndarray:
    if stamps is None:
        raise ValueError("a kafka-timestamp extractor needs the records' timestamps")
    if isinstance(stamps, pa.ChunkedArray | pa.Array):
        stamps = stamps.to_numpy(zero_copy_only=False)
    stamps = np.asarray(stamps)
    if stamps.shape != (n,):
        raise ValueError(f"{stamps.shape[0]} timestamps for {n} records")
    if stamps.dtype.kind == "f":
        # A null Arrow timestamp arrives as NaN: no timestamp.
        return np.where(np.isfinite(stamps), stamps, -1).astype(np.int64)
    return stamps.astype(np.int64, copy=False)


def _kept(keys: KeyBatch, keep: np.ndarray) -> KeyBatch:
    """``keys`` with the rows not in ``keep`` made empty."""
    n = len(keys)
    return KeyBatch(
        *gather(keys.data, keys.offsets[:-1], keys.offsets[1:], np.zeros(n, dtype=np.int8), keep)
    )


def values_and_mask(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A column :meth:`Extractor.read_columns` read as int64 values (a number's millionths; 0
    for a text, whose aggregates only count it, and for a NULL) and the mask of the records
    that have a value.

    >>> values_and_mask(pa.array([5, None], pa.int64()))
    (array([5, 0]), array([ True, False]))
    """
    present = column.is_valid().to_numpy(zero_copy_only=False)
    if not pa.types.is_integer(column.type):
        return np.zeros(len(column), dtype=np.int64), present
    return column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), present


def _texts(data: np.ndarray, field: Field) -> tuple[KeyBatch, np.ndarray]:
    """A field's text per row, as keys read it (a JSON string or integer -- ``-0`` is ``0`` --
    or a CSV cell), empty where it has none; and the mask of rows that have one."""
    present = field.present
    starts = field.starts
    if field.kinds is not None:
        is_int = field.kinds == K_INT
        present = (field.kinds == K_STRING) | is_int
        # -0 is the integer 0, whose decimal text is "0".
        two = np.flatnonzero(is_int & (field.ends - starts == 2))
        negative_zero = two[(data[starts[two]] == 45) & (data[starts[two] + 1] == 48)]
        if negative_zero.shape[0]:
            starts = starts.copy()
            starts[negative_zero] += 1
    texts = KeyBatch(*gather(data, starts, field.ends, field.modes, present))
    if field.kinds is None:
        # An empty CSV cell is no value, as Spark's CSV reader takes it.
        present = present & (np.diff(texts.offsets) > 0)
    return texts, present


@dataclass(frozen=True)
class Extractor:
    """Reads (key, event time, amount) from batches of a user's records; picklable, so a
    grouping source and a Spark task use the very same one."""

    key: FieldSpec
    time: FieldSpec
    amount: FieldSpec | None = None
    #: Further columns a query reads (its WHERE's), read in the same pass over the batch.
    columns: tuple[Column, ...] = ()
    #: A query's grouping columns after the first (``key``): the key is then all of them.
    key_columns: tuple[Column, ...] = ()
    #: The columns a query's aggregates read: only a worker reads them
    #: (:meth:`aggregated_values`), from the values it is handed.
    aggregated: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        check_together(self.key, self.time, self.amount)
        fmt = self.value_format
        for column in (*self.columns, *self.key_columns, *self.aggregated):
            source = column.spec.source
            if source in ("json", "csv") and fmt not in (None, source):
                raise ExtractorSpecError(
                    f"column {column.name} reads {source} values but the others read {fmt}"
                )

    def _flagged(self) -> list[tuple[str, FieldSpec]]:
        specs = [("--key", self.key), ("--time", self.time)]
        return specs if self.amount is None else [*specs, ("--sum", self.amount)]

    def _value_specs(self, fmt: str) -> list[FieldSpec]:
        """Every spec that reads the value in format ``fmt``, each once, the flags' first."""
        specs = [s for _, s in self._flagged()]
        specs += [c.spec for c in (*self.columns, *self.key_columns)]
        return list(dict.fromkeys(s for s in specs if s.source == fmt))

    @property
    def value_format(self) -> str | None:
        """``json`` or ``csv`` if some spec reads the value, else None."""
        specs = [s for _, s in self._flagged()]
        specs += [c.spec for c in (*self.columns, *self.key_columns)]
        return next((s.source for s in specs if s.source in ("json", "csv")), None)

    def detail(self, reason: int) -> str:
        """One line for a dead letter: which spec refused the record, and why."""
        key, time, amount = self.key, self.time, self.amount
        if reason == UNDECODABLE:
            spec = next(s for _, s in self._flagged() if s.source in ("json", "csv"))
            if spec.source == "json":
                return f"{spec.text}: the value is not a JSON object"
            return f"{spec.text}: the value is not CSV (no value, or an unclosed quote)"
        if reason == NO_KEY and self.key_columns:
            named = ", ".join([key.text, *(c.spec.text for c in self.key_columns)])
            return f"{named}: a grouping column has no string or integer value"
        if reason == NO_KEY:
            if key.source == "kafka-key":
                return f"{key.text}: the record has no key"
            if key.source == "json":
                return f"{key.text}: no string or integer field {key.field!r}"
            return f"{key.text}: no column {key.field}, or it is empty"
        if reason == KEY_TOO_LARGE:
            return f"{key.text}: the key is longer than {MAX_KEY_BYTES} bytes"
        if reason == BAD_TIME:
            if time.source == "kafka-timestamp":
                return f"{time.text}: the record has no timestamp"
            what = {
                "ms": "a number of milliseconds",
                "s": "a number of seconds",
                "iso": "an ISO-8601 time",
            }[time.unit or "ms"]
            where = f"field {time.field!r}" if time.source == "json" else f"column {time.field}"
            return f"{time.text}: {where} is missing or not {what} (within ±1e18 ms)"
        if reason == BAD_AMOUNT and amount is not None:
            where = (
                f"field {amount.field!r}" if amount.source == "json" else f"column {amount.field}"
            )
            return f"{amount.text}: {where} is missing or not a finite number"
        raise ValueError(f"no such reason: {reason}")

    def extract(
        self,
        values: Values | None,
        kafka_keys: Values | None,
        kafka_timestamps_ms: np.ndarray | pa.Array | None,
    ) -> Extraction:
        """Key, event time and amount of each record, and why a record is unusable: the first
        failing check of undecodable value, no key, key too large, bad time, bad amount
        (docs/design.md#records-and-topics says what each means per spec). A failing record
        gets an empty key, time 0 and amount 0, so the arrays stay aligned with the batch.

        ``values`` and ``kafka_keys`` are Arrow binary columns or sequences of ``bytes``/
        ``None``; ``kafka_timestamps_ms`` int64 (negative: no timestamp). An input no spec
        reads may be None.
        """
        inputs = (values, kafka_keys, kafka_timestamps_ms)
        n = next((len(x) for x in inputs if x is not None), 0)
        fmt = self.value_format
        fields: dict[FieldSpec, Field] = {}
        undecodable = np.zeros(n, dtype=bool)
        data = np.zeros(0, dtype=np.uint8)
        if fmt is not None:
            if values is None:
                raise ValueError(f"a {fmt} extractor needs the records' values")
            column, valid = binary_column(values)
            if len(column) != n:
                raise ValueError(f"{len(column)} values for {n} records")
            data = column.data
            scan = json_scan.scan if fmt == "json" else csv_scan.scan
            fields, decoded = scan(column, valid, self._value_specs(fmt))
            undecodable = ~decoded

        keys, no_key, too_large = self._keys(data, fields, kafka_keys, n)
        if self.time.source == "kafka-timestamp":
            times = _timestamps(kafka_timestamps_ms, n).copy()
            time_ok = times >= 0
        else:
            times, time_ok = field_times(data, fields[self.time], self.time.unit)
        if self.amount is None:
            amounts = np.zeros(n, dtype=np.int64)
            amount_ok = np.ones(n, dtype=bool)
        else:
            amounts, amount_ok = field_amounts(data, fields[self.amount])

        # Assigned from the last check to the first, so the first failing check wins.
        reasons = np.full(n, -1, dtype=np.int8)
        reasons[~amount_ok] = BAD_AMOUNT
        reasons[~time_ok] = BAD_TIME
        reasons[too_large] = KEY_TOO_LARGE
        reasons[no_key] = NO_KEY
        reasons[undecodable] = UNDECODABLE
        bad = reasons >= 0
        if bad.any():
            times[bad] = 0
            amounts[bad] = 0
            if (np.diff(keys.offsets)[bad] > 0).any():
                keys = _kept(keys, ~bad)
        columns = self.read_columns(data, fields, kafka_keys, ~undecodable)
        return Extraction(keys, times, amounts, reasons, columns)

    def read_columns(
        self,
        data: np.ndarray,
        fields: dict[FieldSpec, Field],
        kafka_keys: Values | None,
        decoded: np.ndarray,
        columns: Sequence[Column] | None = None,
    ) -> dict[str, pa.Array]:
        """Each query column (``columns``, by default :attr:`columns`) as
        :mod:`pipeline.io.query.predicate` reads it: a number as int64
        millionths, a text as binary; null (SQL's NULL) where the record's value could not be
        decoded, has no such field, holds a JSON ``null`` or an empty CSV cell, or a value not
        of the column's kind (a text that is no number, a JSON float, boolean or container for
        a text)."""
        out: dict[str, pa.Array] = {}
        for column in self.columns if columns is None else columns:
            spec = column.spec
            if spec.source == "kafka-key":
                if kafka_keys is None:
                    raise ValueError("a kafka-key column needs the records' keys")
                texts, present = binary_column(kafka_keys)
            elif column.kind == NUMBER:
                micros, ok = field_amounts(data, fields[spec])
                out[column.name] = pa.array(micros, pa.int64(), mask=~(ok & decoded))
                continue
            else:
                texts, present = _texts(data, fields[spec])
                present = present & decoded
            out[column.name] = pa.BinaryArray.from_buffers(
                pa.binary(),
                len(texts),
                [
                    pa.py_buffer(np.packbits(present, bitorder="little")),
                    pa.py_buffer(texts.offsets.astype(np.int32)),
                    pa.py_buffer(texts.data),
                ],
            )
        return out

    def _keys(
        self,
        data: np.ndarray,
        fields: dict[FieldSpec, Field],
        kafka_keys: Values | None,
        n: int,
    ) -> tuple[KeyBatch, np.ndarray, np.ndarray]:
        """(keys, no-key mask, too-large mask); with :attr:`key_columns`, the key is the JSON
        array of every grouping column's text (:mod:`pipeline.io.extract.compound`), and a
        record without one of them has no key."""
        keys, missing = self._texts_of(self.key, data, fields, kafka_keys, n)
        if self.key_columns:
            parts = [keys]
            for column in self.key_columns:
                part, part_missing = self._texts_of(column.spec, data, fields, kafka_keys, n)
                parts.append(part)
                missing |= part_missing
            keys = json_arrays(parts)
            if missing.any():
                keys = _kept(keys, ~missing)
        lengths = np.diff(keys.offsets)
        return keys, missing | (lengths == 0), lengths > MAX_KEY_BYTES

    def _texts_of(
        self,
        spec: FieldSpec,
        data: np.ndarray,
        fields: dict[FieldSpec, Field],
        kafka_keys: Values | None,
        n: int,
    ) -> tuple[KeyBatch, np.ndarray]:
        """A key column's text per record, and the mask of records without one."""
        if spec.source == "kafka-key":
            if kafka_keys is None:
                raise ValueError("a kafka-key extractor needs the records' keys")
            keys, valid = binary_column(kafka_keys)
            if len(keys) != n:
                raise ValueError(f"{len(keys)} keys for {n} records")
            if not valid.all():
                # A null key's slice is whatever Arrow stored: make it empty before anyone
                # reads it as a key.
                keys = _kept(keys, valid)
            return keys, ~valid | (np.diff(keys.offsets) == 0)
        keys = _texts(data, fields[spec])[0]
        return keys, np.diff(keys.offsets) == 0

    def aggregated_values(self, values: Values) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each aggregated column's int64 values (a number's millionths; 0 for a text, whose
        aggregates only count it) and the mask of the records that have one, not NULL, read as
        :meth:`read_columns` reads them: what a worker reads from the values it is handed."""
        fmt = next(c.spec.source for c in self.aggregated)
        column, valid = binary_column(values)
        scan = json_scan.scan if fmt == "json" else csv_scan.scan
        fields, decoded = scan(column, valid, list(dict.fromkeys(c.spec for c in self.aggregated)))
        read = self.read_columns(column.data, fields, None, decoded, self.aggregated)
        return {name: values_and_mask(array) for name, array in read.items()}

    def amounts(self, values: Values) -> tuple[np.ndarray, np.ndarray]:
        """Only the amounts (int64 millionths; 0 where missing) and a mask of the records that
        have one: what a worker reads from the user's values it is handed, without the key
        and time the grouping stage already took from them."""
        if self.amount is None:
            raise ValueError("this extractor has no --sum spec")
        column, valid = binary_column(values)
        scan = json_scan.scan if self.amount.source == "json" else csv_scan.scan
        fields, decoded = scan(column, valid, [self.amount])
        micros, ok = field_amounts(column.data, fields[self.amount])
        ok &= decoded
        return np.where(ok, micros, 0), ok

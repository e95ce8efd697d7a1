"""Extractors of a user's records against plain-Python references, by hypothesis.

The JSON reference is ``json.loads`` (bytes decoded as UTF-8 with surrogates passed, as
``json.loads`` does for bytes; numbers kept as written with ``Decimal`` so times are exact),
the CSV reference is the ``csv`` module, the ISO reference is ``datetime``: random objects,
random byte mutations and random CSV rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pyarrow as pa
import pytest
from extractor_cases import OK, TIME_LIMIT, extractor, reference_decode, run, utc_ms
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.io.dead_letters import (
    BAD_AMOUNT,
    BAD_TIME,
    KEY_TOO_LARGE,
    NO_KEY,
    UNDECODABLE,
)
from pipeline.io.records import MAX_KEY_BYTES

# --- references and properties -----------------------------------------------------------------


def reference_number(value: Any) -> Fraction | None:
    if type(value) is int:
        return Fraction(value)
    if isinstance(value, Decimal) and value.is_finite():
        return Fraction(value)
    return None


ISO_PATTERN = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)(?:[Tt ](\d\d):(\d\d)(?::(\d\d)(?:[.,](\d+))?)?)?"
    r"(?:([Zz])|([+-])(\d\d)(?::?(\d\d))?)?",
    re.ASCII,
)


def reference_iso(text: str) -> int | None:
    match = ISO_PATTERN.fullmatch(text)
    if not match:
        return None
    y, mo, d, h, mi, s, frac, _, sign, oh, om = match.groups()
    try:
        offset = timedelta(0)
        if sign:
            if int(oh) > 23 or int(om or 0) > 59:
                return None
            offset = timedelta(hours=int(oh), minutes=int(om or 0)) * (1 if sign == "+" else -1)
        moment = datetime(
            int(y),
            int(mo),
            int(d),
            int(h or 0),
            int(mi or 0),
            int(s or 0),
            tzinfo=timezone(offset),
        )
    except ValueError:
        return None
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return (moment - epoch) // timedelta(milliseconds=1) + int((frac or "0")[:3].ljust(3, "0"))


def reference_json(value: bytes | None, key: str, time: str, unit: str, amount: str) -> tuple:
    """(reason, key, time, amount) of one record by json.loads, as the module docstring says."""
    obj = reference_decode(value)
    if obj is None:
        return UNDECODABLE, b"", 0, 0
    k = obj.get(key)
    if isinstance(k, str) and k:
        key_bytes = k.encode("utf-8", "surrogatepass")
    elif type(k) is int:
        key_bytes = str(k).encode()
    else:
        return NO_KEY, b"", 0, 0
    if len(key_bytes) > MAX_KEY_BYTES:
        return KEY_TOO_LARGE, b"", 0, 0
    t = obj.get(time)
    if unit == "iso":
        ms = reference_iso(t) if isinstance(t, str) else None
    else:
        number = reference_number(t)
        ms = math.floor(number * (1000 if unit == "s" else 1)) if number is not None else None
    if ms is None or abs(ms) >= TIME_LIMIT:
        return BAD_TIME, b"", 0, 0
    a = reference_number(obj.get(amount))
    micros = math.floor(a * 10**6) if a is not None else None
    if micros is None or abs(micros) >= TIME_LIMIT:
        return BAD_AMOUNT, b"", 0, 0
    return OK, key_bytes, ms, micros


def check_against_reference(values: list[bytes | None], unit: str) -> None:
    ex = extractor("json:k", f"json:t:{unit}", "json:n")
    out = run(ex, values)
    expected = [reference_json(v, "k", "t", unit, "n") for v in values]
    got = list(
        zip(
            out.reasons.tolist(),
            out.keys.to_list(),
            out.event_time_ms.tolist(),
            out.amount_micros.tolist(),
            strict=True,
        )
    )
    assert got == expected


FIELD_NAMES = st.sampled_from(["k", "t", "n", "x", "K", "k ", "é", ""]) | st.text(max_size=4)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["2026-11-25T10:00:00Z", "2026-11-25 10:00:00.5+01:00", "1999-01-01"])
    | st.datetimes(timezones=st.none() | st.timezones()).map(lambda d: d.isoformat())
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELD_NAMES, inner, max_size=3),
    max_leaves=8,
)
# Random fields, and the wanted ones (k, t, n) more often than chance would give them.
OBJECTS = st.builds(
    lambda other, wanted: {**other, **wanted},
    st.dictionaries(FIELD_NAMES, JSON_VALUES, max_size=4),
    st.fixed_dictionaries({}, optional={"k": SCALARS, "t": SCALARS, "n": SCALARS}),
)


def dump(obj: dict[str, Any], style: int) -> bytes:
    if style == 0:
        return json.dumps(obj).encode()
    if style == 1:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return json.dumps(obj, indent=2, ensure_ascii=False).replace("\n", "\r\n").encode()


@given(st.lists(st.tuples(OBJECTS, st.integers(0, 2)), max_size=12), st.sampled_from(["ms", "s"]))
@settings(max_examples=300, deadline=None)
def test_json_matches_json_loads_on_random_objects(objects: list, unit: str) -> None:
    check_against_reference([dump(obj, style) for obj, style in objects], unit)


@given(
    st.lists(st.tuples(OBJECTS, st.integers(0, 2)), min_size=1, max_size=6),
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.integers(0, 10_000),
            st.sampled_from(list(b'{}[]",:\\ \n\r\t\x00\x7f\x80\xbf\xc3\xed\xff/tfnNI0-.eE+9u')),
        ),
        min_size=1,
        max_size=4,
    ),
)
@settings(max_examples=400, deadline=None)
def test_json_validity_matches_json_loads_on_mutated_bytes(objects: list, edits: list) -> None:
    values: list[bytes | None] = []
    for obj, style in objects:
        value = bytearray(dump(obj, style))
        for op, position, byte in edits:
            at = position % (len(value) + 1)
            if op == 0:
                value.insert(at, byte)
            elif op == 1 and at < len(value):
                del value[at]
            elif at < len(value):
                value[at] = byte
        values.append(bytes(value))
    check_against_reference(values, "ms")


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["0", "-0", "1", "-1", "12", "999999999999999999", "1" + "0" * 18]),
            st.sampled_from(["", ".0", ".5", ".999", ".0001", ".123456789123456789"]),
            st.sampled_from(["", "e0", "e3", "E-3", "e+2", "e-20", "e17", "e400", "e-400"]),
        ),
        max_size=10,
    ),
    st.sampled_from(["ms", "s"]),
)
@settings(max_examples=200, deadline=None)
def test_exact_times_from_decimal_text(numbers: list, unit: str) -> None:
    values = [b'{"k": 1, "t": %s, "n": 1}' % "".join(parts).encode() for parts in numbers]
    check_against_reference(values, unit)


@given(st.lists(st.datetimes(timezones=st.none() | st.timezones()), max_size=10))
@settings(max_examples=100, deadline=None)
def test_iso_matches_datetime(moments: list[datetime]) -> None:
    texts = [m.isoformat(sep=" " if m.microsecond % 2 else "T") for m in moments]
    values = [json.dumps({"k": "a", "t": text, "n": 0}).encode() for text in texts]
    check_against_reference(values, "iso")
    out = extractor("json:k", "json:t:iso").extract(values, None, None)
    for text, ms, reason in zip(texts, out.event_time_ms.tolist(), out.reasons, strict=True):
        if reason < 0:  # isoformat writes seconds offsets for some old zones: those are refused
            assert ms == utc_ms(text)


CSV_FIELDS = st.text(alphabet=st.sampled_from(list('ab ,"\n\r\t1é')), max_size=6) | st.sampled_from(
    ["", '"', ",", '""']
)


@given(st.lists(st.lists(CSV_FIELDS, min_size=1, max_size=5), max_size=10), st.integers(0, 5))
@settings(max_examples=300, deadline=None)
def test_csv_matches_the_csv_module(rows: list[list[str]], column: int) -> None:
    values = []
    for row in rows:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\r\n").writerow(row)
        values.append(buffer.getvalue().encode())
    out = run(extractor(f"csv:{column}", "kafka-timestamp"), values)
    for value, key, reason in zip(values, out.keys.to_list(), out.reasons.tolist(), strict=True):
        (parsed,) = list(csv.reader(io.StringIO(value.decode(), newline="")))
        field = parsed[column] if column < len(parsed) else ""
        assert (reason, key) == ((OK, field.encode()) if field else (NO_KEY, b""))


def test_amounts_alone_agree_with_the_whole_extraction() -> None:
    """A worker reads only the amounts of the values it is handed: the same millionths."""
    ex = extractor("json:k", "json:t", "json:n")
    values = [b'{"k": "a", "t": 1, "n": 0.25}', b'{"k": "a", "t": 1}', b"x", None] * 50
    whole = ex.extract(values, None, None)
    micros, ok = ex.amounts(pa.array(values, pa.binary()))
    assert micros.tolist() == whole.amount_micros.tolist()
    assert ok.tolist() == [True, False, False, False] * 50
    with pytest.raises(ValueError, match="no --sum"):
        extractor("json:k", "json:t").amounts(values)

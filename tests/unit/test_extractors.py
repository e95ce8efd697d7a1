"""Extractors of a user's records (pipeline/io/extractors.py) against plain-Python references.

The JSON reference is ``json.loads`` (bytes decoded as UTF-8 with surrogates passed, as
``json.loads`` does for bytes; numbers kept as written with ``Decimal`` so times are exact),
the CSV reference is the ``csv`` module, the ISO reference is ``datetime``. Hand-worked cases
pin every reason and every spec error; hypothesis compares random objects, random byte
mutations and random CSV rows with the references.
"""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.io.extractors import (
    BAD_AMOUNT,
    BAD_TIME,
    KEY_TOO_LARGE,
    NO_KEY,
    REASONS,
    UNDECODABLE,
    Extraction,
    Extractor,
    ExtractorSpecError,
    FieldSpec,
    parse_amount,
    parse_key,
    parse_time,
)
from pipeline.io.records import MAX_KEY_BYTES

OK = -1
TIME_LIMIT = 10**18


def extractor(key: str, time: str, amount: str | None = None) -> Extractor:
    return Extractor(parse_key(key), parse_time(time), parse_amount(amount) if amount else None)


def run(ex: Extractor, values: list[bytes | None], keys: Any = None, stamps: Any = None) -> Any:
    """Extract from a list and from Arrow; both must agree exactly. Returns the list result."""
    n = len(values)
    if ex.key.source == "kafka-key" and keys is None:
        keys = [b"k"] * n
    if ex.time.source == "kafka-timestamp" and stamps is None:
        stamps = np.zeros(n, dtype=np.int64)
    from_list = ex.extract(values, keys, stamps)
    arrow_keys = pa.array(keys, pa.binary()) if keys is not None else None
    from_arrow = ex.extract(pa.array(values, pa.binary()), arrow_keys, stamps)
    assert_same(from_list, from_arrow)
    assert len(from_list.keys) == n
    assert from_list.event_time_ms.dtype == np.int64 and from_list.event_time_ms.shape == (n,)
    assert from_list.amount_micros.dtype == np.int64 and from_list.amount_micros.shape == (n,)
    assert from_list.reasons.dtype == np.int8 and from_list.reasons.shape == (n,)
    bad = from_list.reasons >= 0
    assert all(from_list.keys[i] == b"" for i in np.flatnonzero(bad))
    assert not from_list.event_time_ms[bad].any() and not from_list.amount_micros[bad].any()
    return from_list


def assert_same(a: Extraction, b: Extraction) -> None:
    assert a.keys.to_list() == b.keys.to_list()
    assert a.event_time_ms.tolist() == b.event_time_ms.tolist()
    assert a.amount_micros.tolist() == b.amount_micros.tolist()
    assert a.reasons.tolist() == b.reasons.tolist()


def named(reasons: np.ndarray) -> list[str]:
    return [REASONS[r] if r >= 0 else "ok" for r in reasons]


def utc_ms(text: str) -> int:
    """Epoch ms of an ISO text by ``datetime`` (no offset = UTC), floored to the ms."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


# --- specs ------------------------------------------------------------------------------------


def test_parse_good_specs() -> None:
    assert parse_key("kafka-key") == FieldSpec("kafka-key", None, None, "kafka-key")
    assert parse_key("json:user") == FieldSpec("json", "user", None, "json:user")
    assert parse_key("json:a:b") == FieldSpec("json", "a:b", None, "json:a:b")
    assert parse_key("csv:0") == FieldSpec("csv", 0, None, "csv:0")
    assert parse_time("kafka-timestamp") == FieldSpec(
        "kafka-timestamp", None, None, "kafka-timestamp"
    )
    assert parse_time("json:ts") == FieldSpec("json", "ts", "ms", "json:ts")
    assert parse_time("json:ts:s") == FieldSpec("json", "ts", "s", "json:ts:s")
    assert parse_time("json:a:b:iso") == FieldSpec("json", "a:b", "iso", "json:a:b:iso")
    assert parse_time("csv:12:iso") == FieldSpec("csv", 12, "iso", "csv:12:iso")
    assert parse_time("csv:3") == FieldSpec("csv", 3, "ms", "csv:3")
    assert parse_amount("json:bytes") == FieldSpec("json", "bytes", None, "json:bytes")
    assert parse_amount("csv:2") == FieldSpec("csv", 2, None, "csv:2")


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_key, "json:", "--key json: names no field"),
        (parse_key, "csv:x", "--key csv:x: column must be a non-negative integer"),
        (parse_key, "csv:-1", "--key csv:-1: column must be a non-negative integer"),
        (parse_key, "csv:", "--key csv: column must be a non-negative integer"),
        (parse_key, "csv:1:ms", "--key csv:1:ms: column must be a non-negative integer"),
        (
            parse_key,
            "kafka-timestamp",
            "--key kafka-timestamp: not a key source (kafka-key, json:FIELD, csv:N)",
        ),
        (parse_key, "", "--key : not a key source (kafka-key, json:FIELD, csv:N)"),
        (parse_key, "xml:user", "--key xml:user: not a key source (kafka-key, json:FIELD, csv:N)"),
        (
            parse_time,
            "json:ts:minutes",
            "--time json:ts:minutes: unknown time unit 'minutes' (ms, s or iso)",
        ),
        (parse_time, "csv:1:", "--time csv:1: unknown time unit '' (ms, s or iso)"),
        (parse_time, "json::ms", "--time json::ms: names no field"),
        (parse_time, "csv:y:iso", "--time csv:y:iso: column must be a non-negative integer"),
        (
            parse_time,
            "kafka-key",
            "--time kafka-key: not a time source (kafka-timestamp, json:FIELD[:ms|s|iso], "
            "csv:N[:ms|s|iso])",
        ),
        (parse_amount, "kafka-key", "--sum kafka-key: not an amount source (json:FIELD, csv:N)"),
        (parse_amount, "json:", "--sum json: names no field"),
        (parse_amount, "csv:1.5", "--sum csv:1.5: column must be a non-negative integer"),
    ],
)
def test_parse_bad_specs(parse: Any, text: str, message: str) -> None:
    with pytest.raises(ExtractorSpecError) as caught:
        parse(text)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


def test_spec_errors_are_one_line_even_for_odd_text() -> None:
    with pytest.raises(ExtractorSpecError) as caught:
        parse_key("json\nuser")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("--key 'json\\nuser'")


def test_an_extractor_reads_one_value_format() -> None:
    with pytest.raises(ExtractorSpecError, match=r"^--time csv:1: reads csv values but --key"):
        extractor("json:user", "csv:1")
    with pytest.raises(ExtractorSpecError, match=r"^--sum json:x: reads json values"):
        extractor("kafka-key", "csv:1", "json:x")
    with pytest.raises(ExtractorSpecError, match=r"^--sum kafka-key: not an amount source"):
        Extractor(
            parse_key("json:a"),
            parse_time("json:t"),
            FieldSpec("kafka-key", None, None, "kafka-key"),
        )


def test_extractor_pickles() -> None:
    ex = extractor("json:user", "json:ts:iso", "json:bytes")
    assert pickle.loads(pickle.dumps(ex)) == ex


# --- kafka key and timestamp -------------------------------------------------------------------


def test_kafka_key_and_timestamp() -> None:
    ex = extractor("kafka-key", "kafka-timestamp")
    big = b"x" * (MAX_KEY_BYTES + 1)
    keys = [b"a", None, b"", big, b"b", b"c"]
    stamps = np.array([5, 6, 7, 8, -1, 0], dtype=np.int64)
    # Values are not read: anything goes, null included.
    out = run(ex, [None, b"{", b"", b"x", b"y", b"z"], keys, stamps)
    assert named(out.reasons) == ["ok", "no-key", "no-key", "key-too-large", "bad-time", "ok"]
    assert out.keys.to_list() == [b"a", b"", b"", b"", b"", b"c"]
    assert out.event_time_ms.tolist() == [5, 0, 0, 0, 0, 0]
    assert not out.amount_micros.any()
    assert ex.extract(None, keys, stamps).reasons.tolist() == out.reasons.tolist()


def test_kafka_key_of_exactly_the_limit_is_fine() -> None:
    ex = extractor("kafka-key", "kafka-timestamp")
    out = run(ex, [b""], [b"x" * MAX_KEY_BYTES], np.array([1]))
    assert out.reasons.tolist() == [OK]


def test_null_arrow_timestamps_are_bad_time() -> None:
    ex = extractor("kafka-key", "kafka-timestamp")
    stamps = pa.array([1, None, 3], pa.int64())
    out = ex.extract(None, [b"a", b"b", b"c"], stamps)
    assert named(out.reasons) == ["ok", "bad-time", "ok"]
    assert out.event_time_ms.tolist() == [1, 0, 3]


def test_the_callers_timestamps_are_not_modified() -> None:
    stamps = np.array([1, 2], dtype=np.int64)
    extractor("kafka-key", "kafka-timestamp").extract(None, [None, b"b"], stamps)
    assert stamps.tolist() == [1, 2]


def test_empty_batch() -> None:
    for ex in [
        extractor("kafka-key", "kafka-timestamp"),
        extractor("json:u", "json:t:iso", "json:a"),
        extractor("csv:0", "csv:1", "csv:2"),
    ]:
        out = ex.extract([], [], np.zeros(0, dtype=np.int64))
        assert len(out.keys) == 0 and out.reasons.shape == (0,)


def test_inputs_must_be_there_and_agree() -> None:
    with pytest.raises(ValueError, match="needs the records' keys"):
        extractor("kafka-key", "json:t").extract([b"{}"], None, None)
    with pytest.raises(ValueError, match="needs the records' values"):
        extractor("json:k", "kafka-timestamp").extract(None, None, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="timestamps"):
        extractor("json:k", "kafka-timestamp").extract([b"{}"], None, np.zeros(2, np.int64))


# --- JSON ------------------------------------------------------------------------------------


def test_json_keys_by_type() -> None:
    ex = extractor("json:user", "kafka-timestamp")
    values = [
        b'{"user": "alice"}',
        b'{"user": 42}',
        b'{"user": -7}',
        b'{"user": -0}',
        b'{"user": 123456789012345678901234567890}',
        b'{"user": 4.5}',
        b'{"user": 1e3}',
        b'{"user": true}',
        b'{"user": null}',
        b'{"user": ""}',
        b'{"user": {"user": "x"}}',
        b'{"user": ["x"]}',
        b'{"other": "x"}',
        b'{"user": NaN}',
        b"{}",
    ]
    out = run(ex, values)
    assert out.keys.to_list()[:5] == [
        b"alice",
        b"42",
        b"-7",
        b"0",
        b"123456789012345678901234567890",
    ]
    assert named(out.reasons) == ["ok"] * 5 + ["no-key"] * 10


def test_json_key_field_of_mixed_types_in_one_batch() -> None:
    # Arrow's JSON reader refuses such a batch as a whole; here each record stands alone.
    ex = extractor("json:id", "json:t")
    values = [
        b'{"id": "a", "t": 1}',
        b'{"id": 7, "t": 2}',
        b'{"id": 7.5, "t": 3}',
        b'{"id": "7.5", "t": 4}',
        b'{"id": [1], "t": 5}',
        b'{"id": "b", "t": 6.9}',
    ]
    out = run(ex, values)
    assert out.keys.to_list() == [b"a", b"7", b"", b"7.5", b"", b"b"]
    assert out.event_time_ms.tolist() == [1, 2, 0, 4, 0, 6]
    assert named(out.reasons) == ["ok", "ok", "no-key", "ok", "no-key", "ok"]


def test_json_escapes_in_keys_and_field_names() -> None:
    ex = extractor("json:user", "kafka-timestamp")
    values = [
        rb'{"user": "caf\u00e9"}',
        rb'{"user": "a\"b\\c\/d\b\f\n\r\t"}',
        rb'{"user": "\ud83d\ude00 smile"}',
        rb'{"user": "lone \ud800 high"}',
        rb'{"user": "\ud800\u0041"}',
        rb'{"us\u0065r": "escaped name"}',
        '{"user": "raw é 😀"}'.encode(),
        rb'{"user": "\u0000"}',
    ]
    out = run(ex, values)
    expected = [json.loads(v)["user"].encode("utf-8", "surrogatepass") for v in values]
    assert out.keys.to_list() == expected
    assert expected[0] == "café".encode() and expected[2] == "😀 smile".encode()
    assert out.reasons.tolist() == [OK] * len(values)


def test_json_duplicate_fields_last_wins() -> None:
    ex = extractor("json:user", "json:t")
    out = run(ex, [b'{"user": "a", "t": 1, "user": "b"}', b'{"user": "a", "t": 1, "user": 1.5}'])
    assert out.keys.to_list() == [b"b", b""]
    assert named(out.reasons) == ["ok", "no-key"]


def test_pretty_printed_json_and_whitespace() -> None:
    ex = extractor("json:user", "json:ts", "json:n")
    obj = {"user": "u1", "nested": {"a": [1, 2, {"b": None}], "c": "x\ny"}, "ts": 17, "n": 2.5}
    values = [
        json.dumps(obj, indent=2).encode(),
        json.dumps(obj, indent="\t").replace("\n", "\r\n").encode(),
        b"  \n\t" + json.dumps(obj, separators=(",", ":")).encode() + b" \r\n ",
    ]
    out = run(ex, values)
    assert out.keys.to_list() == [b"u1"] * 3
    assert out.event_time_ms.tolist() == [17] * 3
    assert out.amount_micros.tolist() == [2_500_000] * 3


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"   ",
        b"null",
        b"[1, 2]",
        b'"user"',
        b"42",
        b"{",
        b'{"user": "a"',
        b'{"user": "a"}}',
        b'{"user": "a"} {"user": "b"}',
        b'{"user": "a"}{}',
        b'{"user": "a",}',
        b'{"user" "a"}',
        b'{user: "a"}',
        b"{'user': 'a'}",
        b'{"user": "a\x01"}',
        b'{"user": "a\nb"}',
        b'{"user": "\xff"}',
        b'{"user": "\xc3"}',
        b'{"user": "\xe0\x80\x80"}',
        b'{"user": "bad \\x escape"}',
        b'{"user": "\\u12"}',
        b'{"user": 01}',
        b'{"user": 1.}',
        b'{"user": .5}',
        b'{"user": +1}',
        b'{"user": 1e}',
        b'{"user": -}',
        b'{"user": tru}',
        b'{"user": True}',
        b'{"user": nan}',
        b'{"user": [1, 2,]}',
        b'{"user": [1 2]}',
        b'{"user": {"a" 1}}',
        b'{"a": [}]}',
        b'\xef\xbb\xbf{"user": "a"}',
        b'{"user": "a"}\x00',
    ],
)
def test_json_undecodable_values(value: bytes | None) -> None:
    out = run(extractor("json:user", "kafka-timestamp"), [b'{"user": "ok"}', value])
    assert named(out.reasons) == ["ok", "undecodable-value"]
    assert reference_decode(value) is None


def test_json_values_python_accepts() -> None:
    # Surrogates encoded in UTF-8 pass (json.loads decodes bytes with "surrogatepass"), as do
    # NaN and Infinity anywhere, and nesting of any depth.
    values = [
        b'{"user": "\xed\xa0\x80"}',
        b'{"user": "a", "x": [NaN, Infinity, -Infinity]}',
        b'{"user": "a", "deep": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"user": "a", "e": {}, "f": [], "g": [{}], "h": "\\u0041"}',
    ]
    out = run(extractor("json:user", "kafka-timestamp"), values)
    assert out.reasons.tolist() == [OK] * 4
    assert out.keys[0] == "\ud800".encode("utf-8", "surrogatepass")


def test_json_times_in_ms_and_s() -> None:
    values = [
        b'{"t": 1700000000123}',
        b'{"t": 1700000000123.9}',
        b'{"t": -1.5}',
        b'{"t": 1.234}',
        b'{"t": 1.5e3}',
        b'{"t": 12E-1}',
        b'{"t": 0}',
        b'{"t": "1700000000123"}',
        b'{"t": null}',
        b'{"t": NaN}',
        b'{"t": 1e18}',
        b'{"t": 999999999999999999}',
        b'{"t": 1e-999999999}',
        b"{}",
    ]
    ms = run(extractor("kafka-key", "json:t"), values)
    assert ms.event_time_ms.tolist() == [
        1700000000123,
        1700000000123,
        -2,
        1,
        1500,
        1,
        0,
        0,
        0,
        0,
        0,
        999999999999999999,
        0,
        0,
    ]
    assert named(ms.reasons) == ["ok"] * 7 + ["bad-time"] * 4 + ["ok", "ok", "bad-time"]
    s = run(extractor("kafka-key", "json:t:s"), values)
    # Exact decimal arithmetic: 1.234 s is 1234 ms (float arithmetic says 1233.9999999999998).
    assert s.event_time_ms.tolist()[:7] == [
        1700000000123000,
        1700000000123900,
        -1500,
        1234,
        1500000,
        1200,
        0,
    ]
    assert named(s.reasons) == ["ok"] * 7 + ["bad-time"] * 5 + ["ok", "bad-time"]


ISO_CASES = [
    "2026-11-25T10:00:00Z",
    "2026-11-25T10:00:00.123+01:00",
    "2026-11-25 10:00:00",
    "2026-11-25T10:00:00.1Z",
    "2026-11-25T10:00:00.123456789-05:30",
    "2026-11-25T10:00:00,5+0100",
    "2026-11-25T10:00:00+01",
    "2026-11-25T10:00+02:00",
    "2026-11-25",
    "2024-02-29T23:59:59.999Z",
    "1969-12-31T23:59:59.5Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999-23:59",
]
BAD_ISO = [
    "2026-13-01T00:00:00Z",
    "2025-02-29T00:00:00Z",
    "2026-11-31",
    "2026-11-25T24:00:00Z",
    "2026-11-25T10:60:00Z",
    "2026-11-25T10:00:60Z",
    "2026-11-25T10:00:00+24:00",
    "2026-11-25T10:00:00.Z",
    "2026-11-25T10:00:00Z junk",
    "2026-11-25T10",
    "2026/11/25",
    "20261125T100000Z",
    "0000-01-01",
    " 2026-11-25",
    "",
    "1795600800000",
]


def test_json_iso_times() -> None:
    ex = extractor("kafka-key", "json:ts:iso")
    values = [json.dumps({"ts": text}).encode() for text in ISO_CASES + BAD_ISO]
    values.append(b'{"ts": "2026-11-25T10:00:00\\u002b01:00"}')
    values.append(b'{"ts": 1795600800000}')
    out = run(ex, values)
    good = len(ISO_CASES)
    assert out.event_time_ms.tolist()[:good] == [utc_ms(text) for text in ISO_CASES]
    assert out.event_time_ms[0] == 1795600800000 and out.event_time_ms[1] == 1795597200123
    assert named(out.reasons) == ["ok"] * good + ["bad-time"] * len(BAD_ISO) + ["ok", "bad-time"]
    assert out.event_time_ms[-2] == utc_ms("2026-11-25T10:00:00+01:00")


def test_json_amounts() -> None:
    ex = extractor("kafka-key", "kafka-timestamp", "json:n")
    values = [
        b'{"n": 512}',
        b'{"n": -2.5}',
        b'{"n": 0.30000000000000004}',
        b'{"n": 1e-400}',
        b'{"n": -1e-400}',
        b'{"n": 999999999999.9999999}',
        b'{"n": 1.5E+3}',
        b'{"n": 1000000000000}',
        b'{"n": -1e12}',
        b'{"n": 123456789012345678901234567890}',
        b'{"n": 1e400}',
        b'{"n": NaN}',
        b'{"n": -Infinity}',
        b'{"n": "5"}',
        b'{"n": true}',
        b'{"n": null}',
        b"{}",
    ]
    out = run(ex, values)
    # millionths, computed from the digits: finer digits are floored, never rounded by a float
    assert out.amount_micros.tolist()[:7] == [
        512_000_000,
        -2_500_000,
        300_000,
        0,
        -1,
        999_999_999_999_999_999,
        1_500_000_000,
    ]
    # magnitudes of 10**12 and more would not leave an int64 sum room: refused, not wrapped
    assert named(out.reasons) == ["ok"] * 7 + ["bad-amount"] * 10


def test_the_first_failing_check_wins() -> None:
    ex = extractor("json:k", "json:t", "json:n")
    big = "x" * (MAX_KEY_BYTES + 1)
    values = [
        b"nope",
        b'{"t": "x", "n": "x"}',
        json.dumps({"k": big, "t": "x", "n": "x"}).encode(),
        b'{"k": "a", "t": "x", "n": "x"}',
        b'{"k": "a", "t": 1, "n": "x"}',
        b'{"k": "a", "t": 1, "n": 2}',
    ]
    out = run(ex, values)
    assert out.reasons.tolist() == [UNDECODABLE, NO_KEY, KEY_TOO_LARGE, BAD_TIME, BAD_AMOUNT, OK]
    assert out.keys.to_list() == [b""] * 5 + [b"a"]
    assert out.event_time_ms.tolist() == [0] * 5 + [1]
    assert out.amount_micros.tolist() == [0] * 5 + [2_000_000]


def test_same_field_for_key_time_and_amount() -> None:
    out = run(extractor("json:x", "json:x", "json:x"), [b'{"x": 5}', b'{"x": 5.5}'])
    assert out.keys.to_list() == [b"5", b""]
    assert out.event_time_ms.tolist() == [5, 0] and out.amount_micros.tolist() == [5_000_000, 0]


def test_arrow_inputs_of_every_shape_agree() -> None:
    ex = extractor("json:u", "json:t", "json:n")
    values = [b'{"u": "a", "t": 1, "n": 1}', None, b'{"u": "bb", "t": 2, "n": 2}', b"x"] * 3
    expected = ex.extract(values, None, None)
    array = pa.array([b"pad", *values], pa.binary()).slice(1)
    chunked = pa.chunked_array([pa.array(values[:5], pa.binary()), pa.array(values[5:])])
    for column in (array, chunked, pa.array(values, pa.large_binary())):
        assert_same(ex.extract(column, None, None), expected)


# --- CSV -------------------------------------------------------------------------------------


def test_csv_fields_and_quoting() -> None:
    ex = extractor("csv:1", "csv:0", "csv:2")
    values = [
        b"5,alice,1.5",
        b'6,"smith, john",2',
        b'7,"say ""hi""",3',
        b'8,"",4',
        b"9,,5",
        b"10,bob",
        b"11",
        b'12,"multi\nline",6\r\n',
        b"13,carol, 7 \n",
        b'14,"dave",8,"unclosed',
        b'15,"eve"x,9',
        None,
        b'16,"q""",\t1e2',
        b'"17",frank,"10"',
        b"18,\xffraw bytes\x00,11",
    ]
    out = run(ex, values)
    assert named(out.reasons) == [
        "ok",
        "ok",
        "ok",
        "no-key",
        "no-key",
        "bad-amount",
        "no-key",
        "ok",
        "ok",
        "undecodable-value",
        "undecodable-value",
        "undecodable-value",
        "ok",
        "ok",
        "ok",
    ]
    ok = out.reasons < 0
    assert [k for k, good in zip(out.keys.to_list(), ok, strict=True) if good] == [
        b"alice",
        b"smith, john",
        b'say "hi"',
        b"multi\nline",
        b"carol",
        b'q"',
        b"frank",
        b"\xffraw bytes\x00",
    ]
    assert out.event_time_ms[ok].tolist() == [5, 6, 7, 12, 13, 16, 17, 18]
    assert (out.amount_micros[ok] // 10**6).tolist() == [1, 2, 3, 6, 7, 100, 10, 11]
    assert out.amount_micros[0] == 1_500_000


def test_csv_times_and_amounts() -> None:
    values = [
        b"a,1.234,2026-11-25T10:00:00.123+01:00,3",
        b"a,,2026-11-25 10:00:00,",
        b"a,x,nope,x",
        b'a,"1""2",2026-11-25,"1,5"',
        b"a,+5,2026-11-25T10:00:00Z,.5",
        b"a, 7 ,2026-11-25T10:00:00Z , 5. ",
        b"a,1e400,2026-11-25T10:00:00Z,1e400",
        b"a,nan,2026-11-25T10:00:00Z,inf",
    ]
    s = run(extractor("csv:0", "csv:1:s", "csv:3"), values)
    assert named(s.reasons) == [
        "ok",
        "bad-time",
        "bad-time",
        "bad-time",
        "ok",
        "ok",
        "bad-time",
        "bad-time",
    ]
    assert s.event_time_ms.tolist() == [1234, 0, 0, 0, 5000, 7000, 0, 0]
    assert s.amount_micros.tolist() == [3_000_000, 0, 0, 0, 500_000, 5_000_000, 0, 0]
    iso = run(extractor("csv:0", "csv:2:iso", "csv:3"), values)
    assert named(iso.reasons) == [
        "ok",
        "bad-amount",
        "bad-time",
        "bad-amount",
        "ok",
        "ok",
        "bad-amount",
        "bad-amount",
    ]
    assert iso.event_time_ms[[0, 4, 5]].tolist() == [
        utc_ms("2026-11-25T10:00:00.123+01:00"),
        utc_ms("2026-11-25T10:00:00Z"),
        utc_ms("2026-11-25T10:00:00Z"),
    ]


def test_csv_and_kafka_key_mix() -> None:
    ex = extractor("kafka-key", "csv:0:iso")
    out = run(ex, [b"2026-11-25,x", b'"2026-11-25', b""], keys=[b"a", b"b", None])
    assert named(out.reasons) == ["ok", "undecodable-value", "no-key"]


# --- detail ----------------------------------------------------------------------------------


def test_details_name_the_spec() -> None:
    ex = extractor("json:user", "json:ts:iso", "json:bytes")
    details = [ex.detail(r) for r in range(len(REASONS))]
    assert details == [
        "json:user: no string or integer field 'user'",
        f"json:user: the key is longer than {MAX_KEY_BYTES} bytes",
        "json:user: the value is not a JSON object",
        "json:ts:iso: field 'ts' is missing or not an ISO-8601 time (within ±1e18 ms)",
        "json:bytes: field 'bytes' is missing or not a finite number",
    ]
    kafka = extractor("kafka-key", "kafka-timestamp")
    assert kafka.detail(NO_KEY) == "kafka-key: the record has no key"
    assert kafka.detail(BAD_TIME) == "kafka-timestamp: the record has no timestamp"
    csv_ex = extractor("csv:1", "csv:0:s")
    assert csv_ex.detail(NO_KEY) == "csv:1: no column 1, or it is empty"
    assert csv_ex.detail(UNDECODABLE).startswith("csv:1: the value is not CSV")
    assert "column 0" in csv_ex.detail(BAD_TIME) and "seconds" in csv_ex.detail(BAD_TIME)
    with pytest.raises(ValueError, match="no such reason"):
        kafka.detail(BAD_AMOUNT)
    assert all("\n" not in d for d in details)


# --- references and properties -----------------------------------------------------------------


def reference_decode(value: bytes | None) -> dict[str, Any] | None:
    """The object json.loads makes of a value (numbers as written), or None."""
    if value is None:
        return None
    try:
        text = value.decode("utf-8", "surrogatepass")
        obj = json.loads(text, parse_float=Decimal)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


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

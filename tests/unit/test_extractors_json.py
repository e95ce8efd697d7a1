"""Extractors of a user's JSON records (pipeline/io/extract/json_scan.py): keys by type,
escapes, whitespace, undecodable values, times and amounts, case by case."""

from __future__ import annotations

import json

import pytest
from extractor_cases import OK, extractor, named, reference_decode, run, utc_ms

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

"""Extractors of a user's records (pipeline/io/extractors.py): the specs, Kafka's key and
timestamp, CSV, which check wins and what a dead letter says, case by case.

The JSON cases are in test_extractors_json.py, the comparisons with plain-Python references
(``json.loads``, the ``csv`` module, ``datetime``) in test_extractors_reference.py.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from extractor_cases import OK, assert_same, extractor, named, run, utc_ms

from pipeline.io.dead_letters import (
    BAD_AMOUNT,
    BAD_TIME,
    KEY_TOO_LARGE,
    NO_KEY,
    REASONS,
    UNDECODABLE,
    WRONG_KIND,
)
from pipeline.io.extractors import (
    Extractor,
    ExtractorSpecError,
    FieldSpec,
    parse_amount,
    parse_key,
    parse_time,
)
from pipeline.io.records import MAX_KEY_BYTES

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
    # wrong-kind is a check of skewer's own records only: no extractor gives it.
    readable = [r for r in range(len(REASONS)) if r != WRONG_KIND]
    details = [ex.detail(r) for r in readable]
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
    for unread in (BAD_AMOUNT, WRONG_KIND):
        with pytest.raises(ValueError, match="no such reason"):
            kafka.detail(unread)
    assert all("\n" not in d for d in details)


def test_a_querys_columns_are_read_in_the_same_pass_with_sqls_nulls() -> None:
    """Numbers in millionths, texts as bytes; NULL for a missing field, a JSON null, a value of
    another kind, an undecodable value, an empty CSV cell; a JSON empty string is a text."""
    from pipeline.io.query.parse import parse_query

    job = parse_query(
        "SELECT url, count(*) FROM t WHERE ms > 0 AND region = 'eu' AND key = 'k' "
        "GROUP BY url, window(timestamp_millis(ts), '1 minute')"
    )
    columns = tuple(c for c in job.columns if c.name != "url")
    json_extractor = Extractor(parse_key("json:url"), parse_time("json:ts:ms"), None, columns)
    values = [
        b'{"url": "a", "ts": 1, "ms": 1.5, "region": "eu"}',
        b'{"url": "b", "ts": 2, "ms": "slow", "region": ""}',
        b'{"url": "c", "ts": 3, "ms": null, "region": 7}',
        b'{"url": "d", "ts": 4, "region": true}',
        b"not json",
    ]
    out = json_extractor.extract(values, [b"k", None, b"k", b"", b"k"], None)
    assert out.columns["ms"].to_pylist() == [1_500_000, None, None, None, None]
    assert out.columns["region"].to_pylist() == [b"eu", b"", b"7", None, None]
    assert out.columns["key"].to_pylist() == [b"k", None, b"k", b"", b"k"]

    csv_columns = parse_query(
        "SELECT _c0, count(*) FROM t WHERE _c2 > 0 AND _c3 = 'x' "
        "GROUP BY _c0, window(timestamp_millis(_c1), '1 minute')"
    ).columns
    csv_extractor = Extractor(
        parse_key("csv:0"),
        parse_time("csv:1"),
        None,
        tuple(c for c in csv_columns if c.name != "_c0"),
    )
    out = csv_extractor.extract([b"a,1,2.5,x", b"b,2,,", b"c,3,no,y"], None, None)
    assert out.columns["_c2"].to_pylist() == [2_500_000, None, None]
    assert out.columns["_c3"].to_pylist() == [b"x", None, b"y"]
    assert pickle.loads(pickle.dumps(csv_extractor)) == csv_extractor


def test_a_querys_columns_read_the_values_format_of_the_flags() -> None:
    from pipeline.io.query.parse import parse_query

    csv_column = parse_query(
        "SELECT k, count(*) FROM t WHERE _c1 = 'x' GROUP BY k, window(timestamp, '1 minute')"
    ).column("_c1")
    with pytest.raises(ExtractorSpecError, match="column _c1 reads csv values but the others"):
        Extractor(parse_key("json:k"), parse_time("kafka-timestamp"), None, (csv_column,))


def test_a_key_of_several_columns_is_the_json_array_of_their_texts() -> None:
    """``GROUP BY user, device``: the key ``["u1","mobile"]``, escaped so that no two tuples
    share a key; a record without one of the columns has no key."""
    from pipeline.io.query.parse import parse_query
    from pipeline.stages.user_topic import topic_extractor

    query = (
        "SELECT user, device, key, count(*) FROM t GROUP BY user, device, key, "
        "window(timestamp_millis(ts), '1 minute')"
    )
    assert [c.name for c in parse_query(query).columns] == ["user", "device", "key"]
    compound = topic_extractor("json:user", "json:ts:ms", None, query)
    values = [
        b'{"user": "u1", "device": "mobile", "ts": 1}',
        b'{"user": "a\\",\\"b", "device": "c", "ts": 2}',
        b'{"user": "a", "device": "\\",\\"b\\nc", "ts": 3}',
        b'{"user": "u2", "ts": 4}',
        b'{"user": 7, "device": 8, "ts": 5}',
    ]
    out = compound.extract(values, [b"k", b"k", b"k", b"k", b"k"], None)
    assert out.keys.to_list() == [
        b'["u1","mobile","k"]',
        b'["a\\",\\"b","c","k"]',
        b'["a","\\",\\"b\\u000ac","k"]',
        b"",
        b'["7","8","k"]',
    ]
    assert [json.loads(k) for k in out.keys.to_list() if k][1:3] == [
        ['a","b', "c", "k"],
        ["a", '","b\nc', "k"],
    ]
    assert out.reasons.tolist() == [-1, -1, -1, NO_KEY, -1]
    assert compound.detail(NO_KEY) == (
        "json:user, json:device, kafka-key: a grouping column has no string or integer value"
    )

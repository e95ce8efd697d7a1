"""The pure parts of the worker's state handling: key names, latency histogram, the apply
script's arguments, a task's decoding, result records (no Redis, Kafka or Spark here)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.aggregates import StateField
from operators.keys import KeyBatch
from operators.metrics import bucket_upper_ms, latency_buckets, latency_quantile
from pipeline.io import records
from pipeline.io.redis_layout import RunKeys
from pipeline.io.state_store import WorkerBatch, key_bytes, key_text
from pipeline.stages.aggregator import result_records
from pipeline.stages.worker_job import (
    WorkerJobError,
    WorkOptions,
    checkpoint_is_fresh,
    default_tasks,
)
from pipeline.stages.worker_task import (
    RunFields,
    decode_partition,
    service_finish_ms,
    to_worker_batch,
)


def test_run_keys_spell_the_contract() -> None:
    keys = RunKeys("r7")
    assert keys.prefix == "skewer:r7:"
    assert keys.truth(20_000) == "skewer:r7:truth:20000"
    assert keys.producer_sent(2) == "skewer:r7:producer:2:sent"
    assert keys.state(1, -10_000) == "skewer:r7:state:1:-10000"
    assert keys.applied(4) == "skewer:r7:applied:4"
    assert keys.wm(0) == "skewer:r7:wm:0"
    assert keys.wm_sources(0) == "skewer:r7:wm:0:sources"
    assert keys.result(0) == "skewer:r7:result:0"
    assert keys.topk(0) == "skewer:r7:topk:0"
    assert keys.windows_final == "skewer:r7:windows:final"
    assert keys.stats("records") == "skewer:r7:stats:records"
    assert keys.latency(3) == "skewer:r7:stats:latency:3"
    for bad in ("", "a:b", "x*", "with space"):
        with pytest.raises(ValueError):
            RunKeys(bad)


def test_latency_buckets_by_hand() -> None:
    # Bucket b > 0 holds (10^((b-1)/20), 10^(b/20)] ms; 10^(1/20) = 1.12202, so 1.1220 is in
    # bucket 1 and 1.1221 in bucket 2.
    latencies = np.array([-5.0, 0.0, 1.0, 1.0001, 1.122, 1.1221, 10.0, 100.0, 1000.0, 1001.0])
    assert latency_buckets(latencies).tolist() == [0, 0, 0, 1, 1, 2, 20, 40, 60, 61]
    assert bucket_upper_ms(0) == 1.0
    assert bucket_upper_ms(40) == pytest.approx(100.0)


@given(st.lists(st.floats(0.001, 1e6), min_size=1, max_size=50))
def test_every_latency_lies_in_its_bucket(latencies: list[float]) -> None:
    for latency, bucket in zip(
        latencies, latency_buckets(np.array(latencies)).tolist(), strict=True
    ):
        upper = bucket_upper_ms(bucket)
        lower = 0.0 if bucket == 0 else bucket_upper_ms(bucket - 1)
        assert lower * (1 - 1e-9) <= latency <= upper * (1 + 1e-9) or (bucket == 0 and latency <= 1)


def test_latency_quantile_by_hand() -> None:
    histogram = {0: 50, 20: 49, 40: 1}  # 100 records: 50 <= 1 ms, 49 in (8.9, 10], 1 in (89, 100]
    assert latency_quantile(histogram, 0.5) == 1.0
    assert latency_quantile(histogram, 0.51) == 10.0
    assert latency_quantile(histogram, 0.99) == 10.0
    assert latency_quantile(histogram, 1.0) == 100.0
    assert latency_quantile({}, 0.5) is None
    with pytest.raises(ValueError):
        latency_quantile(histogram, 0)


@given(st.lists(st.integers(0, 80), min_size=1, max_size=200), st.floats(0.01, 1.0))
def test_latency_quantile_matches_sorted_samples(buckets: list[int], q: float) -> None:
    # Reference: the ceil(q n)-th smallest sample's bucket edge.
    histogram: dict[int, int] = {}
    for bucket in buckets:
        histogram[bucket] = histogram.get(bucket, 0) + 1
    rank = math.ceil(q * len(buckets))
    expected = round(bucket_upper_ms(sorted(buckets)[rank - 1]), 3)
    assert latency_quantile(histogram, q) == expected


def test_script_args_layout() -> None:
    batch = WorkerBatch(
        worker=3,
        batch_id=12,
        windows=np.array([0, 10_000]),
        keys=KeyBatch.from_strings(["a", "b"]),
        counts=np.array([4, 1]),
        source_watermarks={1: 9_999, 0: 5},
        records=5,
        rejected=2,
        latency={7: 3, 2: 2},
        source_versions={1: 4},
    )
    assert batch.script_args("skewer:r:", n_sources=2) == [
        "skewer:r:", 3, 12, 12, 2,
        "", 2, 0, b"a", 4, 10_000, b"b", 1,
        2, 0, 5, 1, 9_999,
        5, 2,
        2, 2, 2, 7, 3,
        1, 1, 4,
        "0.0",
    ]  # fmt: skip
    # Two declared fields: each pair carries a value of each, '' where it has none (NULL).
    fields = (StateField("sum(ms)", "sum", "ms"), StateField("min(ms)", "min", "ms"))
    kept = dataclasses.replace(
        batch,
        fields=fields,
        values=(np.array([-3, 2**62]), np.array([-(2**63), 0])),
        present=(np.array([True, True]), np.array([True, False])),
    )
    assert kept.script_args("skewer:r:", n_sources=2)[5:17] == [
        '[["sum(ms)","sum"],["min(ms)","min"]]', 2,
        0, b"a", 4, -3, -2**63,
        10_000, b"b", 1, 2**62, "",
    ]  # fmt: skip


def test_key_text_examples() -> None:
    assert key_text(b"caf\xc3\xa9") == "café"
    assert key_bytes(key_text(b"\xff\x00a")) == b"\xff\x00a"
    assert json.loads(json.dumps(key_text(b"\xfe"))) == key_text(b"\xfe")


@given(st.binary(max_size=20))
def test_key_text_round_trips_through_json(key: bytes) -> None:
    assert key_bytes(json.loads(json.dumps(key_text(key)))) == key


def _inputs(event_times: list[int]) -> np.ndarray:
    rows = np.zeros(len(event_times), dtype=records.INPUT_DTYPE)
    rows["magic"], rows["version"] = records.MAGIC, records.VERSION
    rows["event_time_ms"] = event_times
    rows["seq"] = np.arange(len(event_times))
    return rows


def test_decode_partition_sorts_rows() -> None:
    values = records.encode_work(_inputs([1, 2, 3]), source=0, table_version=0)
    values += [
        records.encode_marker(records.Kind.WATERMARK, source=1, time_ms=50),
        records.encode_marker(records.Kind.TABLE_SWITCH, source=0, table_version=2),
        b"not a record",
        None,
    ]
    keys = [b"k", None, b"k", None, None, b"x", b"y"]
    decoded = decode_partition(keys, values)
    assert decoded.data.tolist() == [True, False, True, False, False, False, False]
    assert decoded.markers.tolist() == [False, False, False, True, False, False, False]
    # DATA without a key, the junk value and the missing value.
    assert decoded.rejected == 3
    assert decoded.data_records == 2


def test_worker_batch_by_hand() -> None:
    event_times = [100, 9_999, 10_000, 150, 25_000]
    keys: list[bytes | None] = [b"a", b"a", b"a", b"b", b"a"]
    values = records.encode_work(_inputs(event_times), source=0, table_version=0)
    values += [
        records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=9_999),
        records.encode_marker(records.Kind.WATERMARK, source=1, time_ms=4_000),
        records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=19_999),
    ]
    keys += [None, None, None]
    timestamps = np.array([1_000, 1_000, 995, 990, 900, 0, 0, 0])
    decoded = decode_partition(keys, values)
    batch = to_worker_batch(
        decoded, timestamps, worker=1, batch_id=4, now_ms=1_010, window_ms=10_000,
        n_sources=2,
    )  # fmt: skip
    triples = sorted(
        zip(batch.windows.tolist(), batch.keys.to_list(), batch.counts.tolist(), strict=True)
    )
    assert triples == [(0, b"a", 2), (0, b"b", 1), (10_000, b"a", 1), (20_000, b"a", 1)]
    assert dict(batch.source_watermarks) == {0: 19_999, 1: 4_000}
    assert (batch.worker, batch.batch_id, batch.records, batch.rejected) == (1, 4, 5, 0)
    # Latencies 10, 10, 15, 20, 110 ms -> buckets 20, 20, 24, 27, 41.
    assert dict(batch.latency) == {20: 2, 24: 1, 27: 1, 41: 1}


def test_a_sum_runs_amounts_come_from_the_users_value_after_the_header() -> None:
    """A run with --sum: each DATA record's amount is read from the user's bytes after the
    36-byte header, summed per (window, key); a record without one is rejected, not summed."""
    from pipeline.io.extractors import Extractor, parse_amount, parse_key, parse_time

    extractor = Extractor(parse_key("json:u"), parse_time("json:t"), parse_amount("json:bytes"))
    fields = RunFields((StateField("sums", "sum", None),), extractor)
    user_values = [b'{"u": "a", "t": 5, "bytes": 1.5}', b'{"u": "a", "t": 6, "bytes": 2}',
                   b'{"u": "b", "t": 7, "bytes": 0.000001}', b'{"u": "b", "t": 8}']  # fmt: skip
    headers = records.work_headers(
        np.array([5, 6, 7, 8]), partition=0, offsets=np.arange(4), source=0, table_version=0
    )
    values = [h + v for h, v in zip(headers, user_values, strict=True)]
    values.append(records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=3))
    keys = [b"a", b"a", b"b", b"b", None]
    for column in (values, pa.array(values, pa.binary())):
        decoded = decode_partition(keys, column, fields)
        assert decoded.data.tolist() == [True, True, True, False, False]
        assert decoded.rejected == 1
        batch = to_worker_batch(
            decoded, np.zeros(5), worker=0, batch_id=0, now_ms=0, window_ms=10, n_sources=1,
            fields=fields,
        )  # fmt: skip
        [sums] = batch.values
        got = zip(batch.keys.to_list(), batch.counts.tolist(), sums.tolist(), strict=True)
        assert sorted(got) == [(b"a", 2, 3_500_000), (b"b", 1, 1)]
    assert not to_worker_batch(
        decode_partition(keys, values), np.zeros(5), worker=0, batch_id=0, now_ms=0,
        window_ms=10, n_sources=1,
    ).fields  # fmt: skip


def test_a_querys_fields_skip_nulls_and_keep_a_count_sum_least_and_greatest() -> None:
    """A query's avg and max of ``ms``: per (window, key), the count of records with a number
    in ``ms``, their sum and their greatest; a record without one (missing, JSON null, a text)
    is counted by count(*) but by none of the fields, and a key with no number has no sum and
    no greatest (NULL), not 0."""
    from pipeline.io.query.parse import parse_query
    from pipeline.stages.user_topic import topic_extractor

    query = (
        "SELECT u, count(*), avg(ms), max(ms) FROM t "
        "GROUP BY u, window(timestamp_millis(t), '10 milliseconds')"
    )
    extractor = topic_extractor("json:u", "json:t:ms", None, query)
    fields = RunFields(parse_query(query).state_fields, extractor)
    assert [f.name for f in fields.fields] == ["count(ms)", "sum(ms)", "max(ms)"]
    user_values = [b'{"u": "a", "t": 5, "ms": 1.5}', b'{"u": "a", "t": 6, "ms": -2}',
                   b'{"u": "a", "t": 6}', b'{"u": "b", "t": 7, "ms": null}',
                   b'{"u": "b", "t": 8, "ms": "fast"}']  # fmt: skip
    headers = records.work_headers(
        np.array([5, 6, 6, 7, 8]), partition=0, offsets=np.arange(5), source=0, table_version=0
    )
    values = [h + v for h, v in zip(headers, user_values, strict=True)]
    decoded = decode_partition([b"a", b"a", b"a", b"b", b"b"], values, fields)
    assert decoded.rejected == 0 and decoded.data.all()
    batch = to_worker_batch(
        decoded, np.zeros(5), worker=0, batch_id=0, now_ms=0, window_ms=10, n_sources=1,
        fields=fields,
    )  # fmt: skip
    assert batch.keys.to_list() == [b"a", b"b"] and batch.counts.tolist() == [3, 2]
    shown = [
        [v if p else None for v, p in zip(values.tolist(), present.tolist(), strict=True)]
        for values, present in zip(batch.values, batch.present, strict=True)
    ]
    assert shown == [[2, 0], [-500_000, None], [1_500_000, None]]


def test_watermark_of_an_unknown_source_fails_loudly() -> None:
    values = [records.encode_marker(records.Kind.WATERMARK, source=2, time_ms=1)]
    decoded = decode_partition([None], values)
    with pytest.raises(WorkerJobError, match=r"source 2\b.*2 source"):
        to_worker_batch(
            decoded, np.zeros(1), worker=0, batch_id=0, now_ms=0, window_ms=10,
            n_sources=2,
        )  # fmt: skip


def test_work_options_validation(tmp_path) -> None:
    base = dict(
        sources=1, kafka_bootstrap="h:1", redis_url="redis://h", checkpoint=tmp_path,
        work_topic="work",
    )  # fmt: skip
    WorkOptions(workers=1, **base).validate()
    for bad in (
        dict(workers=0),
        dict(workers=2, window_ms=0),
        dict(workers=2, cpu_cost_us=-1),
        dict(workers=2, max_records_per_batch=0),
        dict(workers=2, spark_master="spark://no-port"),
        dict(workers=2, fetch_max_wait_ms=-1),
        dict(workers=2, max_poll_records=0),
    ):
        with pytest.raises(WorkerJobError):
            WorkOptions(**bad, **base).validate()  # type: ignore[arg-type]


def test_a_cluster_runs_a_task_per_worker_and_local_mode_one_per_core(tmp_path) -> None:
    base = dict(
        sources=1, kafka_bootstrap="h:1", redis_url="redis://h", checkpoint=tmp_path,
        work_topic="work",
    )  # fmt: skip
    local = WorkOptions(workers=64, **base)  # type: ignore[arg-type]
    assert local.task_count == default_tasks(64) <= (os.cpu_count() or 1)
    cluster = WorkOptions(workers=64, spark_master="spark://m:7077", **base)  # type: ignore[arg-type]
    assert cluster.task_count == 64
    assert WorkOptions(workers=64, tasks=4, spark_master="yarn", **base).task_count == 4  # type: ignore[arg-type]


def test_checkpoint_is_fresh(tmp_path) -> None:
    assert checkpoint_is_fresh(tmp_path / "missing")
    (tmp_path / "offsets").mkdir()
    assert checkpoint_is_fresh(tmp_path)
    (tmp_path / "offsets" / "0").write_text("v1")
    assert not checkpoint_is_fresh(tmp_path)


def test_result_records_split_and_content() -> None:
    counts = {b"b": 2, b"a": 5, b"c": 1}
    out = result_records("r", 20_000, 10_000, counts, [(b"a", 5)], keys_per_record=2)
    assert [key for key, _ in out] == [b"20000", b"20000"]
    values = [json.loads(value) for _, value in out]
    assert values[0] == {
        "run_id": "r",
        "window": 20_000,
        "window_end": 30_000,
        "records": 8,
        "distinct_keys": 3,
        "top_k": [["a", 5]],
        "counts": {"a": 5, "b": 2},
        "part": 0,
        "parts": 2,
    }
    assert values[1]["counts"] == {"c": 1} and values[1]["part"] == 1
    single = result_records("r", 0, 10, {}, [])
    assert len(single) == 1 and json.loads(single[0][1])["counts"] == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["work", "--workers", "0"], "--workers must be >= 1, got 0"),
        (["work", "--workers", "2", "--sources", "0"], "--sources must be >= 1, got 0"),
        (["work", "--workers", "2", "--window-ms", "0"], "--window-ms must be >= 1, got 0"),
        (["work", "--workers", "2", "--cpu-cost-us", "-1"], "--cpu-cost-us must be >= 0"),
        (["aggregate", "--workers", "0"], "--workers must be >= 1, got 0"),
        (["aggregate", "--workers", "2", "--top-k", "-1"], "--top-k must be >= 0"),
    ],
)
def test_bad_arguments_fail_with_one_line_before_any_service(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from pipeline.cli import app

    # Nothing answers here: a check that reached for a service would fail differently.
    monkeypatch.setenv("SKEWER_KAFKA_BOOTSTRAP", "127.0.0.1:9")
    monkeypatch.setenv("SKEWER_REDIS_URL", "redis://127.0.0.1:9/0")
    assert app.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith(f"skewer {argv[0]}: error:")


def test_failure_reason_finds_the_cause_in_sparks_wrapping() -> None:
    from pipeline.stages.worker_job import failure_reason

    wrapped = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent...\n"
        '  File "/x/worker_job.py", line 135, in to_worker_batch\n'
        "pipeline.stages.worker_job.WorkerJobError: worker 1 got a watermark of source 3, but ...\n"
        "\tat org.apache.spark.api.python.PythonRunner...\n"
    )
    assert failure_reason(Exception(wrapped)) == "worker 1 got a watermark of source 3, but ..."
    other = (
        "[STREAM_FAILED] Query terminated\n  File x\nredis.exceptions.ConnectionError: refused\n"
    )
    assert failure_reason(Exception(other)) == "ConnectionError: refused"
    assert failure_reason(Exception("just this\nand that")) == "just this"
    assert failure_reason(KeyError()) == "KeyError"


def test_service_finish_is_lindleys_recursion() -> None:
    """The closed form equals serving the records one by one from the last finish."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        arrivals = np.sort(rng.uniform(0, 100, size=rng.integers(0, 40)))
        cost, busy = float(rng.uniform(0.1, 5)), float(rng.choice([0.0, rng.uniform(0, 150)]))
        finish = busy
        for arrival in arrivals:
            finish = max(finish, arrival) + cost
        assert service_finish_ms(arrivals, cost, busy) == pytest.approx(finish)

"""The producer against the real broker and Redis: what lands in ``keys`` and in the truth.

200,000 Zipf (z = 1.2) records from S = 3 producers are produced once per module; every check
reads them back and compares with a plain-Python account of the same stream: record i is
producer i mod 3's record i div 3 at event time start + i/4 ms (E = 4,000/s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pipeline.io import kafka_io
from pipeline.io.records import END_OF_STREAM, Kind, decode_input
from pipeline.io.redis_layout import RunKeys
from producers import kafka_producer
from producers.workloads import parse

pytestmark = [pytest.mark.integration, pytest.mark.live_path]

RECORDS = 200_000
SOURCES = 3
WINDOW_MS = 10_000
START_MS = 1_700_000_000_000  # a window boundary
WORKLOAD = f"zipf:z=1.2,keys=50000,n={RECORDS},seed=3"
SKEWER = str(Path(sys.executable).with_name("skewer"))


def run_skewer(kafka: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKEWER_KAFKA_BOOTSTRAP": kafka, "SKEWER_REDIS_URL": redis_url}
    return subprocess.run(
        [SKEWER, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@dataclass
class Produced:
    names: kafka_io.RunNames
    keys: list[bytes]
    result: kafka_producer.ProduceResult
    records: list[kafka_io.StoredRecord]


@pytest.fixture(scope="module")
def produced(kafka: str, redis: object) -> Iterator[Produced]:
    tag = uuid.uuid4().hex[:8]
    names = kafka_io.RunNames(run_id=f"producer-{tag}", topic_prefix=f"test-producer-{tag}-")
    kafka_io.ensure_topic(kafka, names.keys_topic, SOURCES)
    batch = parse(WORKLOAD).keys()
    try:
        result = kafka_producer.produce_stream(
            batch,
            bootstrap=kafka,
            redis_client=redis,  # type: ignore[arg-type]
            names=names,
            sources=SOURCES,
            window_ms=WINDOW_MS,
            start_ms=START_MS,
        )
        stored = kafka_io.read_topic(kafka, names.keys_topic)
        yield Produced(names, batch.to_list(), result, stored)
    finally:
        kafka_io.delete_topics(kafka, [names.keys_topic])
        delete_run_keys(redis, names)


def delete_run_keys(redis: object, names: kafka_io.RunNames) -> None:
    for key in redis.scan_iter(match=RunKeys(names.run_id).pattern):  # type: ignore[attr-defined]
        redis.delete(key)  # type: ignore[attr-defined]


def test_result_counts(produced: Produced) -> None:
    result = produced.result
    assert result.records == RECORDS
    # 200,000 records at 4 per ms span 50 s from a window boundary: five windows
    assert result.windows == [START_MS + k * WINDOW_MS for k in range(5)]
    assert result.sent_per_producer == [66_667, 66_667, 66_666]
    # per producer: one watermark at each of the 4 window changes, and END_OF_STREAM
    assert result.watermarks == SOURCES * 5


def test_each_partition_holds_its_producers_records_in_order(produced: Produced) -> None:
    for p in range(SOURCES):
        part = [r for r in produced.records if r.partition == p]
        decoded, ok = decode_input([r.value for r in part])
        assert ok.all()
        kinds = decoded["kind"]
        data = np.flatnonzero(kinds == Kind.DATA)
        assert decoded["producer"].tolist() == [p] * len(part)
        assert decoded["seq"][data].tolist() == list(range(len(range(p, RECORDS, SOURCES))))
        assert [part[i].key for i in data.tolist()] == produced.keys[p::SOURCES]
        expected_times = START_MS + (np.arange(p, RECORDS, SOURCES) * 1000) // 4000
        assert decoded["event_time_ms"][data].tolist() == expected_times.tolist()


def test_watermarks_promise_what_follows(produced: Produced) -> None:
    for p in range(SOURCES):
        part = [r for r in produced.records if r.partition == p]
        decoded, _ = decode_input([r.value for r in part])
        marks = np.flatnonzero(decoded["kind"] == Kind.WATERMARK).tolist()
        assert len(marks) == 5 and marks[-1] == len(part) - 1
        assert all(part[i].key == b"" for i in marks)
        times = decoded["event_time_ms"]
        assert times[marks].tolist() == [START_MS + k * WINDOW_MS - 1 for k in range(1, 5)] + [
            END_OF_STREAM
        ]
        for i in marks:
            before = times[:i][decoded["kind"][:i] == Kind.DATA]
            after = times[i + 1 :][decoded["kind"][i + 1 :] == Kind.DATA]
            # everything up to the watermark is before it, nothing after it is that old
            assert np.all(after > times[i])
            assert int(decoded["seq"][i]) == before.shape[0]


def test_truth_in_redis_equals_a_plain_count(produced: Produced, redis: object) -> None:
    reference: dict[int, Counter[bytes]] = {}
    for i, key in enumerate(produced.keys):
        window = (START_MS + i * 1000 // 4000) // WINDOW_MS * WINDOW_MS
        reference.setdefault(window, Counter())[key] += 1
    names = produced.names
    pattern = RunKeys(names.run_id).truth("*")
    stored = {
        int(name.decode().rsplit(":", 1)[1]): {
            k: int(v)
            for k, v in redis.hgetall(name).items()  # type: ignore[attr-defined]
        }
        for name in redis.scan_iter(match=pattern)  # type: ignore[attr-defined]
    }
    assert stored == {w: dict(c) for w, c in reference.items()}
    assert sum(sum(c.values()) for c in stored.values()) == RECORDS
    sent = [
        int(redis.get(RunKeys(names.run_id).producer_sent(p)))  # type: ignore[attr-defined]
        for p in range(SOURCES)
    ]
    assert sent == [66_667, 66_667, 66_666]


def test_paced_rate_follows_the_wall_clock(kafka: str, redis: object) -> None:
    tag = uuid.uuid4().hex[:8]
    names = kafka_io.RunNames(run_id=f"paced-{tag}", topic_prefix=f"test-paced-{tag}-")
    kafka_io.ensure_topic(kafka, names.keys_topic, 1)
    try:
        began_ms = time.time() * 1000
        kafka_producer.produce_stream(
            parse("zipf:z=1.2,keys=100,n=1500,seed=1").keys(),
            bootstrap=kafka,
            redis_client=redis,  # type: ignore[arg-type]
            names=names,
            sources=1,
            rate=3_000,
        )
        finished_ms = time.time() * 1000
        stored = kafka_io.read_topic(kafka, names.keys_topic)
    finally:
        kafka_io.delete_topics(kafka, [names.keys_topic])
        delete_run_keys(redis, names)
    decoded, _ = decode_input([r.value for r in stored])
    data_times = decoded["event_time_ms"][decoded["kind"] == Kind.DATA]
    start = int(data_times[0])
    assert -1 < start - began_ms < 1_000  # event time is the wall clock
    # 1,500 records at 3,000/s go in 10 ms chunks of 30, each sent when its first record is
    # due: the last chunk (records 1,470..1,499) at 490 ms after the first record, not before.
    assert finished_ms - start >= 490
    assert (data_times - start).tolist() == [i * 1000 // 3000 for i in range(1500)]


def test_cli_prints_one_json_object(kafka: str, redis: object, redis_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    prefix = f"test-produce-cli-{tag}-"
    try:
        done = run_skewer(
            kafka,
            redis_url,
            "produce",
            "--workload",
            "zipf:z=1.2,keys=1000,seed=2",
            "--records",
            "20000",
            "--sources",
            "2",
            "--window-ms",
            "1000",
            "--start-ms",
            "0",
            "--run-id",
            f"cli-{tag}",
            "--topic-prefix",
            prefix,
            "--json",
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        # 20,000 records at 4 per ms = 5 s = five 1 s windows
        assert summary["records"] == 20_000 and summary["windows"] == 5
        assert summary["sent_per_producer"] == [10_000, 10_000]
        assert summary["workload"] == "zipf:z=1.2,keys=1000,n=20000,seed=2"
        assert kafka_io.topic_partitions(kafka, f"{prefix}keys") == 2
        # a second run with another partition count is refused: the count is the routing
        again = run_skewer(
            kafka, redis_url, "produce", "--records", "10", "--sources", "3",
            "--topic-prefix", prefix,
        )  # fmt: skip
        assert again.returncode == 2
        assert "has 2 partitions, but this run needs 3" in again.stderr
    finally:
        run = kafka_io.RunNames(f"cli-{tag}", prefix)
        kafka_io.delete_topics(
            kafka, [run.keys_topic, run.work_topic, run.results_topic, run.dead_letters_topic]
        )
        delete_run_keys(redis, run)


def test_a_gated_producer_sends_nothing_before_its_go(
    kafka: str, redis: object, redis_url: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    run = kafka_io.RunNames(f"gated-{tag}", f"test-produce-gated-{tag}-")
    env = {**os.environ, "SKEWER_KAFKA_BOOTSTRAP": kafka, "SKEWER_REDIS_URL": redis_url}
    command = [SKEWER, "produce", "--records", "2000", "--rate", "20000", "--gated"]
    command += ["--run-id", run.run_id, "--topic-prefix", run.topic_prefix, "--json"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # Started up (its stream planned: the truth written), then held: no record sent.
        truth = RunKeys(run.run_id).truth("*")
        deadline = time.monotonic() + 60
        while not list(redis.scan_iter(match=truth)):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        time.sleep(2.0)
        assert process.poll() is None
        assert kafka_io.read_topic(kafka, run.keys_topic) == []
        kafka_producer.open_gate(redis, run.run_id)  # type: ignore[arg-type]
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert json.loads(out)["records"] == 2000
        data = [r for r in kafka_io.read_topic(kafka, run.keys_topic) if r.key]
        assert len(data) == 2000
    finally:
        process.kill()
        process.wait()
        kafka_io.delete_topics(kafka, [run.keys_topic, run.work_topic, run.results_topic])
        delete_run_keys(redis, run)


def test_a_producer_without_a_go_gives_up_with_one_line(redis: object) -> None:
    run = kafka_io.RunNames(f"no-go-{uuid.uuid4().hex[:8]}")
    with pytest.raises(RuntimeError, match=r"gave no go within 0 s"):
        kafka_producer.wait_for_go(redis, run, timeout=0.05)  # type: ignore[arg-type]


def test_cli_errors_are_one_line(kafka: str, redis: object, redis_url: str) -> None:
    url = redis_url
    unreachable = run_skewer("127.0.0.1:1", url, "produce", "--records", "10")
    assert unreachable.returncode == 1
    assert unreachable.stderr.strip().splitlines() == [
        "skewer produce: error: kafka does not answer at 127.0.0.1:1 (start it: skewer services up)"
    ]
    bad = run_skewer(kafka, url, "produce", "--records", "10", "--workload", "zipf:z=-1")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "skewer produce: error: zipf: z must be >= 0, got -1.0"
    zero = run_skewer(kafka, url, "produce", "--records", "0")
    assert zero.returncode == 2 and "--records must be >= 1" in zero.stderr

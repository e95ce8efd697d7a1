"""The grouping stage against the real broker and Redis.

- routing: every record lands in the partition the simulator's Router gives it (key, pkg);
- watermark markers keep their promise in every partition;
- exactly once across ``kill -9`` of ``skewer group`` mid-run and a restart;
- bad input goes to ``dead-letters`` with its reason and is counted; valid records still flow;
- one source per process (``--source``); malformed configuration fails with one line.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from operators.simulator import Router
from pipeline.io import kafka_io
from pipeline.io.records import END_OF_STREAM, MAX_KEY_BYTES, Kind, decode_work, encode_input
from pipeline.io.redis_layout import RunKeys
from pipeline.services import process
from pipeline.stages import grouping
from producers import kafka_producer
from producers.workloads import parse

pytestmark = [pytest.mark.integration, pytest.mark.live_path]

SKEWER = str(Path(sys.executable).with_name("skewer"))
WINDOW_MS = 10_000


def skewer_env(kafka: str, redis_url: str) -> dict[str, str]:
    return {**os.environ, "SKEWER_KAFKA_BOOTSTRAP": kafka, "SKEWER_REDIS_URL": redis_url}


@pytest.fixture
def run_names(kafka: str, redis: object) -> Iterator[kafka_io.RunNames]:
    """A fresh run: its topics and Redis keys are deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = kafka_io.RunNames(run_id=f"stage-{tag}", topic_prefix=f"test-stage-{tag}-")
    yield names
    for key in redis.scan_iter(match=RunKeys(names.run_id).pattern):  # type: ignore[attr-defined]
        redis.delete(key)  # type: ignore[attr-defined]
    kafka_io.delete_topics(
        kafka, [names.keys_topic, names.work_topic, names.dead_letters_topic, names.results_topic]
    )


def stage_config(
    kafka: str, redis_url: str, names: kafka_io.RunNames, scheme: str, workers: int, sources: int,
    batch_size: int = 1_000,
) -> grouping.StageConfig:  # fmt: skip
    return grouping.StageConfig(
        bootstrap=kafka,
        redis_url=redis_url,
        names=names,
        scheme=scheme,
        n_workers=workers,
        n_sources=sources,
        batch_size=batch_size,
        until_end=True,
    )


def produce(kafka: str, redis: object, names: kafka_io.RunNames, spec: str, sources: int):
    kafka_io.ensure_topic(
        kafka,
        names.keys_topic,
        sources,
        {"max.message.bytes": str(kafka_io.LARGE_MESSAGE_BYTES)},
    )
    keys = parse(spec).keys()
    kafka_producer.produce_stream(
        keys,
        bootstrap=kafka,
        redis_client=redis,  # type: ignore[arg-type]
        names=names,
        sources=sources,
        window_ms=WINDOW_MS,
        start_ms=0,
    )
    return keys


def read_work(kafka: str, names: kafka_io.RunNames, read_committed: bool = True):
    stored = kafka_io.read_topic(kafka, names.work_topic, read_committed=read_committed)
    decoded, ok = decode_work([r.value for r in stored])
    assert ok.all()
    return stored, decoded


def assert_markers_keep_their_promise(
    stored: list[kafka_io.StoredRecord], decoded: np.ndarray, workers: int, sources: int
) -> None:
    """Per partition and source: markers rise, end at END_OF_STREAM, and every DATA record of
    the source with event time <= a marker's is before it."""
    partitions = np.array([r.partition for r in stored])
    for w in range(workers):
        rows = decoded[partitions == w]
        for s in range(sources):
            mine = rows["source"] == s
            kinds = rows["kind"][mine]
            times = rows["event_time_ms"][mine]
            marks = np.flatnonzero(kinds == Kind.WATERMARK)
            assert marks.shape[0] >= 1 and marks[-1] == kinds.shape[0] - 1
            assert np.all(np.diff(times[marks]) > 0), "a marker went back or repeated"
            assert times[marks[-1]] == END_OF_STREAM
            for m in marks.tolist():
                later = times[m + 1 :][kinds[m + 1 :] == Kind.DATA]
                assert np.all(later > times[m])


@pytest.mark.parametrize("scheme", ["key", "pkg"])
def test_routing_equals_the_simulator(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames, scheme: str
) -> None:
    workers, sources, records = 5, 2, 30_000
    keys = produce(kafka, redis, run_names, f"zipf:z=1.2,keys=2000,n={records},seed=5", sources)
    config = stage_config(kafka, redis_url, run_names, scheme, workers, sources, batch_size=777)
    grouping.prepare(config)
    summaries = [grouping.run_source(config, s) for s in range(sources)]
    assert [s.data for s in summaries] == [15_000, 15_000]
    assert all(s.ended for s in summaries)

    stored, decoded = read_work(kafka, run_names)
    is_data = decoded["kind"] == Kind.DATA
    producer = decoded["producer"][is_data].astype(np.int64)
    seq = decoded["seq"][is_data].astype(np.int64)
    partition = np.array([r.partition for r in stored])[is_data]
    index = seq * sources + producer  # the stream position of each record
    assert np.array_equal(np.sort(index), np.arange(records))  # each exactly once
    expected = Router(scheme, workers, sources).route(keys)
    assert np.array_equal(partition, expected[index])
    assert np.array_equal(decoded["source"][is_data], producer)  # source s reads producer s
    data_keys = [r.key for r, d in zip(stored, is_data.tolist(), strict=True) if d]
    assert data_keys == [keys[int(i)] for i in index]
    assert_markers_keep_their_promise(stored, decoded, workers, sources)


def test_kill_9_mid_run_then_restart_is_exactly_once(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames
) -> None:
    workers, sources, records = 4, 2, 200_000
    produce(kafka, redis, run_names, f"zipf:z=1.2,keys=20000,n={records},seed=9", sources)
    url = redis_url
    command = [
        SKEWER, "group", "--scheme", "pkg", "--workers", str(workers),
        "--sources", str(sources), "--until-end", "--batch-size", "2000",
        "--run-id", run_names.run_id, "--topic-prefix", run_names.topic_prefix,
    ]  # fmt: skip
    env = skewer_env(kafka, url)
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stats = [RunKeys(run_names.run_id).source_stats(s) for s in range(sources)]

    def counted() -> int:
        return sum(int(redis.hget(k, "records") or 0) for k in stats)  # type: ignore[attr-defined]

    deadline = time.monotonic() + 60
    while counted() < records // 4:
        assert first.poll() is None, first.stderr.read().decode()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the stage made no progress"
        time.sleep(0.02)
    children = process.child_pids(first.pid)
    assert len(children) >= sources  # one process per source (+ multiprocessing's helper)
    # A batch's Redis counters are written just before its commit: a few ms later the batch
    # is usually on the broker, uncommitted, so the restart has a transaction to abort.
    time.sleep(0.008)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    at_kill = counted()
    assert at_kill < records, "killed too late: the run had finished"
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{c}").exists() for c in children):  # PR_SET_PDEATHSIG
        assert time.monotonic() < deadline, "source processes outlived kill -9 of the parent"
        time.sleep(0.05)

    second = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["ended"] is True

    aborted = assert_grouped_exactly_once(kafka, redis, run_names, records, workers, sources)
    print(f"killed at {at_kill} counted; {aborted} aborted DATA records skipped downstream")


def assert_grouped_exactly_once(
    kafka: str, redis: object, names: kafka_io.RunNames, records: int, workers: int, sources: int
) -> int:
    """Every record of a stage's input in ``work`` once, the markers sound, the stage's counters
    exact; returns how many DATA records aborted transactions left (read_committed skips them)."""
    stored, decoded = read_work(kafka, names)
    is_data = decoded["kind"] == Kind.DATA
    index = decoded["seq"][is_data].astype(np.int64) * sources + decoded["producer"][is_data]
    counts = Counter(index.tolist())
    assert len(counts) == records and set(counts.values()) == {1}  # no loss, no duplicate
    assert set(counts) == set(range(records))
    assert_markers_keep_their_promise(stored, decoded, workers, sources)
    # the counters are exact too: each input record counted once across the crash
    stats = [RunKeys(names.run_id).source_stats(s) for s in range(sources)]
    per_source = [int(redis.hget(k, "records")) for k in stats]  # type: ignore[attr-defined]
    assert per_source == [records // sources + 5] * sources  # DATA + 4 window marks + EOS
    routed = redis.hgetall(RunKeys(names.run_id).stats("routed"))  # type: ignore[attr-defined]
    assert sum(int(v) for v in routed.values()) == records
    uncommitted = kafka_io.read_topic(kafka, names.work_topic, read_committed=False)
    raw, _ = decode_work([r.value for r in uncommitted])
    return int(np.sum(raw["kind"] == Kind.DATA)) - records


def test_a_killed_source_is_started_again_by_its_stage(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames
) -> None:
    """kill -9 of one source process, not of the stage: the stage starts that source again,
    which fences its open transaction and resumes at its committed offset, while the other
    source goes on. The stage ends normally and every record is grouped once."""
    workers, sources, records = 4, 2, 200_000
    produce(kafka, redis, run_names, f"zipf:z=1.2,keys=20000,n={records},seed=9", sources)
    command = [
        SKEWER, "group", "--scheme", "pkg", "--workers", str(workers),
        "--sources", str(sources), "--until-end", "--batch-size", "2000", "--json",
        "--run-id", run_names.run_id, "--topic-prefix", run_names.topic_prefix,
    ]  # fmt: skip
    stage = subprocess.Popen(
        command,
        env=skewer_env(kafka, redis_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stats = RunKeys(run_names.run_id).source_stats(1)
    deadline = time.monotonic() + 60
    while int(redis.hget(stats, "records") or 0) < records // sources // 4:  # type: ignore[attr-defined]
        assert stage.poll() is None, stage.stderr.read()  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the stage made no progress"
        time.sleep(0.02)
    time.sleep(0.008)  # most likely mid-transaction (see the test above)
    sources_now = [
        pid
        for pid in process.child_pids(stage.pid)
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    # Source 0 may already have ended if source 1 started late; the one left is then source 1.
    assert sources_now, "no source was running"
    os.kill(sources_now[-1], signal.SIGKILL)  # whichever source it runs

    out, err = stage.communicate(timeout=120)
    assert stage.returncode == 0, err
    assert json.loads(out)["source_restarts"] == 1
    assert "ended with code -9; starting it again" in err
    assert re.search(r"source [01] \(restart 1\) resumed at offset \d+ in [\d.]+ s: ", err), err
    assert_grouped_exactly_once(kafka, redis, run_names, records, workers, sources)


def test_bad_input_goes_to_dead_letters_and_valid_records_flow(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames
) -> None:
    from confluent_kafka import Producer

    config = stage_config(kafka, redis_url, run_names, "pkg", workers=3, sources=1)
    grouping.prepare(config)

    def value(kind: int, time_ms: int, seq: int) -> bytes:
        return encode_input(np.array([time_ms]), np.array([0]), np.array([seq]), Kind(kind))[0]

    huge = b"h" * (MAX_KEY_BYTES + 1)
    edge = b"e" * MAX_KEY_BYTES
    switch = value(Kind.TABLE_SWITCH, 5, 0)
    unknown_kind = bytearray(value(Kind.DATA, 5, 0))
    unknown_kind[3] = 9
    bad = [  # (key, value, reason)
        (None, value(Kind.DATA, 5, 100), "no-key"),
        (b"", value(Kind.DATA, 5, 101), "no-key"),
        (huge, value(Kind.DATA, 5, 102), "key-too-large"),
        (b"k1", b"not a record", "undecodable-value"),
        (b"k2", None, "undecodable-value"),
        (b"k3", b"XX" + value(Kind.DATA, 5, 0)[2:], "undecodable-value"),
        (b"k4", switch, "wrong-kind"),
        (b"k5", bytes(unknown_kind), "wrong-kind"),
    ]
    good = [(f"g{i % 7}".encode(), value(Kind.DATA, 5 + i, i)) for i in range(40)]
    good.append((edge, value(Kind.DATA, 100, 40)))  # exactly MAX_KEY_BYTES is fine
    stream: list[tuple[bytes | None, bytes | None]] = []
    for i, record in enumerate(good):
        stream.append(record)
        if i % 5 == 0 and i // 5 < len(bad):
            stream.append(bad[i // 5][:2])
    stream.append((b"", value(Kind.WATERMARK, int(END_OF_STREAM), 41)))
    producer = Producer(kafka_io.producer_config(kafka))
    for key, val in stream:
        producer.produce(run_names.keys_topic, value=val, key=key, partition=0)
    assert producer.flush(30) == 0

    summary = grouping.run_source(config, 0)
    assert summary.ended and summary.data == len(good)
    assert summary.dead_letters == {
        "no-key": 2, "key-too-large": 1, "undecodable-value": 3, "wrong-kind": 2,
        "bad-time": 0, "bad-amount": 0,  # a user topic's reasons
    }  # fmt: skip

    stored, decoded = read_work(kafka, run_names)
    data = decoded["kind"] == Kind.DATA
    # each valid record arrives once, with its own key (seq i was good record i)
    data_rows = [r for r, d in zip(stored, data.tolist(), strict=True) if d]
    assert sorted(decoded["seq"][data].tolist()) == list(range(len(good)))
    assert all(
        row.key == good[int(seq)][0]
        for row, seq in zip(data_rows, decoded["seq"][data].tolist(), strict=True)
    )

    letters = kafka_io.read_topic(kafka, run_names.dead_letters_topic)
    assert len(letters) == len(bad)
    offsets = {
        i: o for o, (k, v) in enumerate(stream) for i, b in enumerate(bad) if b[:2] == (k, v)
    }
    for i, (letter, (key, original, reason)) in enumerate(zip(letters, bad, strict=True)):
        body = json.loads(letter.value)  # type: ignore[arg-type]
        assert body["reason"] == reason
        assert body["topic"] == run_names.keys_topic and body["partition"] == 0
        assert body["offset"] == offsets[i]
        assert letter.key == key or (key is None and letter.key is None)
        restored = base64.b64decode(body["value_b64"]) if body["value_b64"] is not None else None
        assert restored == original
    counters = redis.hgetall(RunKeys(run_names.run_id).stats("dead_letters"))  # type: ignore[attr-defined]
    assert {k.decode(): int(v) for k, v in counters.items()} == {
        "no-key": 2, "key-too-large": 1, "undecodable-value": 3, "wrong-kind": 2,
    }  # fmt: skip


def test_a_batch_the_broker_refuses_stops_the_source_without_loss(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    # a work topic made elsewhere, with the broker's default 1 MiB limit: a valid key of
    # MAX_KEY_BYTES cannot be written to it
    kafka_io.ensure_topic(kafka, run_names.work_topic, 2)
    config = stage_config(kafka, redis_url, run_names, "key", workers=2, sources=1)
    grouping.prepare(config)
    producer = Producer(kafka_io.producer_config(kafka))
    value = encode_input(np.array([1]), np.array([0]), np.array([0]))[0]
    producer.produce(run_names.keys_topic, value=value, key=b"x" * MAX_KEY_BYTES, partition=0)
    assert producer.flush(30) == 0
    with pytest.raises(grouping.StageError, match="batch at offset 0 failed 3 times"):
        grouping.run_source(config, 0)
    consumer = Consumer(kafka_io.consumer_config(kafka, run_names.consumer_group(0)))
    try:
        committed = consumer.committed([TopicPartition(run_names.keys_topic, 0)], timeout=30)
    finally:
        consumer.close()
    assert committed[0].offset < 0  # nothing committed: a fixed topic replays the record
    # nothing of the batch is visible, only the source's announcement at start (a marker each)
    visible = kafka_io.read_topic(kafka, run_names.work_topic)
    decoded, ok = decode_work([record.value for record in visible])
    assert len(visible) == 2 and ok.all() and (decoded["kind"] == Kind.TABLE_SWITCH).all()


def test_one_process_per_source(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames
) -> None:
    workers, sources, records = 3, 2, 20_000
    keys = produce(kafka, redis, run_names, f"zipf:z=1.2,keys=500,n={records},seed=4", sources)
    env = skewer_env(kafka, redis_url)
    base = [
        SKEWER, "group", "--scheme", "key", "--workers", str(workers), "--sources", str(sources),
        "--until-end", "--json", "--run-id", run_names.run_id,
        "--topic-prefix", run_names.topic_prefix,
    ]  # fmt: skip
    env_scheme = {**env, "GROUPING_SCHEME": "shuffle"}  # --scheme wins over the variable
    running = [
        subprocess.Popen([*base, "--source", str(s)], env=env_scheme, stdout=subprocess.PIPE)
        for s in range(sources)
    ]
    outputs = [json.loads(p.communicate(timeout=120)[0]) for p in running]
    assert [p.returncode for p in running] == [0, 0]
    assert [o["sources"] for o in outputs] == [[0], [1]]
    assert [o["scheme"] for o in outputs] == ["key", "key"]
    assert sum(o["data"] for o in outputs) == records

    stored, decoded = read_work(kafka, run_names)
    is_data = decoded["kind"] == Kind.DATA
    index = decoded["seq"][is_data].astype(np.int64) * sources + decoded["producer"][is_data]
    assert np.array_equal(np.sort(index), np.arange(records))
    partition = np.array([r.partition for r in stored])[is_data]
    assert np.array_equal(partition, Router("key", workers, sources).route(keys)[index])


def test_malformed_configuration_fails_at_start_with_one_line(
    kafka: str, redis: object, redis_url: str, run_names: kafka_io.RunNames
) -> None:
    env = skewer_env(kafka, redis_url)
    names = ["--run-id", run_names.run_id, "--topic-prefix", run_names.topic_prefix]

    def group(*args: str, environment: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SKEWER, "group", *args, *names],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    unknown = group("--workers", "4", environment={**env, "GROUPING_SCHEME": "nope"})
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("skewer group: error: unknown scheme 'nope'; valid schemes:")
    assert len(unknown.stderr.strip().splitlines()) == 1
    zero = group("--workers", "0", "--scheme", "pkg")
    assert (zero.returncode, zero.stderr.strip()) == (
        2,
        "skewer group: error: pkg: number of workers must be >= 1, got 0",
    )
    down = group("--workers", "4", environment={**env, "SKEWER_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert (down.returncode, down.stderr.strip()) == (
        1,
        "skewer group: error: kafka does not answer at 127.0.0.1:1 (start it: skewer services up)",
    )
    kafka_io.ensure_topic(kafka, run_names.work_topic, 3)
    mismatch = group("--workers", "4")
    assert mismatch.returncode == 2
    assert mismatch.stderr.strip() == (
        f"skewer group: error: topic '{run_names.work_topic}' has 3 partitions, but this run "
        "needs 4 (use another --topic-prefix or delete the topic)"
    )

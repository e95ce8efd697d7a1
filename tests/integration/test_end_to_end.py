"""The live pipeline end to end, on real Kafka, Redis and Spark: exact counts, faults, bad input.

Exactness: 100,000 records of Zipf z = 1.2 over 5 windows of 5 s, for each of key,
shuffle, pkg, d-choices, w-choices, fish, consistent, potc and greedy-online; every final
(key, window) count must equal the ground truth. How it stays within budget: Spark's start-up
(a JVM, then Python workers) dominates, so the nine runs share one Spark application -- the
test session's ``spark`` fixture -- and run side by side, one streaming query per scheme
(:func:`pipeline.stages.worker_job.run`, the code ``skewer work`` runs). Each run keeps its own
topics, Redis keys and checkpoint, and each query reads only its own run's ``work`` topic with
one task per partition, so partition w is still worker w of that scheme; producer, grouping
stage and aggregator are the real ``skewer`` subprocesses (:class:`pipeline.runs.orchestrator.
Pipeline`). ``skewer work`` itself, its own JVM and its checkpoint restart are exercised by
the fault test and the demo test.

The ground truth the verification uses is the producers' (Redis ``truth:*``); the tests also
check it against the workload recomputed here with ``collections.Counter``, and the key and
shuffle runs' per-worker loads against MurmurHash3 and round robin written out by hand.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import mmh3
import numpy as np
import pytest
from live_runs import (
    kill_group_and_work_mid_run,
    run_of,
    shared_spark_run,
    start_worker_query,
    wait_for_stages,
)

from pipeline.io import config, kafka_io, records
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.runs.summary import RunSummary
from pipeline.runs.verify import verify_run

pytestmark = [pytest.mark.integration, pytest.mark.live_path]

LIVE_SCHEMES = (
    "key",
    "shuffle",
    "pkg",
    "d-choices",
    "w-choices",
    "fish",
    "consistent",
    "potc",
    "greedy-online",
)
#: 25 s of event time at the producers' default 4,000 records per second: five windows of 5 s.
RECORDS = 100_000
WINDOW_MS = 5_000
WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"
WORKERS = 8
SOURCES = 2


@dataclass
class Outcome:
    plan: RunPlan
    summary: RunSummary
    truth_per_key: Counter[bytes]
    routed: list[int]


def run_with_shared_spark(plan: RunPlan, settings: config.Settings, spark: Any) -> Outcome:
    """Produce, group and aggregate as subprocesses; the workers as a query in ``spark``."""
    with shared_spark_run(plan, settings, spark) as pipeline:
        store = pipeline.store
        truth: Counter[bytes] = Counter()
        for window in store.truth_windows():
            truth.update(store.truth(window))
        routed = store.client.hgetall(store.keys.stats("routed"))
        outcome = Outcome(
            plan,
            pipeline.summary(),
            truth,
            [int(routed.get(str(w).encode(), 0)) for w in range(plan.workers)],
        )
    return outcome


@pytest.fixture(scope="module")
def workload_keys() -> list[bytes]:
    from producers.workloads import parse

    return parse(f"{WORKLOAD},n={RECORDS}").keys().to_list()


@pytest.fixture(scope="module")
def exactness_runs(settings: config.Settings, spark: Any) -> dict[str, Outcome]:
    """The live schemes' runs, side by side (see the module docstring)."""
    plans = [
        RunPlan(
            scheme=scheme,
            records=RECORDS,
            workers=WORKERS,
            sources=SOURCES,
            workload=WORKLOAD,
            window_ms=WINDOW_MS,
            run_id=f"e2e-{scheme}-{new_run_id()[5:]}",
        )
        for scheme in LIVE_SCHEMES
    ]
    began = time.monotonic()
    with ThreadPoolExecutor(len(plans)) as pool:
        outcomes = list(pool.map(lambda p: run_with_shared_spark(p, settings, spark), plans))
    print(f"\n{len(plans)} exactness runs took {time.monotonic() - began:.1f} s")
    return {outcome.plan.scheme: outcome for outcome in outcomes}


@pytest.mark.parametrize("scheme", LIVE_SCHEMES)
def test_every_final_count_equals_the_ground_truth(
    scheme: str, exactness_runs: dict[str, Outcome], workload_keys: list[bytes]
) -> None:
    outcome = exactness_runs[scheme]
    summary = outcome.summary
    verification = summary.verification
    assert verification.exact, "\n".join(verification.lines())
    assert verification.mismatch_count == 0
    assert summary.windows >= 5 and verification.windows == summary.windows
    # The truth the verification used is the workload's, recomputed here.
    assert outcome.truth_per_key == Counter(workload_keys)
    assert verification.truth_records == verification.result_records == RECORDS
    assert summary.records_produced == summary.records_processed == RECORDS
    # Invariant 3: what the stage routed to worker w is what worker w processed.
    assert summary.per_worker == outcome.routed
    assert summary.dead_letters == 0


def test_key_and_shuffle_route_as_their_definitions_say(
    exactness_runs: dict[str, Outcome], workload_keys: list[bytes]
) -> None:
    # Key grouping: worker = |MurmurHash3_x64_128(key, 13) first 64 bits, signed| mod W.
    key_loads = Counter(abs(mmh3.hash64(k, 13, signed=True)[0]) % WORKERS for k in workload_keys)
    assert exactness_runs["key"].summary.per_worker == [key_loads[w] for w in range(WORKERS)]
    # Shuffle: source s (records s, s+S, ... of the stream) sends its i-th to (s + i) mod W.
    shuffle_loads = Counter(
        (s + i) % WORKERS for s in range(SOURCES) for i in range(len(range(s, RECORDS, SOURCES)))
    )
    assert exactness_runs["shuffle"].summary.per_worker == [
        shuffle_loads[w] for w in range(WORKERS)
    ]
    # Keeping a key on one worker means one state entry per (key, window): replication 1.
    assert exactness_runs["key"].summary.replication == 1.0
    assert exactness_runs["consistent"].summary.replication == 1.0
    assert exactness_runs["shuffle"].summary.replication > exactness_runs["pkg"].summary.replication


# --- faults -------------------------------------------------------------------------------------


def test_kill_9_of_the_grouping_stage_and_of_the_spark_job_keeps_counts_exact(
    settings: config.Settings,
) -> None:
    """``kill -9`` of ``skewer group`` a quarter through and of ``skewer work`` half way, both
    restarted (:func:`live_runs.kill_group_and_work_mid_run`)."""
    run_id = f"e2e-faults-{new_run_id()[5:]}"
    summary = kill_group_and_work_mid_run(settings, run_id, 60_000)
    # 7.5 s of real event time (the producer is paced) in windows of 2 s: 4 or 5 windows.
    assert summary.windows == summary.verification.windows >= 4


# --- bad input ----------------------------------------------------------------------------------


def test_bad_records_go_to_dead_letters_and_valid_ones_are_counted_exactly(
    settings: config.Settings, spark: Any
) -> None:
    """Valid records of two producers interleaved with every kind of bad one, written straight
    into ``keys``; the producers' truth is computed here with ``Counter``."""
    from confluent_kafka import Producer

    plan = RunPlan(
        scheme="pkg", records=1, workers=4, sources=2, run_id=f"e2e-bad-{new_run_id()[5:]}"
    )
    names = plan.names
    window_ms = plan.window_ms
    start_ms = 1_700_000_000_000 // window_ms * window_ms
    rng = np.random.default_rng(11)
    good_value = records.encode_input(np.array([start_ms]), np.array([0]), np.array([0]))[0]
    bad_records: list[tuple[int, bytes | None, bytes | None, str]] = [
        (0, None, good_value, "no-key"),
        (1, b"", good_value, "no-key"),
        (0, b"k" * (records.MAX_KEY_BYTES + 1), good_value, "key-too-large"),
        (1, b"a", b"junk", "undecodable-value"),
        (0, b"a", None, "undecodable-value"),
        (1, b"a", b"XX" + good_value[2:], "undecodable-value"),
        (0, b"a", good_value[:2] + b"\x09" + good_value[3:], "undecodable-value"),
        (
            1,
            b"a",
            good_value[:3] + bytes([records.Kind.TABLE_SWITCH]) + good_value[4:],
            "wrong-kind",
        ),
        (0, b"a", good_value[:3] + b"\x07" + good_value[4:], "wrong-kind"),
    ]
    truth: dict[int, Counter[bytes]] = {}
    sent = [0, 0]
    messages: list[tuple[int, bytes | None, bytes | None, str | None]] = []
    for i in range(6_000):
        producer_id = i % 2
        time_ms = start_ms + i * 5  # 30 s of event time: 3 windows
        key = f"k{int(rng.zipf(1.5)) % 300}".encode()
        value = records.encode_input(
            np.array([time_ms]), np.array([producer_id]), np.array([sent[producer_id]])
        )[0]
        messages.append((producer_id, key, value, None))
        truth.setdefault(time_ms // window_ms * window_ms, Counter())[key] += 1
        sent[producer_id] += 1
        if i % 600 == 300:
            messages.append(bad_records[(i // 600) % len(bad_records)])
    messages += [m for m in bad_records if m not in messages]
    for producer_id in (0, 1):
        end = records.encode_input(
            np.array([records.END_OF_STREAM]),
            np.array([producer_id]),
            np.array([sent[producer_id]]),
            records.Kind.WATERMARK,
        )[0]
        messages.append((producer_id, b"", end, None))
    expected_dead = [m for m in messages if m[3] is not None]

    with run_of(plan, settings) as pipeline:
        pipeline.prepare()
        store = pipeline.store
        for window, counts in truth.items():
            store.client.hset(store.keys.truth(window), mapping=dict(counts))
        for producer_id, count in enumerate(sent):
            store.client.set(store.keys.producer_sent(producer_id), count)
        offsets: dict[tuple[int, int], str] = {}
        producer = Producer(kafka_io.producer_config(settings.kafka_bootstrap))
        for producer_id, key, value, reason in messages:

            def delivered(error: Any, message: Any, reason: str | None = reason) -> None:
                assert error is None, error
                if reason is not None:
                    offsets[(message.partition(), message.offset())] = reason

            producer.produce(
                names.keys_topic, key=key, value=value, partition=producer_id, on_delivery=delivered
            )
        assert producer.flush(60) == 0

        join_workers = start_worker_query(plan, settings, spark)
        pipeline.start_all(["aggregate", "group"])
        wait_for_stages(pipeline, ["group"])
        join_workers(pipeline)
        wait_for_stages(pipeline)
        summary = pipeline.summary()

        verification = verify_run(store)
        assert verification.exact, "\n".join(verification.lines())
        assert verification.result_records == sum(sent) == summary.records_processed
        assert len(offsets) == len(expected_dead)
        expected_reasons = Counter(m[3] for m in expected_dead)
        assert summary.dead_letters == len(expected_dead)
        assert summary.dead_letter_reasons == dict(expected_reasons)
        letters = kafka_io.read_topic(settings.kafka_bootstrap, names.dead_letters_topic)
        assert len(letters) == len(expected_dead)
        for letter in letters:
            body = json.loads(letter.value or b"")
            assert body["topic"] == names.keys_topic
            assert offsets[(body["partition"], body["offset"])] == body["reason"]
            assert body["detail"]


# --- the verification itself --------------------------------------------------------------------


def test_verification_finds_every_kind_of_difference(redis: Any) -> None:
    """A run whose results differ from the truth in each way verify_run must catch."""
    from pipeline.io.state_store import StateStore

    store = StateStore(redis, f"e2e-verify-{new_run_id()[5:]}")
    keys = store.keys
    redis.hset(keys.truth(0), mapping={b"a": 3, b"b": 2, b"gone": 1})
    redis.hset(keys.truth(10), mapping={b"c": 4})
    redis.set(keys.producer_sent(0), 6)
    redis.set(keys.producer_sent(1), 4)
    # Window 0 final with one count wrong, one key missing and one key that was never sent;
    # window 10 never final, and a worker's partial state of it still in Redis.
    redis.hset(keys.result(0), mapping={b"a": 3, b"b": 1, b"extra": 2})
    redis.sadd(keys.windows_final, 0)
    redis.hset(keys.state(1, 10), mapping={b"c": 4})
    redis.hset(keys.stats("late"), mapping={"1": 1})

    report = verify_run(store)
    assert not report.exact
    assert report.windows == 2 and report.keys == 4
    assert report.truth_records == 10 and report.produced_records == 10
    assert report.result_records == 6
    assert report.mismatch_count == 4
    assert sorted(report.mismatches) == [
        (0, b"b", 2, 1),
        (0, b"extra", 0, 2),
        (0, b"gone", 1, 0),
        (10, b"c", 4, 0),
    ]
    assert report.missing_windows == [10]
    assert report.leftover_state == 1
    assert report.late_records == 1

    # Repaired, the same run is exact.
    redis.hset(keys.result(0), mapping={b"b": 2, b"gone": 1})
    redis.hdel(keys.result(0), b"extra")
    redis.hset(keys.result(10), mapping={b"c": 4})
    redis.sadd(keys.windows_final, 10)
    redis.delete(keys.state(1, 10))
    repaired = verify_run(store)
    assert repaired.exact, repaired.lines()
    assert repaired.lines() == [
        "exact: every (key, window) count equals the ground truth (2 windows, 4 keys, 10 records)"
    ]
    # The producers' acknowledged count must agree too.
    redis.set(keys.producer_sent(1), 5)
    assert not verify_run(store).exact
    redis.delete(*redis.keys(f"{keys.prefix}*"))

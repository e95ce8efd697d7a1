"""`skewer advise` on a real topic: a JSON stream written by a plain client, sampled as the
grouping stage reads it, and the per-worker loads of its table checked against routing by hand
(key grouping's hash, PKG's per-source rule); ``--validate 1 --check`` running the top scheme
and key grouping live on such a topic; then the topics it must refuse.

The stream: 2 partitions, record ``i`` in partition ``i mod 2`` at ``START + 10·i`` ms, keyed
by a string field ``user`` (Zipf); a few records are no JSON or have no ``user`` (dead letters)
and one is 30 s older than its partition's newest record (late), so the sample must leave
exactly those out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import mmh3
import numpy as np
import pytest

from pipeline.io import config

pytestmark = pytest.mark.integration

PARTITIONS = 2
WORKERS = 4
RECORDS = 3_000
GAP_MS = 10
#: An hour ago on a minute boundary (brokers refuse timestamps far ahead; see test_user_topic).
START_MS = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000


def kg(key: bytes) -> int:
    return abs(mmh3.hash64(key, 13, signed=True)[0]) % WORKERS


def pkg_loads(stream: list[tuple[int, bytes]]) -> list[int]:
    """PKG's rule per source (partition), in the source's order: the less loaded of the key's
    two hashed workers by the source's own counts, ties to the first."""
    own = [[0] * WORKERS for _ in range(PARTITIONS)]
    loads = [0] * WORKERS
    for partition, key in stream:
        a = abs(mmh3.hash64(key, 13, signed=True)[0]) % WORKERS
        b = abs(mmh3.hash64(key, 17, signed=True)[0]) % WORKERS
        chosen = b if own[partition][b] < own[partition][a] else a
        own[partition][chosen] += 1
        loads[chosen] += 1
    return loads


def produce(bootstrap: str, topic: str, values: list[tuple[int, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for partition, value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(60) == 0


def advise(topic: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pipeline.cli", "advise", "--input-topic", topic]
    command += ["--workers", str(WORKERS), "--quiet", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_advice_on_a_json_topic_routes_the_records_the_live_stage_would(
    settings: config.Settings, topic_name: str, create_topic: Callable[[str, int], str]
) -> None:
    topic = create_topic(topic_name, PARTITIONS)
    rng = np.random.default_rng(11)
    values: list[tuple[int, bytes]] = []
    usable: list[tuple[int, bytes]] = []  # (partition, key) of the records the stage routes
    for i in range(RECORDS):
        partition = i % PARTITIONS
        user = f"user-{int(rng.zipf(1.3)) % 300}"
        record: dict[str, Any] = {"user": user, "ts": START_MS + GAP_MS * i}
        if i % 500 == 7:
            values.append((partition, b"not json"))
            continue
        if i % 500 == 9:
            del record["user"]
        else:
            usable.append((partition, user.encode()))
        values.append((partition, json.dumps(record).encode()))
    # Late: its window closed long before (30 s behind its partition, bound 5 s).
    values.append((0, json.dumps({"user": "late", "ts": START_MS}).encode()))
    produce(settings.kafka_bootstrap, topic, values)

    done = advise(topic, "--key", "json:user", "--time", "json:ts", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["sources"] == PARTITIONS and out["records"] == len(usable)
    dead = RECORDS - len(usable)
    assert out["sample"]["read"] == RECORDS + 1
    assert out["sample"]["dead_letters"] == {"no-key": dead // 2, "undecodable-value": dead // 2}
    assert out["sample"]["late"] == 1
    # The sample's rate: one record every 10 ms of event time, over the usable records' span.
    assert out["rate"] == pytest.approx(100.0, rel=0.01)
    loads = {c["label"]: c["loads"] for c in out["candidates"]}
    keys_loads = np.bincount([kg(key) for _, key in usable], minlength=WORKERS)
    assert loads["key"] == keys_loads.tolist()
    assert loads["pkg"] == pkg_loads(usable)
    assert out["top_keys"][0] == "user-1"

    table = advise(topic, "--key", "json:user", "--time", "json:ts")
    assert table.returncode == 0, table.stderr[-2000:]
    assert f"{RECORDS + 1 - len(usable):,} of {RECORDS + 1:,}" in table.stdout
    assert table.stdout.splitlines()[-1].startswith("recommendation: ")


def test_a_topic_that_does_not_exist_or_is_empty_is_one_line_and_exit_2(
    settings: config.Settings, topic_name: str, create_topic: Callable[[str, int], str]
) -> None:
    done = advise(f"{topic_name}-missing")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"skewer advise: error: --input-topic {topic_name}-missing: no such topic"
    )
    create_topic(topic_name, 2)
    done = advise(topic_name)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"skewer advise: error: --input-topic {topic_name}: the topic holds no records"
    )


def test_a_topic_of_dead_letters_only_is_one_line_and_exit_2(
    settings: config.Settings, topic_name: str, create_topic: Callable[[str, int], str]
) -> None:
    topic = create_topic(topic_name, 1)
    produce(settings.kafka_bootstrap, topic, [(0, b"not json")] * 3)
    done = advise(topic, "--key", "json:user")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"skewer advise: error: --input-topic {topic}: every one of the 3 sampled records is a "
        "dead letter (undecodable-value 3); check --key and --time"
    )


#: The live check's stream: record ``i`` in partition ``i mod 2`` at ``START + i/2`` ms
#: (2,000 records/s of event time, one 10 s window), Zipf users on which PKG ranks first.
LIVE_RECORDS = 20_000


@pytest.mark.slow
def test_validate_runs_the_top_scheme_and_key_grouping_live_with_the_predicted_loads(
    settings: config.Settings, topic_name: str, create_topic: Callable[[str, int], str]
) -> None:
    topic = create_topic(topic_name, PARTITIONS)
    rng = np.random.default_rng(11)
    values: list[tuple[int, bytes]] = []
    usable: list[tuple[int, bytes]] = []
    for i in range(LIVE_RECORDS):
        partition = i % PARTITIONS
        if i % 1000 == 3:  # a dead letter: left out by the sample and the live stage alike
            values.append((partition, b"not json"))
            continue
        user = f"user-{int(rng.zipf(1.3)) % 300}"
        usable.append((partition, user.encode()))
        record = {"user": user, "ts": START_MS + i // 2}
        values.append((partition, json.dumps(record).encode()))
    produce(settings.kafka_bootstrap, topic, values)

    # C = 0 and D = 0: the loads and max/avg are checked; no bound, no predicted wait (nothing
    # timed: a backlog's latency is the grouping stage's pace, not the stream's).
    flags = ("--key", "json:user", "--time", "json:ts", "--cpu-cost-us", "0", "--batch-ms", "0")
    done = advise(topic, *flags, "--validate", "1", "--check", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    simulator_only = {c["label"] for c in out["candidates"] if c["simulator_only"]}
    top = next(label for label in out["ranking"] if label not in simulator_only)
    live = {run["label"]: run for run in out["live"]}
    assert top == "pkg" and list(live) == ["pkg", "key"]
    predicted = {c["label"]: c["loads"] for c in out["candidates"]}
    for label, run in live.items():
        measured = run["measured"]
        assert measured["loads"] == predicted[label], label  # record for record
        assert measured["exact"], label
        loads_check = next(c for c in run["checks"] if c["figure"] == "loads")
        assert loads_check["within"] is True and run["within"] is True
    keys_loads = np.bincount([kg(key) for _, key in usable], minlength=WORKERS)
    assert live["key"]["measured"]["loads"] == keys_loads.tolist()
    assert live["pkg"]["measured"]["loads"] == pkg_loads(usable)


def test_validate_refuses_a_sample_that_is_not_the_whole_topic(
    settings: config.Settings, topic_name: str, create_topic: Callable[[str, int], str]
) -> None:
    topic = create_topic(topic_name, 1)
    values = [
        (0, json.dumps({"user": f"u{i % 7}", "ts": START_MS + i}).encode()) for i in range(50)
    ]
    produce(settings.kafka_bootstrap, topic, values)
    flags = ("--key", "json:user", "--time", "json:ts", "--sample", "20")
    done = advise(topic, *flags, "--validate", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"skewer advise: error: --validate: a live run reads all 50 records of {topic} but the "
        "sample read 20; sample the whole topic (--sample 50)"
    )

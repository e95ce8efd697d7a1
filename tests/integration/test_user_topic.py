"""Your own topic: streams skewer did not write, grouped live and verified exactly.

Two streams, each produced here by a plain client, never by skewer's producer: **JSON** by
Apache Kafka's own console producer, keyed by a field ``user``, timed by an ISO-8601 ``ts``
and summed by a decimal ``bytes`` (some amounts finer than the millionths kept), with records
out of order within the bound (5 s), some far beyond it, and some unreadable (not JSON, no
``user``, a ``ts`` that is no time, ``bytes`` that is no number); **plain bytes** keyed and
timed by Kafka (confluent-kafka), with late records and records without a key, half of it
written while the runs read it, which end at ``--ending-offsets``.

Each stream runs under pkg and under mixed (the controller runs), reading what the topic holds;
the JSON stream's mixed run is a query (``--query``) whose WHERE leaves out some records and
whose sum, min, max, avg and count of ``bytes`` skip a record without a number there (SQL's
NULL); the query runs in Real-Time Mode too. Every run must pass the Spark batch recount
(every aggregate, and the query's own text on Spark SQL) and, independently, equal what is
computed here from the records as the broker stored them; the late records and the dead
letters must be exactly the ones injected, decided by the rule written out below.

Then bad settings (one line, exit 2). The grouping stage alone on a user's topic:
test_user_topic_stage.py.

Long because both streams' generators and their expected results are written out here, record
by record, once for every run of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np
import pytest
from live_runs import shared_spark_run

from pipeline.io import config, kafka_io
from pipeline.io.extractors import format_amount
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.runs.summary import RunSummary

pytestmark = pytest.mark.integration

WORKERS = 4
PARTITIONS = 2
WINDOW_MS = 10_000
BOUND_MS = 5_000
#: An hour ago, on a window boundary: brokers refuse Kafka timestamps more than an hour ahead
#: (``log.message.timestamp.after.max.ms``), so the stream lies in the past, but well within
#: the broker's retention (24 h): a stream a day old was deleted by it while a run read it.
START_MS = (int(time.time() * 1000) - 3_600_000) // 60_000 * 60_000
RECORDS = 12_000


@dataclass
class Expected:
    """What a run must produce: counts per window and key, late and dead-lettered records."""

    counts: dict[int, Counter[bytes]]
    late: int
    dead_letters: Counter[str]
    #: The amounts per window and key in millionths, NULLs left out (streams with an amount).
    amounts: dict[int, dict[bytes, list[int]]]
    #: Valid records a query's WHERE left out.
    filtered: int = 0

    def fields(self, parts: list[str]) -> dict[int, list[dict[bytes, int]]]:
        """Per window, each of ``parts`` (count, sum, min, max) of the amounts per key, as a
        run keeps its state fields: a count of none is 0, any other part of none is absent."""
        how = {"count": len, "sum": sum, "min": min, "max": max}
        return {
            window: [
                {k: how[part](v) for k, v in by_key.items() if v or part == "count"}
                for part in parts
            ]
            for window, by_key in self.amounts.items()
        }


def event_times(rng: np.random.Generator, n: int) -> list[int]:
    """5 ms apart; every 10th up to 3 s back (within the bound), every 500th 30 s back."""
    times = []
    for i in range(n):
        t = START_MS + 5 * i
        if i % 10 == 7:
            t -= int(rng.integers(0, 3_000))
        if i % 500 == 250:
            t -= 30_000
        times.append(t)
    return times


def expected_from_topic(
    kafka: str, topic: str, parse: Any, window_ms: int = WINDOW_MS, where: Any = None
) -> Expected:
    """The counts, late records and dead letters the stored topic implies, partition by
    partition in offset order: ``parse(record)`` gives (key, time, amount in millionths, None
    for a NULL) or a dead-letter reason; ``where(record)`` (a query's WHERE) whether a valid
    record is kept. A kept record is late when its window's end is at or below the watermark
    before it: the highest event time of the partition's valid records before it minus the bound."""
    counts: dict[int, Counter[bytes]] = {}
    amounts: dict[int, dict[bytes, list[int]]] = {}
    dead: Counter[str] = Counter()
    late = filtered = 0
    highest: dict[int, int] = {}
    for record in kafka_io.read_topic(kafka, topic):
        parsed = parse(record)
        if isinstance(parsed, str):
            dead[parsed] += 1
            continue
        key, t, amount = parsed
        window = t // window_ms * window_ms
        seen = highest.get(record.partition)
        if where is not None and not where(record):
            filtered += 1
        elif seen is not None and window + window_ms - 1 <= seen - BOUND_MS:
            late += 1
        else:
            counts.setdefault(window, Counter())[key] += 1
            kept = amounts.setdefault(window, {}).setdefault(key, [])
            if amount is not None:
                kept.append(amount)
        highest[record.partition] = t if seen is None else max(seen, t)
    return Expected(counts, late, dead, amounts, filtered)


# --- the JSON stream, by Kafka's console producer ----------------------------------------------


def json_lines() -> list[str]:
    """``key|value`` lines for the console producer (``parse.key``)."""
    rng = np.random.default_rng(3)
    lines = []
    for i, t in enumerate(event_times(rng, RECORDS)):
        user = f"u{int(rng.zipf(1.3)) % 500}"
        stamp = datetime.fromtimestamp(t / 1000, UTC).isoformat(timespec="milliseconds")
        # Mostly whole or 3-decimal byte counts; every 7th with 9 decimals (floored to 6).
        digits = 9 if i % 7 == 3 else int(rng.integers(0, 4))
        amount = (
            round(float(rng.uniform(0, 5_000)), digits) if digits else int(rng.integers(0, 5_000))
        )
        device = ("mobile", "desktop", "tablet")[i % 3]
        fields = {
            "user": user,
            "device": device,
            "ts": stamp.replace("+00:00", "Z"),
            "bytes": amount,
            "n": i,
        }
        value: str = json.dumps(fields)
        if i % 997 == 500:
            value = "not json {"
        elif i % 1499 == 700:
            value = json.dumps({"name": user, "ts": stamp})
        elif i % 1999 == 900:
            value = json.dumps({"user": user, "device": device, "ts": "yesterday"})
        elif i % 1777 == 1000:
            value = json.dumps({**fields, "bytes": "lots"})
        lines.append(f"{user}|{value}")
    return lines


#: The query the JSON stream's query runs are given: the pkg run's flags, with a WHERE and a
#: second grouping column.
JSON_QUERY = (
    "SELECT user, device, window.start, count(*) AS hits, sum(bytes) AS bytes, "
    "min(bytes) AS least, max(bytes) AS most, avg(bytes) AS mean, count(bytes) AS sized "
    "FROM `{topic}` WHERE n >= 600 AND NOT user LIKE 'u1%' "
    "GROUP BY user, device, window(ts, '10 seconds')"
)
#: :data:`JSON_QUERY`'s state fields, in the order the run declares them.
JSON_QUERY_PARTS = ["count", "sum", "min", "max"]


def json_where(record: kafka_io.StoredRecord) -> bool:
    """:data:`JSON_QUERY`'s WHERE on a record :func:`parse_json` accepts."""
    doc = json.loads(record.value or b"")
    return doc["n"] >= 600 and not doc["user"].startswith("u1")


def parse_json_by_device(record: kafka_io.StoredRecord) -> tuple[bytes, int, int | None] | str:
    """:func:`parse_json` with :data:`JSON_QUERY`'s key, the JSON array of user and device, and
    its NULLs: a value without a number in ``bytes`` is kept, its amount NULL (None)."""
    parsed = parse_json(record)
    if parsed == "bad-amount":
        doc = json.loads(record.value or b"")
        stamp = datetime.fromisoformat(doc["ts"].replace("Z", "+00:00"))
        parsed = doc["user"].encode(), round(stamp.timestamp() * 1000), None
    if isinstance(parsed, str):
        return parsed
    key = json.dumps([parsed[0].decode(), json.loads(record.value or b"")["device"]])
    return key.replace(", ", ",").encode(), parsed[1], parsed[2]


def parse_json(record: kafka_io.StoredRecord) -> tuple[bytes, int, int | None] | str:
    try:
        doc = json.loads(record.value or b"", parse_float=Decimal)
    except ValueError:
        return "undecodable-value"
    if not isinstance(doc.get("user"), str):
        return "no-key"
    try:
        stamp = datetime.fromisoformat(doc["ts"].replace("Z", "+00:00"))
    except ValueError:
        return "bad-time"
    if not isinstance(doc.get("bytes"), int | Decimal):
        return "bad-amount"
    # Exact decimal arithmetic: finer digits than millionths are floored.
    micros = math.floor(Decimal(doc["bytes"]) * 10**6)
    return doc["user"].encode(), round(stamp.timestamp() * 1000), micros


def console_produce(settings: config.Settings, topic: str, lines: list[str]) -> None:
    command = [
        "java",
        "-cp",
        f"{settings.kafka_libs_dir}/*",
        "org.apache.kafka.tools.ConsoleProducer",
        "--bootstrap-server",
        settings.kafka_bootstrap,
        "--topic",
        topic,
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=|",
    ]
    done = subprocess.run(
        command, input="\n".join(lines) + "\n", text=True, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


# --- the bytes stream, by a plain confluent-kafka producer -------------------------------------


def produce_bytes(settings: config.Settings, topic: str, part: slice) -> None:
    """Records ``part`` of the bytes stream (the same records whatever the part)."""
    from confluent_kafka import Producer

    rng = np.random.default_rng(4)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20})
    for i, t in enumerate(event_times(rng, RECORDS)):
        key = None if i % 1201 == 600 else f"url-{int(rng.zipf(1.2)) % 800}".encode()
        value = rng.bytes(int(rng.integers(0, 64)))
        if i in range(RECORDS)[part]:
            producer.produce(topic, value, key, partition=i % PARTITIONS, timestamp=t)
        if i % 5_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def parse_bytes(record: kafka_io.StoredRecord) -> tuple[bytes, int, int] | str:
    if not record.key:
        return "no-key"
    return record.key, record.timestamp_ms, 0


# --- the runs ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    plan: RunPlan
    summary: RunSummary
    results: dict[int, dict[bytes, int]]
    #: Per final window, each declared state field's value per key.
    result_fields: dict[int, list[dict[bytes, int]]]
    late_topic: int
    dead_letter_reasons: Counter[str]
    cli_verify: str | None = None
    #: A query's run: the rows its aggregator published to ``results``.
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def run_on_topic(
    settings: config.Settings,
    spark: Any,
    plan: RunPlan,
    *,
    cli_verify: bool = False,
    during: Any = None,
) -> Outcome:
    with shared_spark_run(plan, settings, spark, during=during) as pipeline:
        store = pipeline.store
        summary = pipeline.summary()
        results = {w: store.result(w) for w in store.final_windows()}
        result_fields = {w: store.result_fields(w) for w in store.final_windows()}
        names = plan.names
        late_topic = len(kafka_io.read_topic(settings.kafka_bootstrap, names.late_topic))
        rows = [
            json.loads(record.value or b"")
            for record in kafka_io.read_topic(settings.kafka_bootstrap, names.results_topic)
        ]
        if plan.query:  # skewer report shows the query's top rows too
            report = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", "report", "--run-id", plan.run_id,
                 "--out", str(settings.run_dir / "reports" / f"{plan.run_id}.png")],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert report.returncode == 0, report.stderr[-2000:]
            lines = report.stdout.splitlines()
            assert lines[1] == "top keys of the last window, as the query names its columns:"
            assert lines[2].split() == ["user", "device", "start", "hits", "bytes", "least",
                                        "most", "mean", "sized"]  # fmt: skip
        dead = Counter(
            json.loads(r.value or b"{}")["reason"]
            for r in kafka_io.read_topic(settings.kafka_bootstrap, names.dead_letters_topic)
        )
        verified = None
        if cli_verify:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pipeline.cli",
                    "verify",
                    "--run-id",
                    plan.run_id,
                    "--recount",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stdout + done.stderr[-2000:]
            verified = done.stdout
    return Outcome(
        plan,
        summary,
        results,
        result_fields,
        late_topic,
        dead,
        verified,
        rows if plan.query else [],
    )


def plans_for(
    topic: str,
    key: str,
    time_spec: str,
    tag: str,
    amount: str | None = None,
    ending_offsets: tuple[int, ...] | None = None,
    mixed_query: str | None = None,
) -> list[RunPlan]:
    """A pkg run and a mixed run of the topic; the mixed one by ``mixed_query`` when given."""
    return [
        RunPlan(
            scheme=scheme,
            records=RECORDS,
            workers=WORKERS,
            sources=PARTITIONS,
            window_ms=WINDOW_MS,
            input_topic=topic,
            key=key,
            time=time_spec,
            sum=None if mixed_query and scheme == "mixed" else amount,
            max_out_of_order_ms=BOUND_MS,
            ending_offsets=ending_offsets,
            query=mixed_query if scheme == "mixed" else None,
            run_id=f"own-{tag}-{scheme}-{new_run_id()[5:]}",
        )
        for scheme in ("pkg", "mixed")
    ]


def check(outcome: Outcome, expected: Expected) -> None:
    summary = outcome.summary
    verification = summary.verification
    assert verification.exact, "\n".join(verification.lines())
    assert outcome.results == {w: dict(c) for w, c in expected.counts.items()}
    if outcome.plan.query:
        assert outcome.result_fields == expected.fields(JSON_QUERY_PARTS)
        assert summary.state_fields == [f"{part}(bytes)" for part in JSON_QUERY_PARTS]
        assert "state per (key, window)" in "\n".join(summary.lines())
    elif outcome.plan.sum is not None:
        assert outcome.result_fields == expected.fields(["sum"])
    else:
        assert not any(outcome.result_fields.values())
    assert summary.late_records == outcome.late_topic == expected.late > 0
    assert outcome.dead_letter_reasons == expected.dead_letters
    assert summary.dead_letter_reasons == dict(expected.dead_letters)
    assert summary.filtered_records == expected.filtered
    counted = sum(sum(c.values()) for c in expected.counts.values())
    assert summary.records_processed == counted
    left_out = expected.late + sum(expected.dead_letters.values()) + expected.filtered
    assert counted + left_out == RECORDS
    if outcome.plan.query:
        # The summary's top keys of the last window, as the query names its columns.
        assert summary.top_rows
        for row in summary.top_rows:
            check_row(row, expected)
        assert "top keys of the last window" in "\n".join(summary.lines())
        # RUN-results: one row per (key, window), the query's columns.
        pairs = {(w, k) for w, by_key in expected.counts.items() for k in by_key}
        assert len(outcome.rows) == len(pairs)
        for row in outcome.rows:
            check_row(row, expected)
        assert {(row_window(row), row_key(row)) for row in outcome.rows} == pairs
        # --verify ran the query's own text on Spark SQL and found every row alike.
        assert verification.rows is not None and verification.rows.compared == len(pairs)


def kill_the_aggregator_once_it_published(pipeline: Any) -> None:
    """kill -9 the aggregator once it has published a window, and start it again: each
    (key, window) row must still be in ``results`` once (:func:`check`)."""
    store = pipeline.store
    deadline = time.monotonic() + 600  # bounds a hang only
    while not store.client.scard(store.keys.windows_published):
        pipeline.check()
        assert time.monotonic() < deadline, "the aggregator published no window"
        time.sleep(0.05)
    pipeline.kill("aggregate")
    pipeline.start("aggregate")


def row_key(row: dict[str, Any]) -> bytes:
    """The key of one of :data:`JSON_QUERY`'s rows: the JSON array of user and device."""
    return json.dumps([row["user"], row["device"]]).replace(", ", ",").encode()


def row_window(row: dict[str, Any]) -> int:
    return round(datetime.fromisoformat(row["start"].replace("Z", "+00:00")).timestamp() * 1000)


def check_row(row: dict[str, Any], expected: Expected) -> None:
    """One of :data:`JSON_QUERY`'s rows: its columns as the query names them, each value
    what ``expected`` gives its (key, window), NULLs as null."""
    columns = ["user", "device", "start", "hits", "bytes", "least", "most", "mean", "sized"]
    assert list(row) == columns
    window, key = row_window(row), row_key(row)
    amounts = expected.amounts[window][key]
    assert row["hits"] == expected.counts[window][key]
    assert row["sized"] == len(amounts)
    assert row["bytes"] == (format_amount(sum(amounts)) if amounts else None)
    assert row["least"] == (format_amount(min(amounts)) if amounts else None)
    assert row["most"] == (format_amount(max(amounts)) if amounts else None)
    if amounts:  # exact, to Spark's ten places of an average of DECIMAL(p, 6)
        mean = Decimal(sum(amounts)) / len(amounts) / 10**6
        assert Decimal(row["mean"]) == mean.quantize(Decimal("1e-10"), ROUND_HALF_UP)
    else:
        assert row["mean"] is None


def test_a_json_topic_written_by_kafkas_console_producer_is_grouped_exactly(
    settings: config.Settings, spark: Any, create_topic: Any, topic_name: str
) -> None:
    topic = create_topic(topic_name, PARTITIONS)
    console_produce(settings, topic, json_lines())
    expected = expected_from_topic(settings.kafka_bootstrap, topic, parse_json)
    assert expected.dead_letters == Counter(
        {"undecodable-value": 12, "no-key": 8, "bad-time": 6, "bad-amount": 7}
    )
    # Some amounts have digits beyond the millionths kept: the sums must floor them alike.
    assert any(a % 1_000 for w in expected.amounts.values() for v in w.values() for a in v)
    where = expected_from_topic(
        settings.kafka_bootstrap, topic, parse_json_by_device, where=json_where
    )
    assert where.filtered > RECORDS // 20 and where.late > 0
    # The query counts a record without a number in bytes, and skips it in bytes' aggregates
    # (SQL's NULL): no dead letter for it.
    assert "bad-amount" not in where.dead_letters
    nulls = sum(
        where.counts[w][k] - len(v) for w, by in where.amounts.items() for k, v in by.items()
    )
    assert nulls > 0
    plans = plans_for(
        topic,
        "json:user",
        "json:ts:iso",
        "json",
        amount="json:bytes",
        mixed_query=JSON_QUERY.format(topic=topic),
    )
    # The query under hashing too: its results must not depend on the scheme, whether it
    # keeps each key on one worker or migrates keys between them, nor on a kill -9 of its
    # aggregator.
    mixed = next(plan for plan in plans if plan.query)
    plans.append(
        dataclasses.replace(mixed, scheme="key", run_id=f"own-json-key-{new_run_id()[5:]}")
    )
    with ThreadPoolExecutor(len(plans)) as pool:
        outcomes = list(
            pool.map(
                lambda p: run_on_topic(
                    settings,
                    spark,
                    p,
                    cli_verify=p.scheme == "pkg",
                    during=kill_the_aggregator_once_it_published if p.scheme == "key" else None,
                ),
                plans,
            )
        )
    for outcome in outcomes:
        check(outcome, where if outcome.plan.query else expected)
    by_query = [o for o in outcomes if o.plan.query]
    assert len(by_query) == 2
    for outcome in by_query[1:]:
        assert (outcome.results, outcome.result_fields) == (
            by_query[0].results,
            by_query[0].result_fields,
        )
        assert outcome.summary.top_rows == by_query[0].summary.top_rows
    cli = next(o.cli_verify for o in outcomes if o.cli_verify is not None)
    assert cli.startswith("exact: every (key, window) count and state field equals the recount")


#: What a query runs in Real-Time Mode: its WHERE, the grouping columns and count(*) (the
#: writer in Spark's JVM keeps counts only).
REAL_TIME_QUERY = (
    "SELECT user, device, window.start, count(*) AS hits FROM `{topic}` "
    "WHERE n >= 600 AND NOT user LIKE 'u1%' GROUP BY user, device, window(ts, '10 seconds')"
)


def test_a_query_on_a_json_topic_runs_exactly_in_real_time_mode(
    settings: config.Settings, spark: Any, create_topic: Any, topic_name: str
) -> None:
    """The query's WHERE and compound key are the grouping stage's, so Real-Time Mode's
    writers count what it routes: every (key, window) count equals what the test computes from
    the stored records, and --verify's Spark SQL run of the query finds every row alike."""
    from live_runs import REAL_TIME_FIELDS

    from pipeline.runs.orchestrator import run_pipeline

    topic = create_topic(topic_name, PARTITIONS)
    console_produce(settings, topic, json_lines())
    where = expected_from_topic(
        settings.kafka_bootstrap, topic, parse_json_by_device, where=json_where
    )
    plan = RunPlan(
        scheme="pkg",
        records=RECORDS,
        workers=WORKERS,
        sources=PARTITIONS,
        window_ms=WINDOW_MS,
        input_topic=topic,
        key="json:user",
        time="json:ts:iso",
        max_out_of_order_ms=BOUND_MS,
        query=REAL_TIME_QUERY.format(topic=topic),
        run_id=f"own-rt-{new_run_id()[5:]}",
        **REAL_TIME_FIELDS,
    )
    summary = run_pipeline(plan, settings)
    verification = summary.verification
    assert verification.exact, "\n".join(verification.lines())
    pairs = sum(len(by_key) for by_key in where.counts.values())
    assert verification.rows is not None and verification.rows.compared == pairs
    assert summary.records_processed == sum(sum(c.values()) for c in where.counts.values())
    assert summary.filtered_records == where.filtered
    assert summary.late_records == where.late > 0


def test_a_bytes_topic_keyed_and_timed_by_kafka_is_grouped_exactly(
    settings: config.Settings, spark: Any, create_topic: Any, topic_name: str
) -> None:
    """The topic is still being written while the runs read it: the first half is there
    when they start, the second half comes once every stage of both runs has started, and
    ``--ending-offsets`` (the whole stream's, partition by partition) tells them where it ends."""
    topic = create_topic(topic_name, PARTITIONS)
    half = RECORDS // 2
    produce_bytes(settings, topic, slice(0, half))
    started = threading.Barrier(2, action=lambda: rest.start())
    rest = threading.Thread(target=produce_bytes, args=(settings, topic, slice(half, None)))
    ends = tuple(len(range(p, RECORDS, PARTITIONS)) for p in range(PARTITIONS))
    plans = plans_for(topic, "kafka-key", "kafka-timestamp", "bytes", ending_offsets=ends)
    with ThreadPoolExecutor(len(plans)) as pool:
        outcomes = list(
            pool.map(
                lambda p: run_on_topic(settings, spark, p, during=lambda _: started.wait(120)),
                plans,
            )
        )
    rest.join()
    expected = expected_from_topic(settings.kafka_bootstrap, topic, parse_bytes)
    assert (
        sum(expected.dead_letters.values())
        + expected.late
        + sum(sum(c.values()) for c in expected.counts.values())
        == RECORDS
    )
    assert expected.dead_letters == Counter({"no-key": 10})
    for outcome in outcomes:
        check(outcome, expected)


# --- bad settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--key", "json:"], "--key json: names no field"),
        (["--time", "json:ts:minutes"], "unknown time unit 'minutes'"),
        (["--max-out-of-order", "5 parsecs"], "--max-out-of-order '5 parsecs': not a duration"),
        (["--sum", "json:"], "--sum json: names no field"),
        (["--sum", "kafka-key"], "--sum kafka-key: not an amount source"),
        ([], "no such topic"),
    ],
)
def test_bad_settings_fail_at_start_with_one_line_and_exit_2(
    settings: config.Settings, flags: list[str], message: str
) -> None:
    command = [sys.executable, "-m", "pipeline.cli", "group", "--workers", "2"]
    command += ["--input-topic", f"no-such-topic-{new_run_id()[5:]}", *flags]
    command += ["--run-id", f"bad-{new_run_id()[5:]}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skewer group: error:"), done.stderr
    assert message in lines[0]


def test_a_sum_without_a_topic_of_ones_own_fails_with_one_line() -> None:
    command = [sys.executable, "-m", "pipeline.cli", "group", "--workers", "2"]
    command += ["--sum", "json:bytes", "--run-id", f"bad-{new_run_id()[5:]}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "skewer group: error: --sum json:bytes needs --input-topic: skewer's own records carry "
        "no amount"
    )

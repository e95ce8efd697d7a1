"""The Redis window state against a real Redis: idempotent apply per (worker, batch),
watermarks, late records, the guarded atomic finalize, and the aggregator's passes."""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from worker_batches import SUMS, batch

from operators.aggregates import StateField
from pipeline.io.extractors import format_amount
from pipeline.io.records import END_OF_STREAM
from pipeline.io.state_store import StateStore, add_once
from pipeline.stages.aggregator import AggregateOptions, Aggregator

if TYPE_CHECKING:
    from pipeline.stages.worker_job import WorkOptions

pytestmark = [pytest.mark.integration, pytest.mark.live_path]


@pytest.fixture
def store(redis) -> StateStore:
    return StateStore(redis, f"test-{uuid.uuid4().hex[:10]}")


def test_apply_is_idempotent_per_worker_and_batch(store: StateStore) -> None:
    first = batch(0, 3, {(0, b"a"): 2, (0, b"b"): 1, (10_000, b"a"): 4})
    assert store.apply(first, n_sources=1) is True
    assert store.apply(first, n_sources=1) is False  # the same batch replayed
    assert store.apply(batch(0, 2, {(0, b"a"): 100}), n_sources=1) is False  # an older one
    assert store.partial(0, 0) == {b"a": 2, b"b": 1}
    assert store.partial(0, 10_000) == {b"a": 4}
    # Another worker's batch 3 is its own (worker, batch) pair.
    assert store.apply(batch(1, 3, {(0, b"a"): 5}), n_sources=1) is True
    assert store.apply(batch(0, 4, {(0, b"a"): 1}), n_sources=1) is True
    assert store.partial(0, 0) == {b"a": 3, b"b": 1}
    assert store.partial(1, 0) == {b"a": 5}
    assert store.applied_batches(3) == [4, 3, None]
    assert store.processed_per_worker(3).tolist() == [8, 5, 0]
    assert store.per_worker("batches", 2).tolist() == [2, 1]
    assert store.open_windows() == [0, 10_000]


def test_an_apply_that_finds_its_batch_applied_writes_for_its_wait_to_cover(
    store: StateStore, redis: Any
) -> None:
    """Two attempts of one task (a retry, a speculative copy) may run at once: one applies,
    the other finds the batch applied and changes nothing. Behind Sentinel each then WAITs for
    a replica, but WAIT covers only its own connection's writes: had the second written
    nothing, it would succeed at once while the first's apply was still on the primary alone,
    and a failover then would lose the batch Spark committed. So it writes
    ``applied:{worker}`` again (the same value), and its WAIT waits for both."""
    first = batch(0, 3, {(0, b"a"): 2})
    assert store.apply(first, n_sources=1) is True
    database = redis.connection_pool.connection_kwargs.get("db", 0)
    before = redis.config_get("notify-keyspace-events")["notify-keyspace-events"]
    events = redis.pubsub()
    redis.config_set("notify-keyspace-events", "K$")
    try:
        events.subscribe(f"__keyspace@{database}__:{store.keys.applied(0)}")
        assert events.get_message(timeout=5)["type"] == "subscribe"
        assert store.apply(first, n_sources=1) is False
        written = events.get_message(timeout=5)
    finally:
        events.close()
        redis.config_set("notify-keyspace-events", before)
    assert written is not None and written["data"] == b"set", written
    assert store.partial(0, 0) == {b"a": 2}
    assert store.applied_batches(1) == [3]


def offsets_apply(store: StateStore, first: int, last: int, count: int) -> int:
    """The apply script as a real-time writer runs it: rows at offsets ``first``..``last`` of
    worker 0's partition, ``count`` records of key ``a`` in window 0."""
    args = batch(0, 0, {(0, b"a"): count}).script_args(store.keys.prefix, 1)
    args[2:4] = [first, last]
    return int(store._apply(args=args))


def test_a_real_time_apply_is_guarded_by_the_offsets_it_covers(store: StateStore) -> None:
    """Offsets 0..9 applied; their replay, whole or in part, adds nothing; rows that straddle
    the applied offset are refused (-1) so that the writer drops the applied part first."""
    assert offsets_apply(store, 0, 9, 10) == 1
    assert offsets_apply(store, 0, 9, 10) == 0  # replayed whole
    assert offsets_apply(store, 3, 7, 5) == 0  # a replay cut differently
    assert offsets_apply(store, 5, 14, 10) == -1  # straddles: nothing applied
    assert offsets_apply(store, 10, 14, 5) == 1  # the part beyond offset 9
    assert offsets_apply(store, 16, 16, 1) == 1  # offset 15: a commit marker, never a row
    assert store.partial(0, 0) == {b"a": 16}
    assert store.applied_batches(1) == [16]


def test_additions_are_made_once_per_marker(store: StateStore) -> None:
    """The producers' truth and sent counts: a retried addition (a command whose reply was
    lost) adds nothing; another marker adds again."""
    prefix = store.keys.prefix
    truth, sent = f"{prefix}truth:0", f"{prefix}n"
    additions = [(truth, b"a", 2), (truth, b"b", 1), (sent, "", 5)]
    add_once(store.client, f"{prefix}added:x", additions)
    add_once(store.client, f"{prefix}added:x", additions)
    assert store.client.hgetall(truth) == {b"a": b"2", b"b": b"1"}
    assert store.client.get(sent) == b"5"
    add_once(store.client, f"{prefix}added:y", additions[2:])
    assert store.client.get(sent) == b"10"


def test_watermark_is_min_over_all_sources(store: StateStore) -> None:
    assert store.apply(batch(0, 0, {}, marks={0: 9_999}), n_sources=2)
    assert store.worker_watermarks(1) == [None]  # source 1 has not spoken yet
    assert store.apply(batch(0, 1, {}, marks={1: 4_999}), n_sources=2)
    assert store.worker_watermarks(1) == [4_999]
    assert store.apply(batch(0, 2, {}, marks={1: 19_999, 0: 1}), n_sources=2)
    assert store.worker_watermarks(1) == [9_999]  # source 0 never goes back to 1
    assert store.apply(batch(0, 3, {}, marks={0: int(END_OF_STREAM)}), n_sources=2)
    assert store.apply(batch(0, 4, {}, marks={1: int(END_OF_STREAM)}), n_sources=2)
    # Stored exactly, not as Lua's double.
    assert store.client.get(store.keys.wm(0)) == b"9223372036854775807"
    assert store.min_watermark(1) == END_OF_STREAM
    assert store.min_watermark(2) is None


def test_records_of_a_closed_window_count_as_late(store: StateStore) -> None:
    store.apply(batch(0, 0, {(0, b"a"): 2}), n_sources=1)
    assert store.close_window(0, n_workers=2).counts == [{b"a": 2}, {}]
    store.apply(batch(0, 1, {(0, b"a"): 3, (10_000, b"a"): 1}), n_sources=1)
    assert store.partial(0, 0) == {b"a": 2}  # frozen
    assert store.partial(0, 10_000) == {b"a": 1}
    assert store.per_worker("late", 1).tolist() == [3]
    assert store.processed_per_worker(1).tolist() == [6]


def test_big_batch_and_big_window(store: StateStore) -> None:
    # 30,000 pairs in one script call; 12,000 keys finalized in HSET chunks of 500 pairs.
    counts = {(w, f"k{i}".encode()): i % 7 + 1 for w in (0, 10_000) for i in range(15_000)}
    assert store.apply(batch(0, 0, counts), n_sources=1)
    merged = {f"k{i}".encode(): i % 7 + 1 for i in range(12_000)}
    assert store.finalize_window(0, 1, merged, [], state_entries=12_000)
    assert store.result(0) == merged


def test_finalize_once_and_atomically(store: StateStore) -> None:
    store.apply(batch(0, 0, {(0, b"a"): 2, (0, b"b"): 1}), n_sources=1)
    store.apply(batch(1, 0, {(0, b"a"): 5}), n_sources=1)
    partials = store.close_window(0, 2)
    assert partials.counts == [{b"a": 2, b"b": 1}, {b"a": 5}]
    assert partials.fields == []  # a run without state fields
    outcomes: list[bool] = []

    def finalize(counts: dict[bytes, int]) -> None:
        outcomes.append(store.finalize_window(0, 2, counts, [(b"a", 7)], state_entries=3))

    threads = [threading.Thread(target=finalize, args=({b"a": 7, b"b": i},)) for i in (1, 99)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [False, True]  # exactly one finalize happened
    result = store.result(0)
    assert result[b"a"] == 7 and result[b"b"] in (1, 99)
    assert store.topk(0) == [(b"a", 7)]
    assert store.state_keys() == []
    assert store.final_windows() == [0] and store.open_windows() == []
    totals = store.window_totals()
    assert totals["windows"] == 1 and totals["state_entries"] == 3
    assert totals["distinct_keys"] == 2 and totals["records"] == 7 + result[b"b"]
    # A rerun after a crash changes nothing.
    assert store.finalize_window(0, 2, {b"z": 1}, [], state_entries=1) is False
    assert store.result(0) == result


def test_sums_beside_counts_applied_once_merged_and_finalized(store: StateStore) -> None:
    big = 2**62  # int64 millionths travel through Redis as integers, never as Lua's double
    first = batch(
        0, 0, {(0, b"a"): 2, (0, b"b"): 1}, fields=[(SUMS, {(0, b"a"): big, (0, b"b"): -7})]
    )
    assert store.apply(first, n_sources=1)
    assert store.apply(first, n_sources=1) is False  # a replay adds nothing to the sums either
    assert store.apply(batch(1, 0, {(0, b"a"): 5}, fields=[(SUMS, {(0, b"a"): 3})]), n_sources=1)
    assert store.client.hgetall(store.keys.field(0, 0, 0)) == {b"a": str(big).encode(), b"b": b"-7"}
    assert store.client.hgetall(store.keys.state(0, 0)) == {b"a": b"2", b"b": b"1"}
    published: list[tuple[bytes, bytes]] = []
    options = AggregateOptions(workers=2, window_ms=10_000, run_id=store.keys.run_id)
    store.apply(batch(0, 1, {}, marks={0: int(END_OF_STREAM)}), n_sources=1)
    store.apply(batch(1, 1, {}, marks={0: int(END_OF_STREAM)}), n_sources=1)
    assert Aggregator(store, options, published.extend).step().finalized == [0]
    assert store.result(0) == {b"a": 7, b"b": 1}
    assert store.result_fields(0) == [{b"a": big + 3, b"b": -7}]
    assert store.state_keys() == []
    (value,) = [json.loads(v) for _, v in published]
    assert value["sums"] == {"a": "4611686018427.387907", "b": "-0.000007"}
    assert value["counts"] == {"a": 7, "b": 1}


def test_least_and_greatest_are_exact_at_int64s_edges_and_a_null_stays_null(
    store: StateStore,
) -> None:
    """A query's count, min and max of one column on two workers: a least and a greatest
    compared in Lua as int64 texts (2**62 + 1 and 2**62 are one double), a key whose records
    held no value keeps a count of 0 and no least or greatest (NULL, published as null), and
    the aggregator merges the workers' partials each as it merges."""
    count = StateField("count(ms)", "count", "ms")
    low, high = StateField("min(ms)", "min", "ms"), StateField("max(ms)", "max", "ms")
    top, bottom = 2**63 - 1, -(2**63)
    first = batch(0, 0, {(0, b"a"): 2, (0, b"n"): 1}, fields=[
        (count, {(0, b"a"): 2, (0, b"n"): 0}),
        (low, {(0, b"a"): 2**62 + 1}),
        (high, {(0, b"a"): 2**62}),
    ])  # fmt: skip
    assert store.apply(first, n_sources=1)
    assert store.apply(batch(0, 1, {(0, b"a"): 1}, fields=[
        (count, {(0, b"a"): 1}), (low, {(0, b"a"): 2**62}), (high, {(0, b"a"): 2**62 + 1}),
    ]), n_sources=1)  # fmt: skip
    assert store.client.hgetall(store.keys.field(1, 0, 0)) == {b"a": str(2**62).encode()}
    assert store.client.hgetall(store.keys.field(2, 0, 0)) == {b"a": str(2**62 + 1).encode()}
    assert store.apply(batch(1, 0, {(0, b"a"): 2}, fields=[
        (count, {(0, b"a"): 2}), (low, {(0, b"a"): bottom}), (high, {(0, b"a"): top}),
    ]), n_sources=1)  # fmt: skip
    assert store.apply(batch(1, 1, {(0, b"a"): 1}, fields=[
        (count, {(0, b"a"): 1}), (low, {(0, b"a"): -5}), (high, {(0, b"a"): -(2**62)}),
    ]), n_sources=1)  # fmt: skip
    assert store.client.hgetall(store.keys.field(1, 1, 0)) == {b"a": str(bottom).encode()}
    assert store.client.hgetall(store.keys.field(2, 1, 0)) == {b"a": str(top).encode()}
    # Another job's fields on this run's keys: refused, nothing written.
    other = batch(0, 2, {(0, b"a"): 1}, fields=[(SUMS, {(0, b"a"): 1})])
    with pytest.raises(redis.exceptions.ResponseError, match="keeps fields"):
        store.apply(other, n_sources=1)
    assert store.partial(0, 0) == {b"a": 3, b"n": 1}
    published: list[tuple[bytes, bytes]] = []
    options = AggregateOptions(workers=2, window_ms=10_000, run_id=store.keys.run_id)
    for worker in (0, 1):
        store.apply(batch(worker, 3, {}, marks={0: int(END_OF_STREAM)}), n_sources=1)
    assert Aggregator(store, options, published.extend).step().finalized == [0]
    assert store.result_fields(0) == [{b"a": 6, b"n": 0}, {b"a": bottom}, {b"a": top}]
    assert store.state_keys() == []
    (value,) = [json.loads(v) for _, v in published]
    assert value["count(ms)"] == {"a": 6, "n": 0}
    assert value["min(ms)"] == {"a": format_amount(bottom), "n": None}
    assert value["max(ms)"] == {"a": format_amount(top), "n": None}


def test_aggregator_closes_only_what_the_watermark_passed(store: StateStore) -> None:
    published: list[tuple[bytes, bytes]] = []
    options = AggregateOptions(workers=2, window_ms=10_000, top_k=1, run_id=store.keys.run_id)
    aggregator = Aggregator(store, options, published.extend)
    aggregator.check_config()
    store.apply(batch(0, 0, {(0, b"a"): 2, (10_000, b"b"): 1}, marks={0: 9_999}), 1)
    store.apply(batch(1, 0, {(0, b"a"): 3, (0, b"c"): 4}, marks={0: 4_000}), 1)
    assert aggregator.step().finalized == []  # worker 1 is still inside window 0
    store.apply(batch(1, 1, {}, marks={0: 9_999}), 1)
    step = aggregator.step()
    assert (step.finalized, step.published, step.finished) == ([0], [0], False)
    assert store.result(0) == {b"a": 5, b"c": 4}
    assert store.topk(0) == [(b"a", 5)]
    assert store.partial(0, 0) == {} and store.partial(0, 10_000) == {b"b": 1}
    assert [key for key, _ in published] == [b"0"]
    assert aggregator.step().published == []  # nothing twice
    for worker in (0, 1):
        store.apply(batch(worker, 5, {}, marks={0: int(END_OF_STREAM)}), 1)
    step = aggregator.step()
    assert (step.finalized, step.published, step.finished) == ([10_000], [10_000], True)
    assert len(published) == 2


def test_publication_is_retried_after_a_failure(store: StateStore) -> None:
    sent: list[tuple[bytes, bytes]] = []
    failures = [RuntimeError("broker gone")]

    def flaky_publish(records: list[tuple[bytes, bytes]]) -> None:
        if failures:
            raise failures.pop()
        sent.extend(records)

    options = AggregateOptions(workers=1, run_id=store.keys.run_id)
    aggregator = Aggregator(store, options, flaky_publish)
    store.apply(batch(0, 0, {(0, b"a"): 1}, marks={0: int(END_OF_STREAM)}), 1)
    with pytest.raises(RuntimeError):
        aggregator.step()
    assert store.final_windows() == [0] and store.unpublished_windows() == [0]
    step = aggregator.step()
    assert (step.finalized, step.published, step.finished) == ([], [0], True)
    assert len(sent) == 1


def test_kept_results_expire_once_checked_and_verify_adds_up_the_checks(
    store: StateStore,
) -> None:
    """``--keep-results``: a published window is checked against the truth once, its result,
    top-k and truth expire, and verify counts it from the checked totals: exact when every
    count matched, the first differences named when one did not; a restarted aggregator
    checks nothing twice."""
    from pipeline.runs.verify import verify_run

    keys = store.keys
    store.client.hset(keys.truth(0), mapping={b"a": 5, b"c": 4})
    store.client.hset(keys.truth(10_000), mapping={b"b": 2})
    store.client.hset(keys.truth(20_000), mapping={b"d": 1})
    store.client.set(keys.producer_sent(0), 12)
    options = AggregateOptions(
        workers=1, run_id=keys.run_id, keep_results_s=0, until_end=True, top_k=1
    )
    published: list[tuple[bytes, bytes]] = []
    store.apply(batch(0, 0, {(0, b"a"): 5, (0, b"c"): 4, (10_000, b"b"): 1}), 1)
    store.apply(batch(0, 1, {}, marks={0: 19_999}), 1)
    step = Aggregator(store, options, published.extend).step()
    assert step.published == [0, 10_000]
    assert store.unchecked_windows() == []
    gone = [keys.result(0), keys.topk(0), keys.truth(0), keys.result(10_000), keys.truth(10_000)]
    assert store.client.exists(*gone) == 0
    assert store.client.exists(keys.truth(20_000)) == 1  # not final yet: kept
    assert len(published) == 2  # the results topic has them
    # A restarted aggregator finds both checked: nothing is counted twice.
    assert store.retire_window(0, 0) is False
    store.apply(batch(0, 2, {(20_000, b"d"): 1}, marks={0: int(END_OF_STREAM)}), 1)
    assert Aggregator(store, options, published.extend).step().finished
    report = verify_run(store)
    assert (report.windows, report.keys, report.truth_records, report.result_records) == (
        3, 4, 12, 11,
    )  # fmt: skip
    assert not report.exact and report.mismatch_count == 1
    assert report.mismatches == [(10_000, b"b", 2, 1)]
    assert store.client.exists(*(keys.result(w) for w in (0, 10_000, 20_000))) == 0


def test_config_mismatch_is_refused(store: StateStore) -> None:
    assert store.claim_config(window_ms=10_000, workers=4) == {}
    # A run's declared state fields sit beside its settings (an aggregator started again
    # after the first apply declared them reads the settings still).
    store.apply(batch(0, 0, {(0, b"a"): 1}, fields=[(SUMS, {(0, b"a"): 1})]), n_sources=1)
    assert store.claim_config(window_ms=10_000, workers=4) == {}
    assert store.claim_config(window_ms=5_000, workers=4) == {"window_ms": (10_000, 5_000)}
    aggregator = Aggregator(
        store, AggregateOptions(workers=4, window_ms=5_000, run_id="x"), lambda _: None
    )
    with pytest.raises(ValueError, match="--window-ms 10000"):
        aggregator.check_config()


def test_verify_and_latency(store: StateStore) -> None:
    store.client.hset(store.keys.truth(0), mapping={b"a": 5, b"c": 4})
    store.client.hset(store.keys.truth(10_000), mapping={b"b": 1})
    store.client.hset(store.keys.result(0), mapping={b"a": 5, b"c": 4})
    store.client.sadd(store.keys.windows_final, 0)
    report = store.verify()
    assert (report.windows, report.keys, report.mismatch_count, report.exact) == (2, 3, 1, False)
    assert report.mismatches == [(10_000, b"b", 1, 0)]
    store.client.hset(store.keys.result(10_000), mapping={b"b": 1})
    assert store.verify().exact
    store.apply(batch(0, 0, {}, latency={20: 2, 3: 1}), 1)
    store.apply(batch(1, 0, {}, latency={20: 1}), 1)
    assert store.latency_histogram(2) == {20: 3, 3: 1}
    assert store.latency_histogram(2, worker=1) == {20: 1}


def job_options(store: StateStore, tmp_path: Path, **fields: Any) -> WorkOptions:
    """The worker job's options for ``store``'s run, W = 2, S = 1, no services (only
    ``prepare`` runs); ``fields`` override."""
    from pipeline.stages.worker_job import WorkOptions

    return WorkOptions(
        workers=2,
        sources=1,
        kafka_bootstrap="unused:1",
        redis_url="unused",
        checkpoint=tmp_path / "checkpoint",
        work_topic="unused",
        run_id=store.keys.run_id,
        **fields,
    )


def test_worker_job_refuses_starts_that_would_break_exactness(
    store: StateStore, tmp_path: Path
) -> None:
    from pipeline.stages.worker_job import WorkerConfigError, prepare

    options = job_options(store, tmp_path)
    prepare(options, store)  # a new run: fine, and it records window_ms and workers
    assert store.claim_config() == {}
    with pytest.raises(WorkerConfigError, match="window_ms=10000, not 5000"):
        prepare(dataclasses.replace(options, window_ms=5_000), store)
    store.apply(batch(1, 0, {(0, b"a"): 1}), n_sources=1)
    with pytest.raises(WorkerConfigError, match=r"checkpoint .* is new"):
        prepare(options, store)  # batch ids would restart at 0 and be skipped
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    (tmp_path / "checkpoint" / "offsets" / "0").write_text("v1")
    prepare(options, store)  # the run's own checkpoint: a restart


def test_a_real_time_worker_refuses_a_run_that_sums_amounts(
    store: StateStore, tmp_path: Path
) -> None:
    """The real-time writer runs in the JVM and reads no user's values: a run whose grouping
    stage sums amounts (``--sum``, recorded in Redis before it routes anything) is refused
    with one line, and a new checkpoint is no refusal (its applies are guarded by offsets)."""
    from pipeline.io import extractors
    from pipeline.io.kafka_io import RunNames
    from pipeline.stages import user_topic
    from pipeline.stages.worker_job import WorkerConfigError, prepare

    options = job_options(store, tmp_path, trigger="real-time")
    prepare(options, store)
    store.apply(batch(1, 0, {(0, b"a"): 1}), n_sources=1)
    prepare(options, store)  # state and a new checkpoint: the offsets keep it exact
    with pytest.raises(WorkerConfigError, match="real_time=1, not 0"):
        prepare(dataclasses.replace(options, trigger="micro-batch"), store)
    summed = user_topic.UserTopic(
        topic="orders",
        extractor=extractors.Extractor(
            key=extractors.parse_key("json:user"),
            time=extractors.parse_time("kafka-timestamp"),
            amount=extractors.parse_amount("json:price"),
        ),
    )
    user_topic.record(store.client, summed, RunNames(store.keys.run_id))
    with pytest.raises(WorkerConfigError, match=r"--trigger real-time keeps counts only, not sums"):
        prepare(options, store)

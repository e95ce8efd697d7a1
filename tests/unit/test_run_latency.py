"""A run's latency over time and its start-up timeline: the arithmetic on snapshots.

pipeline/runs/latency.py cuts the steady state and the 5-second windows out of cumulative
histogram snapshots; pipeline/runs/run_clock.py orders the run's events. Each test pins a
boundary a one-off error would move.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.runs.latency import (
    LatencySampler,
    Snapshot,
    histogram_difference,
    latency_windows,
    reached_steady,
    steady_cut,
    steady_histogram,
)
from pipeline.runs.run_clock import RunClock, summary_timing, timeline_lines

# Buckets: 20 per decade, so bucket 40 is (89.1, 100] ms and bucket 60 is (891, 1000] ms.
MS_100, MS_1000, MS_10000 = 40, 60, 80


def test_difference_keeps_only_the_buckets_that_grew() -> None:
    assert histogram_difference({1: 3, 2: 5, 3: 1}, {1: 3, 2: 2}) == {2: 3, 3: 1}
    assert histogram_difference({1: 3}, {}) == {1: 3}
    assert histogram_difference({1: 3}, {1: 3}) == {}


def test_the_steady_state_begins_at_exactly_20_percent() -> None:
    assert not reached_steady(199, 1000)
    assert reached_steady(200, 1000)
    snapshots = [
        Snapshot(1.0, {MS_10000: 100}),
        Snapshot(2.0, {MS_10000: 199}),
        Snapshot(3.0, {MS_10000: 200}),
        Snapshot(4.0, {MS_10000: 200, MS_100: 800}),
    ]
    cut = steady_cut(snapshots, 1000)
    assert cut is not None and cut.at == 3.0
    # The slow start-up records before the cut are out; the 800 after it are the steady state.
    assert steady_histogram(snapshots, 1000) == {MS_100: 800}


def test_no_steady_state_when_the_cut_is_the_last_snapshot_or_never_comes() -> None:
    assert steady_histogram([Snapshot(1.0, {}), Snapshot(2.0, {MS_100: 1000})], 1000) == {}
    assert steady_histogram([Snapshot(1.0, {MS_100: 100})], 1000) == {}
    assert steady_cut([], 1000) is None


def test_windows_split_the_run_by_wall_time_and_count_every_record_once() -> None:
    origin = 1000.0
    snapshots = [
        Snapshot(origin + 3.0, {}),  # producers started, nothing applied yet
        Snapshot(origin + 4.9, {}),
        Snapshot(origin + 5.0, {MS_10000: 10}),  # 5.0 s opens the window [5, 10)
        Snapshot(origin + 9.99, {MS_10000: 10, MS_1000: 90}),
        Snapshot(origin + 10.0, {MS_10000: 10, MS_1000: 90, MS_100: 5}),
        # nothing sampled in [15, 20): an empty window in the list
        Snapshot(origin + 20.5, {MS_10000: 10, MS_1000: 90, MS_100: 105}),
    ]
    windows = [w.as_dict() for w in latency_windows(snapshots, origin)]
    assert windows == [
        {"start_s": 5.0, "records": 100, "p50_ms": 1000.0, "p99_ms": 10000.0},
        {"start_s": 10.0, "records": 5, "p50_ms": 100.0, "p99_ms": 100.0},
        {"start_s": 15.0, "records": 0, "p50_ms": None, "p99_ms": None},
        {"start_s": 20.0, "records": 100, "p50_ms": 100.0, "p99_ms": 100.0},
    ]
    assert sum(w["records"] for w in windows) == snapshots[-1].records
    assert latency_windows(snapshots[:2], origin) == []


class FakeStore:
    """The two reads the sampler makes, from a list of (processed, histogram) states."""

    def __init__(self, histogram: dict[int, int]) -> None:
        self.histogram = histogram
        self.reads = 0

    def processed_per_worker(self, _workers: int) -> Any:
        import numpy as np

        self.reads += 1
        return np.array([sum(self.histogram.values())])

    def latency_histogram(self, _workers: int) -> dict[int, int]:
        return dict(self.histogram)


def test_the_sampler_polls_the_counters_often_and_snapshots_about_once_a_second() -> None:
    store = FakeStore({})
    sampler = LatencySampler(workers=1)
    sampler.poll(store)  # type: ignore[arg-type]
    sampler.poll(store)  # type: ignore[arg-type]  # too soon for either
    assert (store.reads, len(sampler.snapshots), sampler.first_applied) == (1, 1, None)
    sampler._next_poll = 0.0
    store.histogram = {MS_100: 3}
    sampler.poll(store)  # type: ignore[arg-type]
    first = sampler.first_applied
    assert first is not None and sampler.last_applied == first and len(sampler.snapshots) == 1
    sampler._next_poll = 0.0
    store.histogram = {MS_100: 5}
    sampler.poll(store)  # type: ignore[arg-type]
    assert sampler.first_applied == first and sampler.last_applied is not None
    last = sampler.last_applied
    sampler._next_poll = sampler._next_snapshot = 0.0
    sampler.poll(store)  # type: ignore[arg-type]  # no more records: the last stays
    assert (store.reads, len(sampler.snapshots), sampler.last_applied) == (4, 2, last)


def test_a_snapshot_that_sees_records_no_poll_saw_dates_them() -> None:
    sampler = LatencySampler(workers=1)
    snapshot = sampler.snapshot(FakeStore({MS_100: 2}))  # type: ignore[arg-type]
    assert sampler.first_applied == sampler.last_applied == snapshot.at


def test_the_timeline_is_in_time_order_with_gaps_and_the_summary_fields() -> None:
    clock = RunClock(started=100.0)
    for event, at in [
        ("services checked", 100.5),
        ("producers started", 130.0),
        ("verified", 150.0),
    ]:
        clock.mark_at(event, at)
    clock.mark_at("producers started", 140.0)  # a restarted stage: the first start counts
    sampler = LatencySampler(workers=1)
    sampler.first_applied, sampler.last_applied = 133.25, 137.0
    sampler.snapshots = [
        Snapshot(131.0, {}),
        Snapshot(134.0, {MS_10000: 20}),
        Snapshot(136.0, {MS_10000: 20, MS_100: 80}),
    ]
    timing = summary_timing(
        clock, sampler, 100, first_ms=130_400, last_ms=135_000, final_ms=136_500
    )
    assert timing["first_applied_seconds"] == 33.25
    # 20 % is reached at 134.0 s: the steady state is the 80 records after it.
    assert (timing["latency_steady_p50_ms"], timing["latency_steady_p99_ms"]) == (100.0, 100.0)
    assert timing["latency_windows"] == [
        {"start_s": 30.0, "records": 20, "p50_ms": 10000.0, "p99_ms": 10000.0},
        {"start_s": 35.0, "records": 80, "p50_ms": 100.0, "p99_ms": 100.0},
    ]
    assert [(e["event"], e["seconds"]) for e in timing["timeline"]] == [
        ("command started", 0.0),
        ("services checked", 0.5),
        ("producers started", 30.0),
        ("first record produced", 30.4),
        ("first record applied", 33.25),
        ("last record produced", 35.0),
        # Polled at 137.0, but every record was applied before the last window was final.
        ("last record applied", 36.5),
        ("every window final", 36.5),
        ("verified", 50.0),
    ]
    lines = timeline_lines(timing["timeline"])
    assert lines[0] == "     0.00 s  command started"
    assert lines[3] == "    30.40 s  first record produced     (+0.40 s)"


@pytest.mark.parametrize("event", ["first record applied", "verified"])
def test_an_event_the_run_did_not_see_is_left_out(event: str) -> None:
    clock = RunClock(started=5.0)
    clock.mark_at(event, None)
    assert clock.seconds(event) is None
    assert [e["event"] for e in clock.timeline()] == ["command started"]


def test_demo_prints_the_latency_side_by_side_and_with_timings_the_timeline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipeline.cli.demo import _print
    from pipeline.runs.plan import RunPlan
    from pipeline.runs.summary import RunSummary

    class Exact:
        exact = True

        def lines(self) -> list[str]:
            return ["exact"]

        def as_dict(self) -> dict[str, Any]:
            return {}

    summary = RunSummary(
        **{name: 0 for name in ("workers", "sources", "window_ms", "cpu_cost_us")},
        **{name: 0 for name in ("records_requested", "records_produced", "records_grouped")},
        scheme="pkg",
        run_id="r",
        workload="w",
        records_processed=10,
        per_worker=[10],
        latency_p50_per_worker=[794.3],
        latency_p99_per_worker=[5011.9],
        windows=1,
        verification=Exact(),  # type: ignore[arg-type]
        seconds=None,
        throughput=None,
        offered_rate=None,
        latency_p50_ms=794.3,
        latency_p99_ms=5011.9,
        imbalance_final=0.0,
        max_avg_ratio=1.0,
        replication=None,
        dead_letters=0,
        dead_letter_reasons={},
        stages={},
        restarts={},
        wall_seconds=1.0,
        latency_steady_p50_ms=631.0,
        latency_steady_p99_ms=1000.0,
        first_applied_seconds=31.25,
        latency_windows=[{"start_s": 30.0, "records": 10, "p50_ms": 631.0, "p99_ms": 1000.0}],
        timeline=[{"event": "command started", "seconds": 0.0}],
    )
    assert summary.as_json()["first_applied_seconds"] == 31.25
    assert summary.as_json()["timeline"] == summary.timeline
    plan = RunPlan(run_id="r", scheme="pkg", records=10)
    _print(plan, summary, None, json_out=False, timings=False)
    plain = capsys.readouterr().out
    assert (
        "latency (grouping stage to worker): p50 794.3 ms, p99 5,011.9 ms over the whole run; "
        "steady state (after 20 % of the records): p50 631.0 ms, p99 1,000.0 ms"
    ) in plain
    assert "first record applied: 31.2 s after the command" in plain
    assert "command started" not in plain
    _print(plan, summary, None, json_out=False, timings=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[len(plain.splitlines()) :] == [
        "timeline (seconds since the command, event, gap since the previous event):",
        "     0.00 s  command started",
        "latency per 5 s window of the run (start in seconds since the command):",
        " window s    records    p50 ms    p99 ms",
        "     30.0         10     631.0   1,000.0",
    ]

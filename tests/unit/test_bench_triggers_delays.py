"""`skewer bench triggers`' way from the producers to the grouping stage: each ``work``
record joined to its ``keys`` record on (producer, seq), cut to the steady state."""

from __future__ import annotations

import numpy as np

from bench.triggers import AppliedOffsets, RecordDelays, bound, end_to_end, join_delays


def test_records_are_joined_on_their_id_in_the_order_they_were_produced() -> None:
    produced_ids, produced_ms = np.array([7, 3, 5]), np.array([100, 90, 95])
    grouped_ids, grouped_ms = np.array([5, 3, 9, 7]), np.array([101, 99, 0, 130])
    joined = join_delays(produced_ids, produced_ms, grouped_ids, grouped_ms)
    assert joined.delays_ms.tolist() == [9.0, 6.0, 30.0]  # 3, 5, 7; 9 was never produced
    assert join_delays(np.zeros(0), np.zeros(0), grouped_ids, grouped_ms).delays_ms.size == 0


def test_the_steady_cut_leaves_out_the_first_fifth_produced() -> None:
    delays = RecordDelays(np.arange(10, dtype=np.float64))
    assert delays.steady().delays_ms.tolist() == list(range(2, 10))
    assert delays.quantile(1.0) is not None
    assert RecordDelays(np.zeros(0)).quantile(0.5) is None


def test_the_bound_on_produce_to_applied_takes_the_best_split() -> None:
    """P(X + Y > a + b) <= P(X > a) + P(Y > b): the least a + b that keeps the sum within
    1 - q, a over the histogram's bucket edges (1 ms, 10 ms here), b over Y's values."""
    way = RecordDelays(np.array([1.0] * 98 + [50.0] * 2))
    assert bound({0: 995, 20: 5}, way, 0.99) == 51.0  # 0.5 % of X above 1 ms, 2 % of Y at 50
    assert bound({0: 980, 20: 20}, way, 0.99) == 60.0  # 2 % of X above 1 ms: a = 10 ms
    assert bound({0: 100}, way, 0.5) == 2.0
    assert bound({}, way, 0.99) is None and bound({0: 1}, None, 0.99) is None


def test_a_record_is_applied_at_the_first_read_that_shows_its_offset() -> None:
    """``applied:{worker}`` is the last offset applied: a record counts as applied at the first
    read at or past its offset, and a record no read reached has no time."""
    seen = AppliedOffsets(
        {0: np.array([4, 9]), 1: np.array([0])}, {0: np.array([100.0, 130.0]), 1: np.array([7.0])}
    )
    partitions, offsets = np.array([0, 0, 0, 0, 1, 1]), np.array([2, 4, 5, 10, 0, 1])
    applied = seen.applied_ms(partitions, offsets)
    assert applied[:3].tolist() == [100.0, 100.0, 130.0] and applied[4] == 7.0
    assert np.isnan(applied[3]) and np.isnan(applied[5])


def test_exact_quantiles_are_the_records_own_times() -> None:
    delays = RecordDelays(np.array([1.0, 2.0, 3.0, 40.0]))
    assert delays.exact_quantile(0.5) == 3.0  # the higher of a tie, never under the truth
    assert delays.exact_quantile(0.99) == 40.0
    assert RecordDelays(np.zeros(0)).exact_quantile(0.5) is None


def test_produce_to_applied_is_measured_where_watched_and_a_bound_elsewhere() -> None:
    assert end_to_end({"e2e_p50_ms": 41.0, "e2e_p99_ms": 180.5}) == "41.0 / 180.5"
    bounded = {"e2e_p50_ms": None, "e2e_p50_bound_ms": 536.1, "e2e_p99_bound_ms": 943.9}
    assert end_to_end(bounded) == "<= 536.1 / <= 943.9"

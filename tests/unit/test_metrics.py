"""Metrics: hand-computed values and plain-Python references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import metrics


def reference_makespan(workers: list[int], speeds: list[float]) -> float:
    """Lindley's recursion per worker, record by record, in plain Python."""
    interarrival = 1.0 / sum(speeds)
    finish = [0.0] * len(speeds)
    for t, w in enumerate(workers):
        finish[w] = max(finish[w], t * interarrival) + 1.0 / speeds[w]
    return max(finish)


def test_imbalance_and_lambda_by_hand() -> None:
    assert metrics.imbalance(np.array([6, 2, 1, 3])) == 3.0  # 6 - 12/4
    assert metrics.max_avg_ratio(np.array([6, 2, 1, 3])) == 2.0
    rows = np.array([[1, 1, 1], [3, 0, 0], [0, 0, 0]])
    assert metrics.imbalance(rows).tolist() == [0.0, 2.0, 0.0]
    assert metrics.max_avg_ratio(rows).tolist() == [1.0, 3.0, 1.0]


def test_checkpoint_positions_are_even_and_end_at_m() -> None:
    assert metrics.checkpoint_positions(10, 4).tolist() == [3, 5, 8, 10]
    assert metrics.checkpoint_positions(3, 5).tolist() == [1, 2, 3]
    assert metrics.checkpoint_positions(1000, 100).tolist() == list(range(10, 1001, 10))
    with pytest.raises(ValueError):
        metrics.checkpoint_positions(0, 3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300), st.integers(0, 50))
def test_distinct_count_equals_a_set(values: list[int], repeats: int) -> None:
    data = np.array(values + values[:repeats] + [0] * (repeats % 3), dtype=np.int64)
    assert metrics.distinct_count(data) == len(set(data.tolist()))


def test_distinct_count_grows_past_its_first_table() -> None:
    values = np.random.default_rng(1).integers(0, 300_000, 500_000)
    assert metrics.distinct_count(values) == np.unique(values).size


def test_replication_by_hand() -> None:
    key_ids = np.array([1, 1, 2, 2, 3, 1])
    workers = np.array([0, 1, 0, 0, 2, 0])
    # pairs (1,0) (1,1) (2,0) (3,2): 4 pairs over 3 keys
    assert metrics.replication(key_ids, workers, 3) == pytest.approx(4 / 3)
    assert metrics.key_worker_counts(key_ids, workers, 3) == (3, 4)
    # key 0 is the hash table's empty marker, handled aside; workers past 64 use a second word
    assert metrics.key_worker_counts(np.array([0, 5, 0, 0]), np.array([0, 99, 70, 0]), 100) == (
        2,
        3,
    )
    with pytest.raises(ValueError, match=r"0\.\.2"):
        metrics.key_worker_counts(key_ids, workers + 1, 3)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 129)), min_size=1, max_size=200),
    st.booleans(),
)
def test_replication_equals_pairs_over_keys(pairs: list[tuple[int, int]], raw: bool) -> None:
    from operators.keys import KeyBatch

    keys = np.array([k for k, _ in pairs])
    key_ids = keys if raw else KeyBatch.from_ints(keys).key_ids()
    workers = np.array([w for _, w in pairs])
    expected = len(set(pairs)) / len({k for k, _ in pairs})
    assert metrics.replication(key_ids, workers, 130) == pytest.approx(expected)


def test_key_worker_counts_grow_past_the_first_table() -> None:
    rng = np.random.default_rng(2)
    keys = rng.integers(1, 200_000, 400_000)
    workers = rng.integers(0, 3, 400_000)
    pairs = np.unique(keys * 3 + workers).size
    assert metrics.key_worker_counts(keys, workers, 3) == (np.unique(keys).size, pairs)


def test_execution_time_by_hand() -> None:
    # W = 2, speed 1: arrivals every 1/2; one worker does all four: finishes 1, 2, 3, 4.
    assert metrics.execution_time(np.array([0, 0, 0, 0]), n_workers=2) == 4.0
    # alternating: worker 0 at 0 -> 1, 1 -> 2; worker 1 at .5 -> 1.5, 1.5 -> 2.5
    assert metrics.execution_time(np.array([0, 1, 0, 1]), n_workers=2) == 2.5
    # speeds 2 and 1: arrivals every 1/3; worker 0 serves in 1/2: 0.5, 1.0, 1.5;
    # worker 1 gets records arriving at 1, 4/3, 5/3: 2, 3, 4.
    speeds = np.array([2.0, 1.0])
    assert metrics.execution_time(np.array([0, 0, 0, 1, 1, 1]), speeds) == pytest.approx(4.0)
    # a backlog drains: worker 0 gets three in a row, then the others catch up on it
    assert metrics.execution_time(np.array([0, 0, 0, 1, 1, 1, 2, 2, 2]), n_workers=3) == (
        pytest.approx(reference_makespan([0, 0, 0, 1, 1, 1, 2, 2, 2], [1, 1, 1]))
    )


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=1, max_size=6).flatmap(
        lambda speeds: st.tuples(
            st.just(speeds),
            st.lists(st.integers(0, len(speeds) - 1), min_size=1, max_size=200),
        )
    )
)
def test_execution_time_equals_the_plain_recursion(
    case: tuple[list[float], list[int]],
) -> None:
    speeds, workers = case
    got = metrics.execution_time(np.array(workers), np.array(speeds))
    assert got == pytest.approx(reference_makespan(workers, speeds), rel=1e-12)


def test_execution_time_rejects_bad_speeds() -> None:
    with pytest.raises(ValueError, match="positive"):
        metrics.execution_time(np.array([0]), np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="n_workers"):
        metrics.execution_time(np.array([0]))

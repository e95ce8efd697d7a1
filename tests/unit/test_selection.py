"""The least-loaded selector (Storm's BalancedTargetSelector) against a pure-Python loop."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.selection import least_loaded


def reference_least_loaded(rows: list[list[int]], loads: list[int]) -> list[int]:
    chosen = []
    for row in rows:
        best = row[0]
        for candidate in row[1:]:
            if loads[candidate] < loads[best]:
                best = candidate
        loads[best] += 1
        chosen.append(best)
    return chosen


def test_storm_balanced_target_selector() -> None:
    """Storm's BalancedTargetSelectorTest: after tasks 9, 8 and 7 are each used once, choosing
    among [9, 8, 7, 6] returns 6 (task ids are our 0-based worker ids 0..9 here)."""
    loads = np.zeros(10, dtype=np.int64)
    used = least_loaded(np.array([[9], [8], [7]], dtype=np.int32), loads)
    assert used.tolist() == [9, 8, 7]
    assert least_loaded(np.array([[9, 8, 7, 6]], dtype=np.int32), loads).tolist() == [6]
    assert loads.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]


def test_storm_balanced_target_selector_on_four_workers() -> None:
    """The same test with the four tasks renumbered 0-based (9, 8, 7, 6 -> 3, 2, 1, 0)."""
    loads = np.zeros(4, dtype=np.int64)
    least_loaded(np.array([[3], [2], [1]], dtype=np.int32), loads)
    assert least_loaded(np.array([[3, 2, 1, 0]], dtype=np.int32), loads).tolist() == [0]


def test_ties_go_to_the_first_candidate_and_loads_update_in_place() -> None:
    loads = np.array([5, 5, 3], dtype=np.int64)
    rows = np.array([[1, 0], [0, 1], [2, 0], [2, 1], [2, 0], [2, 0]], dtype=np.int32)
    # by hand: 1 (tie 5=5), 0 (0 has 5 < 1 has 6), 2, 2, 2 (5 < 6), 0 (6=6, tie to first: 2)
    assert least_loaded(rows, loads).tolist() == [1, 0, 2, 2, 2, 2]
    assert loads.tolist() == [6, 6, 7]


def test_empty_batch() -> None:
    loads = np.zeros(3, dtype=np.int64)
    assert least_loaded(np.empty((0, 2), dtype=np.int32), loads).tolist() == []
    assert loads.tolist() == [0, 0, 0]


@given(st.integers(1, 8), st.integers(1, 4), st.data())
@settings(max_examples=100, deadline=None)
def test_matches_record_at_a_time_reference(n_workers: int, d: int, data: st.DataObject) -> None:
    rows = data.draw(
        st.lists(st.lists(st.integers(0, n_workers - 1), min_size=d, max_size=d), max_size=60)
    )
    start = data.draw(st.lists(st.integers(0, 5), min_size=n_workers, max_size=n_workers))
    loads = np.array(start, dtype=np.int64)
    candidates = np.array(rows, dtype=np.int32).reshape(len(rows), d)
    # Two batches, split anywhere, decide exactly as one record at a time.
    cut = data.draw(st.integers(0, len(rows)))
    got = least_loaded(candidates[:cut], loads).tolist()
    got += least_loaded(candidates[cut:], loads).tolist()
    expected_loads = list(start)
    assert got == reference_least_loaded(rows, expected_loads)
    assert loads.tolist() == expected_loads

"""Hopping windows are every window that holds a record's time; a key's sessions, split over
workers into partial sessions and merged, are the sessions of all its records in one place."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from operators.window_assign import hopping_windows, merge_sessions, session_intervals

TIMES = st.lists(st.integers(-100_000, 100_000), max_size=40)


@given(TIMES, st.integers(1, 50), st.integers(1, 50))
def test_a_record_is_in_every_hopping_window_that_holds_its_time(
    times: list[int], a: int, b: int
) -> None:
    slide, size = sorted((a * 1_000, b * 1_000))
    rows, starts = hopping_windows(np.array(times, dtype=np.int64), size, slide)
    for row, t in enumerate(times):
        mine = starts[rows == row].tolist()
        first = (t - size) // slide * slide
        expected = [s for s in range(first, t + 1, slide) if s <= t < s + size]
        assert mine == expected


def sessions_in_one_place(times: list[int], gap: int) -> list[tuple[int, int]]:
    """Sessions as the definition reads: sorted times, a new session after a pause > gap."""
    sessions: list[list[int]] = []
    for t in sorted(times):
        if sessions and t <= sessions[-1][1] + gap:
            sessions[-1][1] = t
        else:
            sessions.append([t, t])
    return [(first, last + gap) for first, last in sessions]


#: On a grid of seconds, so that records exactly a gap apart (they touch: one session) are common.
GRID_TIMES = st.lists(st.integers(-100, 100).map(lambda s: s * 1_000), max_size=40)


@given(GRID_TIMES, st.integers(1, 20).map(lambda s: s * 1_000), st.integers(1, 4), st.data())
def test_partial_sessions_of_any_split_merge_into_the_whole_keys_sessions(
    times: list[int], gap: int, workers: int, data: st.DataObject
) -> None:
    owners = data.draw(
        st.lists(st.integers(0, workers - 1), min_size=len(times), max_size=len(times))
    )
    partial = [
        session
        for w in range(workers)
        for session in session_intervals(
            np.array([t for t, o in zip(times, owners, strict=True) if o == w], dtype=np.int64),
            gap,
        )
    ]
    merged, into = merge_sessions(partial)
    assert merged == sessions_in_one_place(times, gap)
    for session, target in zip(partial, into, strict=True):
        assert merged[target][0] <= session[0] and session[1] <= merged[target][1]

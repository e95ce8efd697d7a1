"""Which windows a record falls in beyond tumbling ones: hopping windows, and sessions whose
parts, split over workers, merge exactly.

Layer: operators (pure). Spark's semantics (``window(t, size, slide)`` and
``session_window(t, gap)`` of Structured Streaming):

- A hopping window is ``[s, s + size)`` with ``s`` a multiple of ``slide``; a record at ``t``
  is in every one with ``s <= t < s + size``: ``ceil(size / slide)`` of them, or one fewer
  when ``slide`` does not divide ``size``.
- A record at ``t`` opens the session interval ``[t, t + gap)``; intervals that overlap or
  touch are one session (a record exactly ``gap`` after the last one joins it, as Spark merges
  sessions), from its first record's time to its last one's plus ``gap``.

Union is associative: the *partial sessions* of the records each worker holds, merged
(:func:`merge_sessions`), are the sessions of all the key's records in one place.

Example:
    >>> import numpy as np
    >>> rows, starts = hopping_windows(np.array([0, 25_000]), size_ms=30_000, slide_ms=10_000)
    >>> rows.tolist(), starts.tolist()
    ([0, 0, 0, 1, 1, 1], [-20000, -10000, 0, 0, 10000, 20000])
    >>> merge_sessions([(0, 5_000), (14_000, 19_000), (4_000, 9_000), (9_000, 14_000)])
    ([(0, 19000)], [0, 0, 0, 0])
    >>> merge_sessions([(0, 5_000), (12_000, 17_000), (4_000, 9_000)])
    ([(0, 9000), (12000, 17000)], [0, 1, 0])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def hopping_windows(
    event_time_ms: np.ndarray, size_ms: int, slide_ms: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, starts)``: row ``rows[i]`` of ``event_time_ms`` falls in the window starting at
    ``starts[i]``; each row's windows in ascending order."""
    if not 0 < slide_ms <= size_ms:
        raise ValueError(f"need 0 < slide <= size, got slide {slide_ms} and size {size_ms}")
    times = np.asarray(event_time_ms, dtype=np.int64)
    per_record = -(-size_ms // slide_ms)
    latest = times - np.mod(times, slide_ms)
    steps = np.arange(per_record - 1, -1, -1, dtype=np.int64) * slide_ms
    starts = latest[:, None] - steps[None, :]
    inside = times[:, None] < starts + size_ms
    rows = np.repeat(np.arange(times.shape[0], dtype=np.int64), per_record).reshape(starts.shape)
    return rows[inside], starts[inside]


def session_intervals(event_time_ms: np.ndarray, gap_ms: int) -> list[tuple[int, int]]:
    """The partial sessions of one key's records (any order): their intervals merged."""
    if gap_ms <= 0:
        raise ValueError(f"a session gap must be positive, got {gap_ms}")
    times = np.asarray(event_time_ms, dtype=np.int64).tolist()
    return merge_sessions([(t, t + gap_ms) for t in times])[0]


def merge_sessions(
    sessions: Sequence[tuple[int, int]],
) -> tuple[list[tuple[int, int]], list[int]]:
    """``[start, end)`` intervals that overlap or touch, merged: the merged sessions in time
    order, and for each input the index of the merged session it is part of."""
    order = sorted(range(len(sessions)), key=lambda i: sessions[i])
    merged: list[tuple[int, int]] = []
    into = [0] * len(sessions)
    for i in order:
        start, end = sessions[i]
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
        into[i] = len(merged) - 1
    return merged, into

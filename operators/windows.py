"""Tumbling event-time windows of the live pipeline: count per (window, key), close, merge, top-k.

Layer: operators (pure functions; the Spark workers, the state store and the aggregator call
them). The streaming top-k word count of Nasir et al., "The Power of Both Choices", ICDE 2015,
§III-A: every worker keeps partial counts, an aggregator sums them per key and takes the top-k
of the merged counts. Windows are ``[start, start + window_ms)`` and close once the watermark
reaches ``start + window_ms - 1`` (plus allowed lateness); top-k ties go to the key's bytes.
Why: docs/schemes.md#windows and docs/design.md#closing-a-window.

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> counted = count_per_window_key(KeyBatch.from_strings(["a", "b", "a", "a"]),
    ...                                np.array([0, 0, 0, 10_000]))
    >>> counted.windows.tolist(), counted.keys.to_list(), counted.counts.tolist()
    ([0, 0, 10000], [b'a', b'b', b'a'], [2, 1, 1])
    >>> closable_windows(np.array([20_000, 0, 10_000]), watermark=19_999, window_ms=10_000)
    array([    0, 10000])
    >>> merged = merge_partials([{b"a": 2, b"b": 1}, {b"a": 5}])
    >>> merged
    {b'a': 7, b'b': 1}
    >>> top_k(merged, 1)
    [(b'a', 7)]
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from operators.keys import KeyBatch


@dataclass(frozen=True)
class WindowCounts:
    """Distinct (window, key) pairs of a batch and how many records each had.

    Sorted by window, then by the key's fingerprint (``KeyBatch.key_ids``): deterministic.
    """

    windows: np.ndarray  # int64 window starts, one per pair
    keys: KeyBatch  # the key of each pair
    counts: np.ndarray  # int64 records per pair

    def __len__(self) -> int:
        return self.windows.shape[0]

    @property
    def records(self) -> int:
        return int(self.counts.sum())


def count_per_window_key(
    keys: KeyBatch,
    window_starts: np.ndarray,
    key_ids: np.ndarray | None = None,
) -> WindowCounts:
    """Count records per (window, key), vectorized over the whole batch (the partial states of
    a query's other aggregates: :mod:`operators.aggregates`).

    Records are grouped by (window, 64-bit key fingerprint) with one sort; each group is then
    checked byte for byte against its first record, so a fingerprint collision cannot merge two
    keys: if one is found (about n²/2⁶⁵ of the time) the batch is grouped by the key bytes
    themselves instead. ``key_ids`` defaults to ``keys.key_ids()`` (tests pass colliding ids).
    """
    n = len(keys)
    windows = np.asarray(window_starts, dtype=np.int64)
    if windows.shape != (n,):
        raise ValueError(f"need one window start per key: {windows.shape} vs {n} keys")
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return WindowCounts(empty, KeyBatch.from_bytes([]), empty.copy())
    grouped = sorted_groups(keys, windows, key_ids)
    if grouped is None:
        return _count_by_bytes(keys, windows)
    order, group_starts = grouped
    first_of_group = order[group_starts]
    counts = np.diff(np.append(group_starts, n)).astype(np.int64)
    return WindowCounts(windows[first_of_group], keys.take(first_of_group), counts)


def sorted_groups(
    keys: KeyBatch, windows: np.ndarray, key_ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows grouped by (window, key) with one sort on (window, key fingerprint): ``(order,
    starts)``, group g's rows at ``order[starts[g]:starts[g + 1]]``; None if two keys in one
    group differ (a fingerprint collision), for the caller to group on the bytes instead."""
    n = len(keys)
    ids = keys.key_ids() if key_ids is None else np.asarray(key_ids, dtype=np.int64)
    order = np.lexsort((ids, windows))
    sorted_windows = windows[order]
    sorted_ids = ids[order]
    starts_group = np.ones(n, dtype=bool)
    starts_group[1:] = (sorted_windows[1:] != sorted_windows[:-1]) | (
        sorted_ids[1:] != sorted_ids[:-1]
    )
    group_starts = np.flatnonzero(starts_group)
    representative = order[group_starts][np.cumsum(starts_group) - 1]
    if not _same_keys(keys.take(order), keys.take(representative)):
        return None
    return order, group_starts


def _same_keys(left: KeyBatch, right: KeyBatch) -> bool:
    """Key i of ``left`` equals key i of ``right`` for every i (same lengths, same bytes)."""
    return np.array_equal(left.offsets, right.offsets) and np.array_equal(left.data, right.data)


def _count_by_bytes(keys: KeyBatch, windows: np.ndarray) -> WindowCounts:
    """The exact fallback after a fingerprint collision: group on the bytes themselves."""
    counted = Counter(zip(windows.tolist(), keys.to_list(), strict=True))
    pairs = sorted(counted)
    return WindowCounts(
        np.array([window for window, _ in pairs], dtype=np.int64),
        KeyBatch.from_bytes([key for _, key in pairs]),
        np.array([counted[pair] for pair in pairs], dtype=np.int64),
    )


def closable_windows(
    window_starts: np.ndarray, watermark: int | None, window_ms: int, lateness_ms: int = 0
) -> np.ndarray:
    """The window starts whose windows are complete under ``watermark``, ascending.

    Complete means ``watermark >= start + window_ms - 1 + lateness_ms`` (module docstring);
    ``None`` (some worker has no watermark yet) closes nothing.
    """
    if window_ms < 1 or lateness_ms < 0:
        raise ValueError("window_ms must be >= 1 and lateness_ms >= 0")
    starts = np.sort(np.asarray(window_starts, dtype=np.int64))
    if watermark is None:
        return starts[:0]
    # In Python ints: start + length + lateness may pass int64 when the watermark is huge.
    last_closable = int(watermark) - window_ms + 1 - lateness_ms
    if last_closable < int(np.iinfo(np.int64).min):
        return starts[:0]
    return starts[starts <= last_closable]


def merge_partials(partials: Sequence[Mapping[bytes, int]]) -> dict[bytes, int]:
    """Final count (or sum) per key: the sum of its partials over the workers that hold it."""
    merged: Counter[bytes] = Counter()
    for partial in partials:
        merged.update(partial)
    return dict(merged)


def state_entries(partials: Sequence[Mapping[bytes, int]]) -> int:
    """(key, worker) state entries: the memory the partial states took (PKG §V-Q4)."""
    return sum(len(partial) for partial in partials)


def top_k(counts: Mapping[bytes, int], k: int) -> list[tuple[bytes, int]]:
    """The ``k`` keys with the highest counts, highest first; ties by key bytes, ascending."""
    if k < 0:
        raise ValueError("k must be >= 0")
    return heapq.nsmallest(k, counts.items(), key=lambda item: (-item[1], item[0]))

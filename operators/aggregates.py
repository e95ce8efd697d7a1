"""A query's aggregates as mergeable partial states: a batch's partials per (window, key), the
merge of a split key's partials, and the value SQL defines.

Layer: operators (pure). Key splitting (PKG, D-/W-Choices, FISH) leaves a hot key's records on
several workers; each keeps a *partial state*, merged once the window closes (Nasir et al., "The
Power of Both Choices", ICDE 2015, §III-A, for counts). Every aggregate's merge is exact: the
merge of any split equals the state of all the key's records in one place. The states, their
merges and the sketches chosen: docs/query.md#how-a-split-keys-state-merges. Numbers are int64
millionths, text is bytes; NULLs are skipped, as SQL skips them.

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> groups = group_rows(KeyBatch.from_strings(["a", "b", "a"]), np.array([0, 0, 0]))
    >>> groups.keys.to_list(), scalar_partials(groups, np.array([5, 7, 9]), None).total.tolist()
    ([b'a', b'b'], [14, 7])
    >>> parts = [ScalarState(2, 14_000_000, None, None), ScalarState(1, 1_000_000, None, None)]
    >>> final("avg", parts), final("sum", parts)
    (Decimal('5.0000000000'), Decimal('15.000000'))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

import numpy as np

from operators.keys import KeyBatch
from operators.sketches import log_buckets
from operators.windows import sorted_groups

#: Digits after the point of a number (int64 millionths), and of an average (Spark's avg of a
#: DECIMAL(p, s) has s + 4).
DIGITS = 6
AVERAGE_DIGITS = DIGITS + 4
INT64 = np.iinfo(np.int64)


@dataclass(frozen=True)
class Groups:
    """A batch's rows grouped by (window, key): ``order`` lists the rows group by group, group
    ``g``'s rows at ``order[starts[g]:starts[g + 1]]``; groups sorted by window."""

    order: np.ndarray
    starts: np.ndarray
    windows: np.ndarray
    keys: KeyBatch

    def __len__(self) -> int:
        return self.starts.shape[0]

    def of_sorted_rows(self) -> np.ndarray:
        """The group of each row of ``order``."""
        sizes = np.diff(np.append(self.starts, self.order.shape[0]))
        return np.repeat(np.arange(len(self), dtype=np.int64), sizes)


def group_rows(
    keys: KeyBatch, window_starts: np.ndarray, key_ids: np.ndarray | None = None
) -> Groups:
    """Group rows by (window, key) as :func:`operators.windows.count_per_window_key` does (one
    sort on fingerprints), on the key bytes themselves after a fingerprint collision
    (``key_ids``: the fingerprints, tests pass colliding ones)."""
    windows = np.asarray(window_starts, dtype=np.int64)
    if len(keys) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Groups(empty, empty.copy(), empty.copy(), KeyBatch.from_bytes([]))
    grouped = sorted_groups(keys, windows, key_ids)
    if grouped is None:
        key_list = keys.to_list()
        rows = sorted(range(len(key_list)), key=lambda row: (int(windows[row]), key_list[row]))
        order = np.array(rows, dtype=np.int64)
        new = np.ones(order.size, dtype=bool)
        new[1:] = [
            (int(windows[a]), key_list[a]) != (int(windows[b]), key_list[b])
            for a, b in zip(rows[1:], rows[:-1], strict=True)
        ]
        grouped = order, np.flatnonzero(new)
    order, starts = grouped
    first = order[starts]
    return Groups(order, starts, windows[first], keys.take(first))


class ScalarState(NamedTuple):
    """The partial state of ``count``, ``sum``, ``avg``, ``min`` and ``max`` of one group:
    non-null values, their sum, their least and greatest (None: no value)."""

    count: int
    total: int
    low: int | None
    high: int | None


@dataclass(frozen=True)
class ScalarPartials:
    """:class:`ScalarState` of every group of a batch, as arrays (``low``/``high`` where
    ``count`` is 0 are meaningless)."""

    count: np.ndarray
    total: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def state(self, group: int) -> ScalarState:
        seen = int(self.count[group]) > 0
        low, high = int(self.low[group]), int(self.high[group])
        return ScalarState(
            int(self.count[group]),
            int(self.total[group]),
            low if seen else None,
            high if seen else None,
        )


def scalar_partials(
    groups: Groups, values: np.ndarray | None, valid: np.ndarray | None
) -> ScalarPartials:
    """Each group's :class:`ScalarState` over int64 ``values`` (None: ``count(*)``, every row a
    value of 0) where ``valid`` (None: every row)."""
    n = groups.order.shape[0]
    if len(groups) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ScalarPartials(empty, empty, empty, empty)
    v = np.zeros(n, dtype=np.int64) if values is None else np.asarray(values, np.int64)
    ok = np.ones(n, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    v, ok = v[groups.order], ok[groups.order]
    return ScalarPartials(
        np.add.reduceat(ok.astype(np.int64), groups.starts),
        np.add.reduceat(np.where(ok, v, 0), groups.starts),
        np.minimum.reduceat(np.where(ok, v, INT64.max), groups.starts),
        np.maximum.reduceat(np.where(ok, v, INT64.min), groups.starts),
    )


#: How each part of a :class:`ScalarState` merges: two partial states of one key add their
#: counts and sums and keep the least and the greatest of their extremes.
PART_MERGES = {"count": "add", "sum": "add", "min": "min", "max": "max"}


class StateField(NamedTuple):
    """One part of a column's :class:`ScalarState` that a run keeps per (window, key): ``part``
    one of :data:`PART_MERGES`, of column ``column`` (None: ``--sum``'s amount), published as
    ``name``. A part with no value yet (``sum``, ``min``, ``max`` of no non-null value) is
    absent, as SQL's NULL."""

    name: str
    part: str
    column: str | None

    @property
    def merge(self) -> str:
        return PART_MERGES[self.part]


def field_values(field: StateField, partials: ScalarPartials) -> tuple[np.ndarray, np.ndarray]:
    """``field``'s value per group of ``partials``, and where it has one (a count always)."""
    if field.part == "count":
        return partials.count, np.ones(partials.count.shape[0], dtype=bool)
    array = {"sum": partials.total, "min": partials.low, "max": partials.high}[field.part]
    return array, partials.count > 0


def merge_maps(merge: str, partials: Sequence[Mapping[bytes, int]]) -> dict[bytes, int]:
    """Per key, its values in ``partials`` merged by ``merge`` (:data:`PART_MERGES`'s values).

    >>> merge_maps("min", [{b"a": 5, b"b": 1}, {b"a": -2}])
    {b'a': -2, b'b': 1}
    """
    merged: dict[bytes, int] = {}
    for partial in partials:
        for key, value in partial.items():
            old = merged.get(key)
            if old is None:
                merged[key] = value
            elif merge == "add":
                merged[key] = old + value
            else:
                merged[key] = min(old, value) if merge == "min" else max(old, value)
    return merged


def column_state(
    fields: Sequence[StateField], merged: Sequence[Mapping[bytes, int]], column: str, key: bytes
) -> ScalarState:
    """``key``'s :class:`ScalarState` of ``column`` from the merged maps of ``fields`` (a part
    not kept reads as none)."""
    parts = {f.part: m.get(key) for f, m in zip(fields, merged, strict=True) if f.column == column}
    return ScalarState(
        parts.get("count") or 0, parts.get("sum") or 0, parts.get("min"), parts.get("max")
    )


def element_partials(groups: Groups, values: KeyBatch, valid: np.ndarray) -> list[set[bytes]]:
    """Each group's set of non-null values (``count(DISTINCT)``; what a HyperLogLog adds)."""
    members = values.to_list()
    sets: list[set[bytes]] = [set() for _ in range(len(groups))]
    for group, row in zip(groups.of_sorted_rows().tolist(), groups.order.tolist(), strict=True):
        if valid[row]:
            sets[group].add(members[row])
    return sets


def bucket_partials(groups: Groups, values: np.ndarray, valid: np.ndarray) -> list[Counter[int]]:
    """Each group's bucket counts (:mod:`.sketches.log_buckets`) of its non-null values."""
    indices = log_buckets.indices(np.asarray(values, dtype=np.int64))
    sketches: list[Counter[int]] = [Counter() for _ in range(len(groups))]
    for group, row in zip(groups.of_sorted_rows().tolist(), groups.order.tolist(), strict=True):
        if valid[row]:
            sketches[group][int(indices[row])] += 1
    return sketches


def merge_scalars(states: Sequence[ScalarState]) -> ScalarState:
    lows = [s.low for s in states if s.low is not None]
    highs = [s.high for s in states if s.high is not None]
    return ScalarState(
        sum(s.count for s in states),
        sum(s.total for s in states),
        min(lows) if lows else None,
        max(highs) if highs else None,
    )


def final(function: str, states: Sequence[object], quantile: float = 0.5) -> object:
    """The value of ``function`` over a key's merged partial states (one per worker that held
    the key), as SQL defines it: NULL (None) for ``sum``/``min``/``max``/``avg``/a quantile of
    no values, 0 for a count of none; numbers as Decimals of :data:`DIGITS` places."""
    if function in ("count(DISTINCT)", "approx_count_distinct"):
        return len(set().union(*states))  # type: ignore[arg-type]
    if function == "percentile_approx":
        merged: Counter[int] = Counter()
        for sketch in states:
            merged.update(sketch)  # type: ignore[arg-type]
        return _decimal(log_buckets.quantile(merged, quantile)) if merged else None
    state = merge_scalars(states)  # type: ignore[arg-type]
    if function in ("count(*)", "count"):
        return state.count
    if state.count == 0:
        return None
    if function == "sum":
        return _decimal(state.total)
    if function == "avg":
        # In integers, so the one rounding is Spark's: half away from zero, at AVERAGE_DIGITS.
        quotient, remainder = divmod(
            abs(state.total) * 10 ** (AVERAGE_DIGITS - DIGITS), state.count
        )
        quotient += 2 * remainder >= state.count
        return Decimal(-quotient if state.total < 0 else quotient).scaleb(-AVERAGE_DIGITS)
    return _decimal(state.low if function == "min" else state.high)  # type: ignore[arg-type]


def _decimal(millionths: int) -> Decimal:
    return Decimal(millionths).scaleb(-DIGITS)

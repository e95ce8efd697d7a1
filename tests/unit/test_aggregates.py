"""Every aggregate's partial states, split over workers in any way and merged, give the value of
all a key's records in one place, and that value is SQL's."""

from __future__ import annotations

import math
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from operators import aggregates as agg
from operators.keys import KeyBatch
from operators.sketches import log_buckets

ROWS = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"hot"]),
        st.sampled_from([0, 10_000]),
        st.one_of(st.none(), st.integers(-(10**12), 10**12)),
        st.one_of(st.none(), st.sampled_from([b"u1", b"u2", b"u3", b""])),
        st.integers(0, 3),
    ),
    max_size=60,
)
FUNCTIONS = ["count(*)", "count", "sum", "min", "max", "avg"]


def worker_states(rows: list[tuple]) -> dict[tuple[int, bytes], dict[str, object]]:
    """One worker's partial states per (window, key) for every function, from its rows."""
    keys = KeyBatch.from_bytes([r[0] for r in rows])
    groups = agg.group_rows(keys, np.array([r[1] for r in rows], dtype=np.int64))
    numbers = np.array([r[2] or 0 for r in rows], dtype=np.int64)
    has_number = np.array([r[2] is not None for r in rows], dtype=bool)
    texts = KeyBatch.from_bytes([r[3] or b"" for r in rows])
    has_text = np.array([r[3] is not None for r in rows], dtype=bool)
    star = agg.scalar_partials(groups, None, None)
    scalars = agg.scalar_partials(groups, numbers, has_number)
    elements = agg.element_partials(groups, texts, has_text)
    buckets = agg.bucket_partials(groups, numbers, has_number)
    out = {}
    for g, (window, key) in enumerate(
        zip(groups.windows.tolist(), groups.keys.to_list(), strict=True)
    ):
        out[window, key] = {
            "*": star.state(g),
            "x": scalars.state(g),
            "set": elements[g],
            "sketch": buckets[g],
        }
    return out


def sql(function: str, rows: list[tuple]) -> object:
    """The aggregate as SQL defines it, written plainly."""
    numbers = [r[2] for r in rows if r[2] is not None]
    if function == "count(*)":
        return len(rows)
    if function == "count":
        return len(numbers)
    if function == "count(DISTINCT)":
        return len({r[3] for r in rows if r[3] is not None})
    if not numbers:
        return None
    as_decimal = [Decimal(n).scaleb(-6) for n in numbers]
    if function == "avg":
        return (sum(as_decimal) / len(numbers)).quantize(Decimal("1E-10"), ROUND_HALF_UP)
    return {"sum": sum(as_decimal), "min": min(as_decimal), "max": max(as_decimal)}[function]


@given(ROWS, st.integers(1, 4), st.floats(0.0, 1.0))
def test_merged_partials_of_any_split_are_sqls_value_of_the_whole(
    rows: list[tuple], workers: int, q: float
) -> None:
    per_worker = [worker_states([r for r in rows if r[4] % workers == w]) for w in range(workers)]
    by_group: dict[tuple[int, bytes], list[tuple]] = defaultdict(list)
    for row in rows:
        by_group[row[1], row[0]].append(row)
    for group, mine in by_group.items():
        parts = [states[group] for states in per_worker if group in states]
        for function in FUNCTIONS:
            which = "*" if function == "count(*)" else "x"
            assert agg.final(function, [p[which] for p in parts]) == sql(function, mine), function
        distinct = agg.final("count(DISTINCT)", [p["set"] for p in parts])
        assert distinct == sql("count(DISTINCT)", mine)
        numbers = sorted(r[2] for r in mine if r[2] is not None)
        estimate = agg.final("percentile_approx", [p["sketch"] for p in parts], q)
        if not numbers:
            assert estimate is None
            continue
        exact = Decimal(numbers[max(1, math.ceil(q * len(numbers))) - 1]).scaleb(-6)
        assert abs(estimate - exact) <= Decimal(log_buckets.RELATIVE_ERROR) * abs(exact)  # type: ignore[operator]


def test_an_empty_batch_has_no_groups() -> None:
    groups = agg.group_rows(KeyBatch.from_bytes([]), np.zeros(0, dtype=np.int64))
    assert len(groups) == 0 and len(agg.scalar_partials(groups, None, None).count) == 0


def test_sums_follow_the_counts_with_and_without_a_collision() -> None:
    """Grouped on fingerprints, or on the bytes after two keys' fingerprints collide (every id
    0 here): each (window, key) gets its own rows' sum."""
    keys = KeyBatch.from_strings(["a", "b", "a", "bb", "a"])
    windows = np.array([0, 0, 0, 0, 10])
    amounts = np.array([5, -1, 7, 2**40, 3])
    expected = {(0, b"a"): (2, 12), (0, b"b"): (1, -1), (0, b"bb"): (1, 2**40), (10, b"a"): (1, 3)}
    for ids in (None, np.zeros(5, dtype=np.int64)):
        groups = agg.group_rows(keys, windows, key_ids=ids)
        partials = agg.scalar_partials(groups, amounts, None)
        pairs = zip(groups.windows.tolist(), groups.keys.to_list(), strict=True)
        got = zip(pairs, partials.count.tolist(), partials.total.tolist(), strict=True)
        assert {pair: (count, total) for pair, count, total in got} == expected

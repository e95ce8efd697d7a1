"""The log-linear quantile sketch: every value in its bucket, buckets in value order, a split
sketch merged equal to the whole, quantiles within the documented relative error."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from operators.sketches import log_buckets as lb

VALUES = st.lists(st.integers(-(2**62) + 1, 2**62 - 1), min_size=1, max_size=200)
EDGES = [0, 1, 255, 256, 257, 2**53 - 1, 2**53, 2**53 + 1, 2**62 - 1]


def width(index: int) -> int:
    return 1 if abs(index) < 2 * lb.SUB else 1 << (abs(index) // lb.SUB - 1)


@given(VALUES)
def test_each_value_lies_in_its_bucket_and_indices_follow_values(values: list[int]) -> None:
    values = sorted(values + EDGES + [-e for e in EDGES])
    indices = lb.indices(np.array(values, dtype=np.int64)).tolist()
    for value, index in zip(values, indices, strict=True):
        assert lb.lower(index) <= abs(value) < lb.lower(index) + width(index)
        assert (index < 0) == (value < 0)
    assert indices == sorted(indices)


@given(VALUES, st.integers(1, 4), st.data())
def test_a_split_sketch_merged_is_the_sketch_of_the_whole(
    values: list[int], parts: int, data: st.DataObject
) -> None:
    owner = data.draw(
        st.lists(st.integers(0, parts - 1), min_size=len(values), max_size=len(values))
    )
    whole = Counter(lb.indices(np.array(values, dtype=np.int64)).tolist())
    merged: Counter[int] = Counter()
    for part in range(parts):
        mine = [v for v, o in zip(values, owner, strict=True) if o == part]
        merged.update(lb.indices(np.array(mine, dtype=np.int64)).tolist())
    assert merged == whole


@given(VALUES, st.floats(0.0, 1.0))
def test_a_quantile_is_within_the_relative_error_of_the_exact_value_of_its_rank(
    values: list[int], q: float
) -> None:
    sketch = Counter(lb.indices(np.array(values, dtype=np.int64)).tolist())
    exact = sorted(values)[max(1, math.ceil(q * len(values))) - 1]
    estimate = lb.quantile(sketch, q)
    assert abs(estimate - exact) <= lb.RELATIVE_ERROR * abs(exact)
    assert (estimate < 0) == (exact < 0) or exact == 0 == estimate

"""The log-linear quantile sketch: every value in its bucket, buckets in value order, a split
sketch merged equal to the whole, quantiles within the documented relative error; and the
golden vectors the Java twin is tested on (jvm/sketches): ``.venv/bin/python
tests/unit/test_log_buckets.py`` writes them again (only when the definition changes)."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

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


#: The values, bucket index, bucket's lower bound and representative both languages must give.
VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "log_buckets.tsv"


def vector_values() -> list[int]:
    """Every edge (each power of two, one below and one above it, both signs, the exact range's
    ends) and a seeded spread of magnitudes."""
    edges = {0, 1, 127, 128, 129, 255, 256, 257, 2**62 - 1}
    for k in range(62):
        edges |= {2**k - 1, 2**k, 2**k + 1}
    spread = random.Random(55)
    edges |= {spread.randrange(2 ** spread.randrange(1, 62)) for _ in range(300)}
    return sorted(edges | {-v for v in edges})


def write_vectors() -> None:
    values = vector_values()
    indices = lb.indices(np.array(values, dtype=np.int64)).tolist()
    lines = [
        "# value\tindex\tlower(index)\trepresentative(index): operators/sketches/log_buckets.py"
    ]
    lines += [
        f"{v}\t{i}\t{lb.lower(i)}\t{lb.representative(i)}"
        for v, i in zip(values, indices, strict=True)
    ]
    VECTORS.write_text("\n".join(lines) + "\n")


def read_vectors() -> list[tuple[int, int, int, int]]:
    rows = [line.split("\t") for line in VECTORS.read_text().splitlines() if line[:1] != "#"]
    return [(int(v), int(i), int(low), int(mid)) for v, i, low, mid in rows]


def test_the_golden_vectors_hold_the_definition_and_pythons_sketch_gives_them() -> None:
    rows = read_vectors()
    assert [row[0] for row in rows] == vector_values()
    for value, index, low, middle in rows:
        assert low <= abs(value) < low + width(index) and (index < 0) == (value < 0)
        assert abs(middle) - low == width(index) // 2 and (middle < 0) == (index < 0)
    values = np.array([row[0] for row in rows], dtype=np.int64)
    assert lb.indices(values).tolist() == [row[1] for row in rows]
    assert [(lb.lower(r[1]), lb.representative(r[1])) for r in rows] == [r[2:] for r in rows]


if __name__ == "__main__":
    write_vectors()

"""A log-linear bucket histogram of exact decimals: a quantile sketch whose merge is addition.

Layer: operators. The bucketing of HdrHistogram (Tene) and of DDSketch's "log-like" mappings
(Masson, Rim, Lee, "DDSketch: A Fast and Fully-Mergeable Quantile Sketch with Relative-Error
Guarantees", VLDB 2019, §2), on the integers skewer keeps numbers as (millionths): a value ``v``
with ``|v| < 2^(SUB_BITS+1)`` is a bucket of its own; above, with ``e = floor(log2 |v|)``, its
bucket is its top ``SUB_BITS + 1`` bits::

    index(v) = sign(v) * ((e - SUB_BITS + 1) * 2^SUB_BITS + (|v| >> (e - SUB_BITS)) - 2^SUB_BITS)

Bucket ``i`` spans ``[lower(i), lower(i) + width(i))`` with ``width / lower <= 2^-SUB_BITS``,
so its midpoint is within ``2^-(SUB_BITS+1)`` (0.39 %) of any value in it. Indices are integer
arithmetic only (no logarithm), so every language computes them bit for bit alike; index order
is value order; a sketch is ``{index: count}``, and the sketch of a split key is the sum of its
parts' -- exactly the sketch of all its records in one place.

Example:
    >>> import numpy as np
    >>> values = np.array([-5, 0, 3, 255, 256, 257, 1_000_000], dtype=np.int64)
    >>> indices(values).tolist()
    [-5, 0, 3, 255, 256, 256, 1780]
    >>> representative(1780), quantile({-5: 1, 0: 1, 3: 2, 256: 3}, 0.5)
    (1001472, 3)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: Sub-buckets per power of two: 2^7, a relative bucket width of at most 1/128.
SUB_BITS = 7
SUB = 1 << SUB_BITS
#: Largest relative distance of a bucket's representative from a value in it.
RELATIVE_ERROR = 1.0 / (2 * SUB)


def indices(values: np.ndarray) -> np.ndarray:
    """The bucket index of each int64 value (``|v| < 2^62``), vectorized."""
    v = np.asarray(values, dtype=np.int64)
    magnitude = np.abs(v)
    # frexp's exponent is exact below 2^53; above, the conversion may round up to the next power
    # of two, which the two corrections below undo.
    exponent = np.frexp(magnitude.astype(np.float64))[1].astype(np.int64) - 1
    too_high = (exponent > 0) & ((np.int64(1) << np.maximum(exponent, 0)) > magnitude)
    exponent = np.where(too_high, exponent - 1, exponent)
    exponent = np.where((np.int64(1) << (exponent + 1)) <= magnitude, exponent + 1, exponent)
    shift = np.maximum(exponent - SUB_BITS, 0)
    top = magnitude >> shift
    index = np.where(magnitude < 2 * SUB, magnitude, (shift + 1) * SUB + top - SUB)
    return np.sign(v) * index


def lower(index: int) -> int:
    """The smallest magnitude in bucket ``|index|``."""
    i = abs(int(index))
    if i < 2 * SUB:
        return i
    shift = i // SUB - 1
    return (i % SUB + SUB) << shift


def representative(index: int) -> int:
    """The value a bucket stands for: its midpoint (its only value below ``2^(SUB_BITS+1)``),
    signed as the bucket is."""
    i = abs(int(index))
    width = 1 if i < 2 * SUB else 1 << (i // SUB - 1)
    middle = lower(i) + width // 2
    return -middle if index < 0 else middle


def quantile(counts: Mapping[int, int], q: float) -> int:
    """The representative of the bucket holding the value of rank ``max(1, ceil(q * n))`` (from
    1, in ascending order) of the ``n`` values ``counts`` (index -> count) describes."""
    total = sum(counts.values())
    if total <= 0:
        raise ValueError("the quantile of an empty sketch")
    rank = max(1, int(np.ceil(q * total)))
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank:
            return representative(index)
    raise AssertionError("unreachable: ranks are at most the total")

"""A key of several columns as one key: the JSON array of the columns' texts, whole batches at a
time.

Layer: io.

``GROUP BY user, device`` groups, routes and reports the key ``["u1","mobile"]``: a column's
``"`` and ``\\`` are escaped with a backslash and its control characters as ``\\u00XX``, so
two different tuples never make the same key, and a JSON reader reads the key back as the
list of its columns (when they are UTF-8). Design: docs/query.md#the-table.

Example:
    >>> from operators.keys import KeyBatch
    >>> json_arrays([KeyBatch.from_bytes([b"u1", b'say "hi"']),
    ...              KeyBatch.from_bytes([b"mobile", b"a\\\\b"])]).to_list()
    [b'["u1","mobile"]', b'["say \\\\"hi\\\\"","a\\\\\\\\b"]']
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

from operators.keys import KeyBatch

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@numba.njit(cache=True)
def _json_arrays(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, hexes: np.ndarray
) -> tuple:
    """Row r's key from the spans ``[starts[j, r], ends[j, r])`` of ``data``, j = 0..k-1."""
    k, n = starts.shape
    offsets = np.zeros(n + 1, dtype=np.int64)
    for r in range(n):
        total = 4 + 3 * (k - 1)
        for j in range(k):
            for p in range(starts[j, r], ends[j, r]):
                c = data[p]
                total += 2 if c == 34 or c == 92 else (6 if c < 32 else 1)
        offsets[r + 1] = offsets[r] + total
    out = np.empty(offsets[n], dtype=np.uint8)
    o = 0
    for r in range(n):
        out[o] = 91
        out[o + 1] = 34
        o += 2
        for j in range(k):
            if j > 0:
                out[o] = 34
                out[o + 1] = 44
                out[o + 2] = 34
                o += 3
            for p in range(starts[j, r], ends[j, r]):
                c = data[p]
                if c == 34 or c == 92:
                    out[o] = 92
                    out[o + 1] = c
                    o += 2
                elif c < 32:
                    out[o] = 92
                    out[o + 1] = 117
                    out[o + 2] = 48
                    out[o + 3] = 48
                    out[o + 4] = hexes[c >> 4]
                    out[o + 5] = hexes[c & 15]
                    o += 6
                else:
                    out[o] = c
                    o += 1
        out[o] = 34
        out[o + 1] = 93
        o += 2
    return out, offsets


def json_arrays(parts: Sequence[KeyBatch]) -> KeyBatch:
    """Row r's key: the JSON array of ``parts[j][r]`` for every j (equal-length batches)."""
    n = len(parts[0])
    if any(len(part) != n for part in parts):
        raise ValueError(f"parts of {sorted({len(p) for p in parts})} rows: one length, please")
    data = np.concatenate([part.data for part in parts])
    bases = np.cumsum([0] + [part.data.shape[0] for part in parts[:-1]])
    starts = np.stack([part.offsets[:-1] + base for part, base in zip(parts, bases, strict=True)])
    ends = np.stack([part.offsets[1:] + base for part, base in zip(parts, bases, strict=True)])
    out, offsets = _json_arrays(data, starts, ends, _HEX)
    return KeyBatch(out, offsets)

"""Where a field's text is in a batch's bytes, and the byte helpers the scanners share.

Layer: io.

A scanner (:mod:`.json_scan`, :mod:`.csv_scan`) notes one :class:`Field` per spec: per record,
whether the field is there and the span of its text in the batch's flat bytes.
:func:`gather` copies spans out as one flat buffer, decoding JSON escapes or doubled CSV quotes
on the way. Design: docs/design.md#records-and-topics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numba
import numpy as np

if TYPE_CHECKING:
    from pipeline.io.extract.specs import FieldSpec

# Type of a top-level JSON field's value, as the scanner saw it.
K_MISSING, K_STRING, K_INT, K_FLOAT, K_NONFINITE, K_OTHER = range(6)
# How a gathered span becomes bytes: as is, JSON string escapes, CSV doubled quotes.
RAW, JSON_ESCAPED, CSV_QUOTED = range(3)


#: The byte each one-letter JSON escape stands for (0: not an escape letter).
UNESCAPED = np.zeros(256, dtype=np.uint8)
for _letter, _byte in zip(b'"\\/bfnrt', b'"\\/\b\f\n\r\t', strict=True):
    UNESCAPED[_letter] = _byte


class Field(NamedTuple):
    """Where one field's text is in the batch's bytes, per row; ``kinds`` for JSON only."""

    present: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    modes: np.ndarray
    kinds: np.ndarray | None


def spec_fields(
    specs: list[FieldSpec],
    columns: list[int],
    present: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    modes: np.ndarray,
    kinds: np.ndarray | None = None,
) -> dict[FieldSpec, Field]:
    """Each spec's :class:`Field` from a scanner's (row, wanted field) arrays, the spec's own
    field in column ``columns[i]`` of them."""
    return {
        spec: Field(
            present[:, j],
            starts[:, j],
            ends[:, j],
            modes[:, j],
            None if kinds is None else kinds[:, j],
        )
        for spec, j in zip(specs, columns, strict=True)
    }


@numba.njit(inline="always")
def is_digit(c: np.uint8) -> bool:
    return 48 <= c <= 57


@numba.njit(inline="always")
def hex_value(c: np.uint8) -> int:
    if 48 <= c <= 57:
        return c - 48
    if 97 <= c <= 102:
        return c - 87
    if 65 <= c <= 70:
        return c - 55
    return -1


@numba.njit(inline="always")
def _hex4(data: np.ndarray, p: int) -> int:
    return (
        (hex_value(data[p]) << 12)
        | (hex_value(data[p + 1]) << 8)
        | (hex_value(data[p + 2]) << 4)
        | hex_value(data[p + 3])
    )


@numba.njit(inline="always")
def _put_utf8(out: np.ndarray, o: int, cp: int) -> int:
    # Lone surrogates come out as their 3-byte form, like Python's "surrogatepass".
    if cp < 0x80:
        out[o] = cp
        return o + 1
    if cp < 0x800:
        out[o] = 0xC0 | (cp >> 6)
        out[o + 1] = 0x80 | (cp & 0x3F)
        return o + 2
    if cp < 0x10000:
        out[o] = 0xE0 | (cp >> 12)
        out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[o + 2] = 0x80 | (cp & 0x3F)
        return o + 3
    out[o] = 0xF0 | (cp >> 18)
    out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[o + 3] = 0x80 | (cp & 0x3F)
    return o + 4


@numba.njit(cache=True)
def unescape(data: np.ndarray, start: int, end: int, out: np.ndarray, o: int) -> int:
    """Decode the escapes of a JSON string's content (already validated) into ``out[o:]``;
    the decoded text is never longer than the escaped one. Returns the end in ``out``."""
    p = start
    while p < end:
        c = data[p]
        if c != 92:
            out[o] = c
            o += 1
            p += 1
            continue
        c = data[p + 1]
        if c == 117:
            cp = _hex4(data, p + 2)
            p += 6
            # A high surrogate escape joins a following low one, exactly as json.loads does.
            if 0xD800 <= cp <= 0xDBFF and p + 6 <= end and data[p] == 92 and data[p + 1] == 117:
                low = _hex4(data, p + 2)
                if 0xDC00 <= low <= 0xDFFF:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    p += 6
            o = _put_utf8(out, o, cp)
            continue
        out[o] = UNESCAPED[c]
        o += 1
        p += 2
    return o


@numba.njit(cache=True)
def gather(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, modes: np.ndarray, present: np.ndarray
) -> tuple:
    """The spans of ``present`` rows as one flat buffer + offsets (other rows empty), decoded
    by each row's mode; decoding only ever shrinks a span, so the buffer is sized by the sum."""
    n = starts.shape[0]
    total = 0
    for i in range(n):
        if present[i]:
            total += ends[i] - starts[i]
    out = np.empty(total, dtype=np.uint8)
    offsets = np.zeros(n + 1, dtype=np.int64)
    o = 0
    for i in range(n):
        if present[i]:
            mode = modes[i]
            if mode == JSON_ESCAPED:
                o = unescape(data, starts[i], ends[i], out, o)
            elif mode == CSV_QUOTED:
                p = starts[i]
                while p < ends[i]:
                    out[o] = data[p]
                    o += 1
                    p += 2 if data[p] == 34 else 1
            else:
                for p in range(starts[i], ends[i]):
                    out[o] = data[p]
                    o += 1
        offsets[i + 1] = o
    return out[:o], offsets

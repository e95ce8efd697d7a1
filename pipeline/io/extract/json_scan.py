"""The JSON scanner: validates each record's value as one JSON object and notes where the
wanted top-level fields are, in one compiled pass over the batch.

Layer: io.

A value passes if ``json.loads`` would accept it as an object (UTF-8 with surrogates passed
through, ``NaN``/``Infinity`` too); each wanted field's kind and span go into a
:class:`~pipeline.io.extract.spans.Field`. Design: docs/design.md#records-and-topics.
"""

from __future__ import annotations

import numba
import numpy as np

from operators.keys import KeyBatch
from pipeline.io.extract.spans import (
    JSON_ESCAPED,
    K_FLOAT,
    K_INT,
    K_MISSING,
    K_NONFINITE,
    K_OTHER,
    K_STRING,
    RAW,
    UNESCAPED,
    Field,
    hex_value,
    is_digit,
    spec_fields,
    unescape,
)
from pipeline.io.extract.specs import FieldSpec

_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)
_NULL = np.frombuffer(b"null", dtype=np.uint8)
_NAN = np.frombuffer(b"NaN", dtype=np.uint8)
_INFINITY = np.frombuffer(b"Infinity", dtype=np.uint8)


#: Bytes that stand for themselves inside a JSON string: printable ASCII but " and \\.
_PLAIN = np.zeros(256, dtype=np.bool_)
_PLAIN[32:128] = True
_PLAIN[[34, 92]] = False
#: Per lead byte of a multi-byte UTF-8 sequence: how many bytes follow (0: not a lead byte),
#: and the range the first of them must be in, which rules out overlong forms and code points
#: past U+10FFFF.
_UTF8_FOLLOWING = np.zeros(256, dtype=np.int64)
_UTF8_FOLLOWING[0xC2:0xE0] = 1
_UTF8_FOLLOWING[0xE0:0xF0] = 2
_UTF8_FOLLOWING[0xF0:0xF5] = 3
_UTF8_LOW = np.full(256, 0x80, dtype=np.uint8)
_UTF8_LOW[[0xE0, 0xF0]] = [0xA0, 0x90]
_UTF8_HIGH = np.full(256, 0xBF, dtype=np.uint8)
_UTF8_HIGH[0xF4] = 0x8F


@numba.njit(inline="always")
def _matches(data: np.ndarray, p: int, end: int, literal: np.ndarray) -> bool:
    n = literal.shape[0]
    if p + n > end:
        return False
    j = 0
    while j < n and data[p + j] == literal[j]:
        j += 1
    return j == n


@numba.njit(inline="always")
def _skip_ws(data: np.ndarray, p: int, end: int) -> int:
    while p < end:
        c = data[p]
        if c != 32 and c != 10 and c != 13 and c != 9:
            break
        p += 1
    return p


@numba.njit(inline="always")
def _utf8_end(data: np.ndarray, p: int, end: int) -> int:
    """End of the UTF-8 sequence led by the non-ASCII byte ``data[p]``, or -1. Surrogate code
    points (ED A0..BF) pass, because Python decodes JSON bytes with "surrogatepass"."""
    b = data[p]
    n = _UTF8_FOLLOWING[b]
    if n == 0 or p + n >= end:
        return -1
    c = data[p + 1]
    if c < _UTF8_LOW[b] or c > _UTF8_HIGH[b]:
        return -1
    for k in range(2, n + 1):
        if (data[p + k] & 0xC0) != 0x80:
            return -1
    return p + n + 1


@numba.njit(inline="always")
def _string_end(data: np.ndarray, p: int, end: int) -> tuple:
    """(position of the closing quote of the string whose content starts at ``p``, or -1;
    whether it holds escapes). Checks escapes, control characters and UTF-8."""
    escaped = False
    while p < end:
        # Most of a value is plain ASCII text inside strings: one table look-up per byte.
        while p < end and _PLAIN[data[p]]:
            p += 1
        if p >= end:
            break
        c = data[p]
        if c == 34:
            return p, escaped
        if c == 92:
            escaped = True
            if p + 1 >= end:
                return -1, escaped
            c = data[p + 1]
            if c == 117:
                if p + 6 > end:
                    return -1, escaped
                for k in range(2, 6):
                    if hex_value(data[p + k]) < 0:
                        return -1, escaped
                p += 6
            elif UNESCAPED[c] != 0:
                p += 2
            else:
                return -1, escaped
        elif c < 32:
            return -1, escaped
        elif c < 128:
            p += 1
        else:
            p = _utf8_end(data, p, end)
            if p < 0:
                return -1, escaped
    return -1, escaped


@numba.njit(inline="always")
def _digits_end(data: np.ndarray, q: int, end: int) -> int:
    """End of the run of one or more digits at ``q``, or -1 if there is none."""
    if q >= end or not is_digit(data[q]):
        return -1
    while q < end and is_digit(data[q]):
        q += 1
    return q


@numba.njit(inline="always")
def _number_end(data: np.ndarray, p: int, end: int) -> tuple:
    """(end of the JSON number at ``p``, or -1; its kind). ``-Infinity`` counts, as in
    json.loads."""
    q = p
    if data[q] == 45:
        q += 1
        if _matches(data, q, end, _INFINITY):
            return q + 8, K_NONFINITE
    if q >= end:
        return -1, K_MISSING
    if data[q] == 48:
        q += 1
    elif 49 <= data[q] <= 57:
        while q < end and is_digit(data[q]):
            q += 1
    else:
        return -1, K_MISSING
    kind = K_INT
    if q < end and data[q] == 46:
        q = _digits_end(data, q + 1, end)
        if q < 0:
            return -1, K_MISSING
        kind = K_FLOAT
    if q < end and (data[q] == 101 or data[q] == 69):
        q += 1
        if q < end and (data[q] == 43 or data[q] == 45):
            q += 1
        q = _digits_end(data, q, end)
        if q < 0:
            return -1, K_MISSING
        kind = K_FLOAT
    return q, kind


@numba.njit(inline="always")
def _name_index(
    text: np.ndarray, start: int, end: int, names: np.ndarray, name_offsets: np.ndarray
) -> int:
    for f in range(name_offsets.shape[0] - 1):
        a = name_offsets[f]
        length = name_offsets[f + 1] - a
        if length != end - start:
            continue
        j = 0
        while j < length and text[start + j] == names[a + j]:
            j += 1
        if j == length:
            return f
    return -1


@numba.njit(inline="always")
def _field_index(
    data: np.ndarray,
    start: int,
    end: int,
    escaped: bool,
    names: np.ndarray,
    name_offsets: np.ndarray,
    scratch: np.ndarray,
) -> int:
    """Which wanted field the object key ``data[start:end]`` names, or -1."""
    if escaped:
        return _escaped_field_index(data, start, end, names, name_offsets, scratch)
    return _name_index(data, start, end, names, name_offsets)


@numba.njit(cache=True)
def _escaped_field_index(
    data: np.ndarray,
    start: int,
    end: int,
    names: np.ndarray,
    name_offsets: np.ndarray,
    scratch: np.ndarray,
) -> int:
    # Rare ("us\u0065r" is "user"), and kept out of line: compare the decoded key.
    length = unescape(data, start, end, scratch, 0)
    return _name_index(scratch, 0, length, names, name_offsets)


@numba.njit(inline="always")
def _scalar_end(data: np.ndarray, p: int, end: int) -> tuple:
    """(end of the string, number or literal at ``p``, or -1; its kind; whether a string
    holds escapes)."""
    c = data[p]
    if c == 34:
        q, escaped = _string_end(data, p + 1, end)
        return (q + 1 if q >= 0 else -1), K_STRING, escaped
    if c == 45 or is_digit(c):
        q, kind = _number_end(data, p, end)
        return q, kind, False
    if c == 116 and _matches(data, p, end, _TRUE):
        return p + 4, K_OTHER, False
    if c == 102 and _matches(data, p, end, _FALSE):
        return p + 5, K_OTHER, False
    if c == 110 and _matches(data, p, end, _NULL):
        return p + 4, K_OTHER, False
    if c == 78 and _matches(data, p, end, _NAN):
        return p + 3, K_NONFINITE, False
    if c == 73 and _matches(data, p, end, _INFINITY):
        return p + 8, K_NONFINITE, False
    return -1, K_MISSING, False


# States of the container scanner: what the next token may be.
_OBJECT_FIRST, _ARRAY_FIRST, _OBJECT_KEY, _VALUE, _AFTER_VALUE = range(5)


@numba.njit(cache=True)
def _container_end(data: np.ndarray, p: int, end: int, stack: np.ndarray) -> int:
    """End of the JSON object or array that starts at ``p``, or -1 if it is not valid.

    Iterative, with ``stack`` (1 = object, 0 = array) for any nesting depth; only values
    nested in a record's top object come here, so the common flat record never pays for the
    state dispatch.
    """
    stack[0] = 1 if data[p] == 123 else 0
    state = _OBJECT_FIRST if data[p] == 123 else _ARRAY_FIRST
    depth = 1
    p += 1
    while True:
        p = _skip_ws(data, p, end)
        if state == _AFTER_VALUE:
            if depth == 0:
                return p
            if p >= end:
                return -1
            c = data[p]
            in_object = stack[depth - 1] == 1
            if c == 44:
                state = _OBJECT_KEY if in_object else _VALUE
            elif (c == 125 and in_object) or (c == 93 and not in_object):
                depth -= 1
            else:
                return -1
            p += 1
            continue
        if p >= end:
            return -1
        c = data[p]
        if state <= _ARRAY_FIRST:  # just after "{" or "[": maybe the closing bracket
            if c == (125 if state == _OBJECT_FIRST else 93):
                depth -= 1
                p += 1
                state = _AFTER_VALUE
            else:
                state = _OBJECT_KEY if state == _OBJECT_FIRST else _VALUE
            continue
        if state == _OBJECT_KEY:
            if c != 34:
                return -1
            q, _ = _string_end(data, p + 1, end)
            if q < 0:
                return -1
            p = _skip_ws(data, q + 1, end)
            if p >= end or data[p] != 58:
                return -1
            p += 1
            state = _VALUE
            continue
        if c == 123 or c == 91:
            stack[depth] = 1 if c == 123 else 0
            depth += 1
            p += 1
            state = _OBJECT_FIRST if c == 123 else _ARRAY_FIRST
            continue
        p, _, _ = _scalar_end(data, p, end)
        if p < 0:
            return -1
        state = _AFTER_VALUE


@numba.njit(cache=True)
def _scan_object(
    data: np.ndarray,
    s: int,
    e: int,
    names: np.ndarray,
    name_offsets: np.ndarray,
    row: int,
    kinds: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    escapes: np.ndarray,
    stack: np.ndarray,
    scratch: np.ndarray,
) -> bool:
    """Whether ``data[s:e]`` is one JSON object (nothing but whitespace around it), noting in
    row ``row`` of the outputs the kind and span of each wanted top-level field (the last
    occurrence wins, as in a dict; a string's span is its content, without the quotes)."""
    p = _skip_ws(data, s, e)
    if p >= e or data[p] != 123:
        return False
    p = _skip_ws(data, p + 1, e)
    if p < e and data[p] == 125:
        return _skip_ws(data, p + 1, e) == e
    while True:
        if p >= e or data[p] != 34:
            return False
        q, escaped = _string_end(data, p + 1, e)
        if q < 0:
            return False
        field = _field_index(data, p + 1, q, escaped, names, name_offsets, scratch)
        p = _skip_ws(data, q + 1, e)
        if p >= e or data[p] != 58:
            return False
        p = _skip_ws(data, p + 1, e)
        if p >= e:
            return False
        if data[p] == 123 or data[p] == 91:
            q = _container_end(data, p, e, stack)
            kind = K_OTHER
            escaped = False
        else:
            q, kind, escaped = _scalar_end(data, p, e)
        if q < 0:
            return False
        if field >= 0:
            quoted = 1 if kind == K_STRING else 0
            kinds[row, field] = kind
            starts[row, field] = p + quoted
            ends[row, field] = q - quoted
            escapes[row, field] = escaped
        p = _skip_ws(data, q, e)
        if p >= e:
            return False
        if data[p] == 44:
            p = _skip_ws(data, p + 1, e)
        elif data[p] == 125:
            return _skip_ws(data, p + 1, e) == e
        else:
            return False


@numba.njit(cache=True)
def scan_json_kernel(
    data: np.ndarray,
    offsets: np.ndarray,
    valid: np.ndarray,
    names: np.ndarray,
    name_offsets: np.ndarray,
) -> tuple:
    """Per row: whether it is a JSON object, and (kind, start, end, escaped) of each wanted
    field (all K_MISSING on rows that are not)."""
    n = offsets.shape[0] - 1
    n_fields = name_offsets.shape[0] - 1
    ok = np.zeros(n, dtype=np.bool_)
    kinds = np.zeros((n, n_fields), dtype=np.int8)
    starts = np.zeros((n, n_fields), dtype=np.int64)
    ends = np.zeros((n, n_fields), dtype=np.int64)
    escapes = np.zeros((n, n_fields), dtype=np.bool_)
    longest = 0
    for i in range(n):
        longest = max(longest, offsets[i + 1] - offsets[i])
    # Nesting depth and an unescaped key are both bounded by the value's length.
    stack = np.empty(longest + 1, dtype=np.uint8)
    scratch = np.empty(longest + 1, dtype=np.uint8)
    for i in range(n):
        if not valid[i]:
            continue
        if _scan_object(
            data,
            offsets[i],
            offsets[i + 1],
            names,
            name_offsets,
            i,
            kinds,
            starts,
            ends,
            escapes,
            stack,
            scratch,
        ):
            ok[i] = True
        else:
            kinds[i, :] = K_MISSING
    return ok, kinds, starts, ends, escapes


def scan(
    column: KeyBatch, valid: np.ndarray, specs: list[FieldSpec]
) -> tuple[dict[FieldSpec, Field], np.ndarray]:
    """Each spec's :class:`Field` in the batch ``column`` (``valid``: its non-null rows), and
    the mask of the rows that are JSON objects."""
    wanted = list(dict.fromkeys(str(s.field) for s in specs))
    encoded = [name.encode("utf-8", "surrogatepass") for name in wanted]
    names = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    name_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(name) for name in encoded], out=name_offsets[1:])
    ok, kinds, starts, ends, escapes = scan_json_kernel(
        column.data, column.offsets, valid, names, name_offsets
    )
    columns = [wanted.index(str(s.field)) for s in specs]
    modes = np.where(escapes, JSON_ESCAPED, RAW).astype(np.int8)
    fields = spec_fields(specs, columns, kinds != K_MISSING, starts, ends, modes, kinds)
    return fields, ok

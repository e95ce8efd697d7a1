"""Key, event time and amount of each record of a user's own topic, a whole batch at a time.

Layer: io.

A run on a user's topic (``skewer group --input-topic``) says where a record's key and event
time are with two small specs: ``--key kafka-key | json:FIELD | csv:N`` and ``--time
kafka-timestamp | json:FIELD[:ms|s|iso] | csv:N[:ms|s|iso]``; ``--sum json:FIELD | csv:N``
names a number to add up per (key, window). :func:`parse_key`, :func:`parse_time` and
:func:`parse_amount` turn them into :class:`FieldSpec` (or an :class:`ExtractorSpecError`
of one line), and an :class:`Extractor` applies them to a consumed batch (about 20,000
records) or to a Spark task's Arrow column in the recount: one :class:`Extraction` with a
key, an event time in ms, an amount and -- for records it cannot read -- a reason from
:data:`REASONS`, per record.

Why compiled kernels rather than ``json.loads`` per record: at 20,000 records a batch, a
Python call per record (~2 µs for the smallest JSON object) would cost more than routing the
batch. Every step here is one pass over the batch's flat bytes (:func:`records.binary_column`,
no copy): a numba kernel validates each JSON value by the grammar ``json.loads`` accepts (UTF-8
with surrogates passed through, as Python decodes bytes; ``NaN``/``Infinity`` too) while noting
where the needed top-level fields are and what type they have; CSV values get an RFC 4180
field scanner. Then keys are gathered (JSON escapes and doubled CSV quotes decoded) into one
:class:`~operators.keys.KeyBatch`, times are read by kernels that compute ``floor(value *
10**k)`` exactly from the decimal text (so ``1.234`` seconds is 1234 ms, not the 1233 float
arithmetic gives) or parse ISO-8601, and amounts are read the same exact way, as integers of
millionths (:data:`AMOUNT_DIGITS`). The whole batch takes ~7 ms for 20,000 small JSON records.

Arrow's JSON reader (``pyarrow.json.read_json`` over the values joined by newlines) was the
obvious alternative and was measured: it alone takes longer (~10 ms for that batch, three
fields), and it refuses the whole batch when a field is a string in one record and a number
in another (no number-to-string conversion, even with an explicit string schema) or when a
record repeats a field; it also loses the row alignment silently (an empty line is skipped,
``{}{}`` on one line is two rows, an unclosed object swallows the next line). Guarding all
that needs a scan of every value anyway, so the scan does the little parsing there is.

Semantics, per record (the first failing check wins, in this order):

* ``undecodable-value`` -- with a json spec: the value is null, not JSON or not an object;
  with a csv spec: the value is null or its quoting is broken (an unclosed quote, text after
  a closing quote). Kafka-only extractors never read the value.
* ``no-key`` -- kafka-key: no key or an empty one; json: the field is missing, or not a
  non-empty string or an integer (an integer key is its decimal text, ``42`` -> ``b"42"``);
  csv: fewer columns, or an empty field.
* ``key-too-large`` -- the key is longer than :data:`records.MAX_KEY_BYTES`.
* ``bad-time`` -- no Kafka timestamp (negative), a missing field, a value that is not a
  number (``ms``, ``s``; JSON numbers, or number text in CSV) or ISO-8601 text (``iso``:
  ``YYYY-MM-DD[(T| )hh:mm[:ss[.fff]]][Z|±hh[:mm]]``, no offset = UTC), or a time whose
  magnitude reaches 10**18 ms (a typo, not an epoch).
* ``bad-amount`` -- a missing field, not a number (``NaN`` and ``Infinity`` are not), or a
  magnitude of 10**12 or more.

Why amounts are exact decimals, not floats: a sum of floats depends on the order of the
additions, and a split key's partial sums are added in whichever order its workers and the
aggregator happen to see them; the recount adds in yet another. An amount is kept as
``floor(x * 10**6)`` (:data:`AMOUNT_DIGITS` = 6, Spark's ``DECIMAL(18, 6)`` in all but the
flooring of finer digits), so every sum is an int64 and the same in every order -- exact, like
the counts. :func:`format_amount` writes one back as decimal text.

A failing record gets an empty key, time 0 and amount 0, so the arrays stay aligned with the
batch; the result is the same whether the batch came as Arrow or as a list of ``bytes``.

Example:
    >>> extractor = Extractor(parse_key("json:user"), parse_time("json:ts:iso"),
    ...                       parse_amount("json:bytes"))
    >>> out = extractor.extract(
    ...     [b'{"user": "u1", "ts": "2026-11-25T10:00:00.123Z", "bytes": 512}',
    ...      b'{"user": 42, "ts": "2026-11-25T11:00:00+01:00", "bytes": 1.5}',
    ...      b'{"ts": "2026-11-25T10:00:00Z", "bytes": 1}', b"not json"],
    ...     None, None)
    >>> out.keys.to_list(), out.event_time_ms.tolist(), out.amount_micros.tolist()
    ([b'u1', b'42', b'', b''], [1795600800123, 1795600800000, 0, 0], [512000000, 1500000, 0, 0])
    >>> format_amount(int(out.amount_micros.sum()))
    '513.5'
    >>> [REASONS[r] if r >= 0 else "ok" for r in out.reasons]
    ['ok', 'ok', 'no-key', 'undecodable-value']
    >>> extractor.detail(NO_KEY)
    "json:user: no string or integer field 'user'"
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
import pyarrow as pa

from operators.keys import KeyBatch
from pipeline.io.records import MAX_KEY_BYTES, binary_column

#: Why a record cannot be used; :attr:`Extraction.reasons` holds indices into this tuple.
REASONS = ("no-key", "key-too-large", "undecodable-value", "bad-time", "bad-amount")
NO_KEY, KEY_TOO_LARGE, UNDECODABLE, BAD_TIME, BAD_AMOUNT = range(len(REASONS))

KEY_SOURCES = "kafka-key, json:FIELD, csv:N"
TIME_SOURCES = "kafka-timestamp, json:FIELD[:ms|s|iso], csv:N[:ms|s|iso]"
AMOUNT_SOURCES = "json:FIELD, csv:N"
TIME_UNITS = ("ms", "s", "iso")
#: Times at or beyond this many ms from the epoch (31 million years) are typos, not times;
#: the bound also keeps the exact decimal arithmetic inside int64.
TIME_LIMIT_MS = 10**18
#: Amounts are kept in units of 10**-AMOUNT_DIGITS (finer digits floored): exact int64 sums.
AMOUNT_DIGITS = 6

Values = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


class ExtractorSpecError(ValueError):
    """A spec that cannot work; str() is one line for the user naming the flag and the spec."""


@dataclass(frozen=True)
class FieldSpec:
    """Where one field of a record is: ``source`` is ``kafka-key``, ``kafka-timestamp``,
    ``json`` or ``csv``; ``field`` the JSON field name or the 0-based CSV column (None for
    kafka-*); ``unit`` the time unit (``ms``, ``s``, ``iso``; None for keys and amounts);
    ``text`` the spec as the user wrote it."""

    source: str
    field: str | int | None
    unit: str | None
    text: str


def _shown(text: str) -> str:
    # A spec with a newline or control character would break the one-line message.
    return text if text.isprintable() else repr(text)


def _spec_error(flag: str, text: str, problem: str) -> ExtractorSpecError:
    shown = _shown(text)
    # "--key json: names no field" reads better than "--key json:: ...".
    return ExtractorSpecError(f"{flag} {shown}{'' if shown.endswith(':') else ':'} {problem}")


def _value_field(flag: str, text: str, source: str, rest: str, unit: str | None) -> FieldSpec:
    if source == "json":
        if not rest:
            raise _spec_error(flag, text, "names no field")
        return FieldSpec("json", rest, unit, text)
    if not re.fullmatch(r"[0-9]{1,9}", rest):
        raise _spec_error(flag, text, "column must be a non-negative integer")
    return FieldSpec("csv", int(rest), unit, text)


def parse_key(text: str) -> FieldSpec:
    """``--key``: ``kafka-key``, ``json:FIELD`` (all after ``json:`` is the field name) or
    ``csv:N``.

    Example:
        >>> parse_key("json:user")
        FieldSpec(source='json', field='user', unit=None, text='json:user')
    """
    if text == "kafka-key":
        return FieldSpec("kafka-key", None, None, text)
    source, colon, rest = text.partition(":")
    if not colon or source not in ("json", "csv"):
        raise _spec_error("--key", text, f"not a key source ({KEY_SOURCES})")
    return _value_field("--key", text, source, rest, None)


def parse_time(text: str) -> FieldSpec:
    """``--time``: ``kafka-timestamp``, ``json:FIELD[:UNIT]`` or ``csv:N[:UNIT]`` with UNIT
    ``ms`` (the default), ``s`` or ``iso``; with a unit, the field is what precedes the last
    ``:``.

    Example:
        >>> parse_time("csv:2:iso")
        FieldSpec(source='csv', field=2, unit='iso', text='csv:2:iso')
    """
    if text == "kafka-timestamp":
        return FieldSpec("kafka-timestamp", None, None, text)
    source, colon, rest = text.partition(":")
    if not colon or source not in ("json", "csv"):
        raise _spec_error("--time", text, f"not a time source ({TIME_SOURCES})")
    field, colon, unit = rest.rpartition(":")
    if not colon:
        field, unit = rest, "ms"
    elif unit not in TIME_UNITS:
        raise _spec_error("--time", text, f"unknown time unit {unit!r} (ms, s or iso)")
    return _value_field("--time", text, source, field, unit)


def parse_amount(text: str) -> FieldSpec:
    """``--sum``: ``json:FIELD`` or ``csv:N``, a number per record."""
    source, colon, rest = text.partition(":")
    if not colon or source not in ("json", "csv"):
        raise _spec_error("--sum", text, f"not an amount source ({AMOUNT_SOURCES})")
    return _value_field("--sum", text, source, rest, None)


class Extraction(NamedTuple):
    """What an :class:`Extractor` read from a batch, one entry per record."""

    #: One key per record; empty on failing records.
    keys: KeyBatch
    #: int64 event time in ms; 0 on failing records.
    event_time_ms: np.ndarray
    #: int64 amount in millionths (:data:`AMOUNT_DIGITS`); 0 without an amount spec and on
    #: failing records.
    amount_micros: np.ndarray
    #: int8: -1 if the record is usable, else an index into :data:`REASONS`.
    reasons: np.ndarray


# --- numba kernels: shared byte helpers ------------------------------------------------------

# Type of a top-level JSON field's value, as the scanner saw it.
K_MISSING, K_STRING, K_INT, K_FLOAT, K_NONFINITE, K_OTHER = range(6)
# How a gathered span becomes bytes: as is, JSON string escapes, CSV doubled quotes.
RAW, JSON_ESCAPED, CSV_QUOTED = range(3)

_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)
_NULL = np.frombuffer(b"null", dtype=np.uint8)
_NAN = np.frombuffer(b"NaN", dtype=np.uint8)
_INFINITY = np.frombuffer(b"Infinity", dtype=np.uint8)
#: The byte each one-letter JSON escape stands for (0: not an escape letter).
_UNESCAPED = np.zeros(256, dtype=np.uint8)
for _letter, _byte in zip(b'"\\/bfnrt', b'"\\/\b\f\n\r\t', strict=True):
    _UNESCAPED[_letter] = _byte
#: Bytes that stand for themselves inside a JSON string: printable ASCII but " and \\.
_PLAIN = np.zeros(256, dtype=np.bool_)
_PLAIN[32:128] = True
_PLAIN[[34, 92]] = False
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


@numba.njit(inline="always")
def _is_digit(c: np.uint8) -> bool:
    return 48 <= c <= 57


@numba.njit(inline="always")
def _hex_value(c: np.uint8) -> int:
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
        (_hex_value(data[p]) << 12)
        | (_hex_value(data[p + 1]) << 8)
        | (_hex_value(data[p + 2]) << 4)
        | _hex_value(data[p + 3])
    )


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
def _unescape(data: np.ndarray, start: int, end: int, out: np.ndarray, o: int) -> int:
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
        out[o] = _UNESCAPED[c]
        o += 1
        p += 2
    return o


@numba.njit(cache=True)
def _gather(
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
                o = _unescape(data, starts[i], ends[i], out, o)
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


# --- the JSON scanner -------------------------------------------------------------------------


@numba.njit(inline="always")
def _utf8_end(data: np.ndarray, p: int, end: int) -> int:
    """End of the UTF-8 sequence led by the non-ASCII byte ``data[p]``, or -1. Surrogate code
    points (ED A0..BF) pass, because Python decodes JSON bytes with "surrogatepass"."""
    b = data[p]
    low = 0x80
    high = 0xBF
    if 0xC2 <= b <= 0xDF:
        n = 1
    elif b == 0xE0:
        n = 2
        low = 0xA0
    elif 0xE1 <= b <= 0xEF:
        n = 2
    elif b == 0xF0:
        n = 3
        low = 0x90
    elif 0xF1 <= b <= 0xF3:
        n = 3
    elif b == 0xF4:
        n = 3
        high = 0x8F
    else:
        return -1
    if p + n >= end:
        return -1
    c = data[p + 1]
    if c < low or c > high:
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
                    if _hex_value(data[p + k]) < 0:
                        return -1, escaped
                p += 6
            elif _UNESCAPED[c] != 0:
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
        while q < end and _is_digit(data[q]):
            q += 1
    else:
        return -1, K_MISSING
    kind = K_INT
    if q < end and data[q] == 46:
        q += 1
        if q >= end or not _is_digit(data[q]):
            return -1, K_MISSING
        while q < end and _is_digit(data[q]):
            q += 1
        kind = K_FLOAT
    if q < end and (data[q] == 101 or data[q] == 69):
        q += 1
        if q < end and (data[q] == 43 or data[q] == 45):
            q += 1
        if q >= end or not _is_digit(data[q]):
            return -1, K_MISSING
        while q < end and _is_digit(data[q]):
            q += 1
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
    length = _unescape(data, start, end, scratch, 0)
    return _name_index(scratch, 0, length, names, name_offsets)


@numba.njit(inline="always")
def _scalar_end(data: np.ndarray, p: int, end: int) -> tuple:
    """(end of the string, number or literal at ``p``, or -1; its kind; whether a string
    holds escapes)."""
    c = data[p]
    if c == 34:
        q, escaped = _string_end(data, p + 1, end)
        return (q + 1 if q >= 0 else -1), K_STRING, escaped
    if c == 45 or _is_digit(c):
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
def _scan_json(
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
            for f in range(n_fields):
                kinds[i, f] = K_MISSING
    return ok, kinds, starts, ends, escapes


# --- the CSV scanner --------------------------------------------------------------------------


@numba.njit(cache=True)
def _scan_csv(
    data: np.ndarray, offsets: np.ndarray, valid: np.ndarray, columns: np.ndarray
) -> tuple:
    """Per row: whether its quoting is sound, and (present, start, end, mode) of each wanted
    column: present = the column exists and is not empty; mode CSV_QUOTED when the field
    holds doubled quotes to undo. A trailing line break is not part of the last field."""
    n = offsets.shape[0] - 1
    n_columns = columns.shape[0]
    last = 0
    for c in range(n_columns):
        last = max(last, columns[c])
    ok = np.zeros(n, dtype=np.bool_)
    present = np.zeros((n, n_columns), dtype=np.bool_)
    starts = np.zeros((n, n_columns), dtype=np.int64)
    ends = np.zeros((n, n_columns), dtype=np.int64)
    modes = np.zeros((n, n_columns), dtype=np.int8)
    for i in range(n):
        if not valid[i]:
            continue
        s = offsets[i]
        e = offsets[i + 1]
        while e > s and (data[e - 1] == 10 or data[e - 1] == 13):
            e -= 1
        p = s
        column = 0
        sound = True
        while True:
            doubled = False
            if p < e and data[p] == 34:
                q = p + 1
                while True:
                    if q >= e:
                        sound = False
                        break
                    if data[q] == 34:
                        if q + 1 < e and data[q + 1] == 34:
                            doubled = True
                            q += 2
                            continue
                        break
                    q += 1
                if not sound:
                    break
                field_start = p + 1
                field_end = q
                p = q + 1
                if p < e and data[p] != 44:
                    sound = False
                    break
            else:
                q = p
                while q < e and data[q] != 44:
                    q += 1
                field_start = p
                field_end = q
                p = q
            if column <= last:
                for c in range(n_columns):
                    if columns[c] == column and field_end > field_start:
                        present[i, c] = True
                        starts[i, c] = field_start
                        ends[i, c] = field_end
                        modes[i, c] = CSV_QUOTED if doubled else RAW
            if p >= e:
                break
            p += 1  # the comma
            column += 1
        if sound:
            ok[i] = True
        else:
            for c in range(n_columns):
                present[i, c] = False
    return ok, present, starts, ends, modes


# --- times and numbers -----------------------------------------------------------------------


@numba.njit(inline="always")
def _strip(data: np.ndarray, s: int, e: int, strip: bool) -> tuple:
    if strip:
        while s < e and (data[s] == 32 or data[s] == 9):
            s += 1
        while e > s and (data[e - 1] == 32 or data[e - 1] == 9):
            e -= 1
    return s, e


@numba.njit(inline="always")
def _decimal(data: np.ndarray, s: int, e: int) -> tuple:
    """Parts of the decimal number text ``[+-](D[.D*]|.D)[(e|E)[+-]D]``: (ok, negative, integer
    digits start, end, fraction digits start, end, exponent -- clamped, it only has to be
    "huge")."""
    p = s
    negative = False
    if p < e and (data[p] == 43 or data[p] == 45):
        negative = data[p] == 45
        p += 1
    int_start = p
    while p < e and _is_digit(data[p]):
        p += 1
    int_end = p
    frac_start = p
    frac_end = p
    if p < e and data[p] == 46:
        p += 1
        frac_start = p
        while p < e and _is_digit(data[p]):
            p += 1
        frac_end = p
    exponent = 0
    ok = (int_end - int_start) + (frac_end - frac_start) > 0
    if ok and p < e and (data[p] == 101 or data[p] == 69):
        p += 1
        exponent_negative = False
        if p < e and (data[p] == 43 or data[p] == 45):
            exponent_negative = data[p] == 45
            p += 1
        ok = p < e and _is_digit(data[p])
        while p < e and _is_digit(data[p]):
            if exponent < 10_000_000:
                exponent = exponent * 10 + (data[p] - 48)
            p += 1
        if exponent_negative:
            exponent = -exponent
    ok = ok and p == e
    return ok, negative, int_start, int_end, frac_start, frac_end, exponent


@numba.njit(inline="always")
def _scaled_floor(data: np.ndarray, s: int, e: int, shift: int) -> tuple:
    """(ok, floor(x * 10**shift)) for the decimal text x, computed exactly from its digits;
    not ok if the text is not a number or the result reaches TIME_LIMIT_MS."""
    ok, negative, int_start, int_end, frac_start, frac_end, exponent = _decimal(data, s, e)
    if not ok:
        return False, 0
    n_int = int_end - int_start
    n_digits = n_int + frac_end - frac_start
    # The digits D read as an integer times 10**power is the value; its first ``whole``
    # digits are the integer part (zeros appended when whole > len(D)).
    power = exponent + shift - (frac_end - frac_start)
    whole = n_digits + power
    value = 0
    fraction = False
    for k in range(n_digits):
        d = data[int_start + k] if k < n_int else data[frac_start + k - n_int]
        d -= 48
        if k < whole:
            if value >= TIME_LIMIT_MS // 10:
                return False, 0
            value = value * 10 + d
        elif d != 0:
            fraction = True
    for _ in range(n_digits, whole):
        if value == 0:
            break
        if value >= TIME_LIMIT_MS // 10:
            return False, 0
        value *= 10
    if negative:
        value = -value - (1 if fraction else 0)
    if value >= TIME_LIMIT_MS or value <= -TIME_LIMIT_MS:
        return False, 0
    return True, value


@numba.njit(cache=True)
def _scaled_numbers(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    present: np.ndarray,
    shift: int,
    strip: bool,
) -> tuple:
    """(ok, floor(x * 10**shift)) of each present span's decimal number text: times in ms
    (shift 0 or 3) and amounts in millionths (:data:`AMOUNT_DIGITS`) alike."""
    n = starts.shape[0]
    ok = np.zeros(n, dtype=np.bool_)
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        if present[i]:
            s, e = _strip(data, starts[i], ends[i], strip)
            ok[i], out[i] = _scaled_floor(data, s, e, shift)
    return ok, out


@numba.njit(inline="always")
def _two_digits(data: np.ndarray, p: int) -> int:
    a = data[p]
    b = data[p + 1]
    if not (_is_digit(a) and _is_digit(b)):
        return -1
    return (a - 48) * 10 + (b - 48)


@numba.njit(inline="always")
def _days_from_civil(year: int, month: int, day: int) -> int:
    # Howard Hinnant's days_from_civil: days since 1970-01-01 in the proleptic Gregorian calendar.
    y = year - 1 if month <= 2 else year
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


@numba.njit(inline="always")
def _iso_ms(data: np.ndarray, s: int, e: int) -> tuple:
    """(ok, epoch ms) of ``YYYY-MM-DD[(T|t| )hh:mm[:ss[(.|,)f+]]][Z|z|±hh[[:]mm]]``; a
    fraction beyond ms is cut (floored), no offset means UTC."""
    if e - s < 10 or data[s + 4] != 45 or data[s + 7] != 45:
        return False, 0
    high = _two_digits(data, s)
    low = _two_digits(data, s + 2)
    month = _two_digits(data, s + 5)
    day = _two_digits(data, s + 8)
    if high < 0 or low < 0 or month < 1 or month > 12 or day < 1:
        return False, 0
    year = high * 100 + low
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    month_days = _MONTH_DAYS[month - 1] + (1 if month == 2 and leap else 0)
    if year < 1 or day > month_days:
        return False, 0
    p = s + 10
    hour = minute = second = millis = 0
    if p < e and (data[p] == 84 or data[p] == 116 or data[p] == 32):
        if p + 6 > e or data[p + 3] != 58:
            return False, 0
        hour = _two_digits(data, p + 1)
        minute = _two_digits(data, p + 4)
        if hour < 0 or hour > 23 or minute < 0 or minute > 59:
            return False, 0
        p += 6
        if p < e and data[p] == 58:
            if p + 3 > e:
                return False, 0
            second = _two_digits(data, p + 1)
            if second < 0 or second > 59:
                return False, 0
            p += 3
            if p < e and (data[p] == 46 or data[p] == 44):
                p += 1
                if p >= e or not _is_digit(data[p]):
                    return False, 0
                scale = 100
                while p < e and _is_digit(data[p]):
                    millis += (data[p] - 48) * scale
                    scale //= 10
                    p += 1
    offset = 0
    if p < e and (data[p] == 90 or data[p] == 122):
        p += 1
    elif p < e and (data[p] == 43 or data[p] == 45):
        sign = 1 if data[p] == 43 else -1
        if p + 3 > e:
            return False, 0
        offset_hours = _two_digits(data, p + 1)
        offset_minutes = 0
        p += 3
        if p < e:
            if data[p] == 58:
                p += 1
            if p + 2 > e:
                return False, 0
            offset_minutes = _two_digits(data, p)
            p += 2
        if offset_hours < 0 or offset_hours > 23 or offset_minutes < 0 or offset_minutes > 59:
            return False, 0
        offset = sign * (offset_hours * 3_600_000 + offset_minutes * 60_000)
    if p != e:
        return False, 0
    days = _days_from_civil(year, month, day)
    ms = days * 86_400_000 + hour * 3_600_000 + minute * 60_000 + second * 1000 + millis
    return True, ms - offset


@numba.njit(cache=True)
def _iso_times(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, present: np.ndarray, strip: bool
) -> tuple:
    n = starts.shape[0]
    ok = np.zeros(n, dtype=np.bool_)
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        if present[i]:
            s, e = _strip(data, starts[i], ends[i], strip)
            ok[i], out[i] = _iso_ms(data, s, e)
    return ok, out


# --- the extractor ----------------------------------------------------------------------------


class _Field(NamedTuple):
    """Where one field's text is in the batch's bytes, per row; ``kinds`` for JSON only."""

    present: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    modes: np.ndarray
    kinds: np.ndarray | None


def _timestamps(stamps: np.ndarray | pa.Array | pa.ChunkedArray | None, n: int) -> np.ndarray:
    if stamps is None:
        raise ValueError("a kafka-timestamp extractor needs the records' timestamps")
    if isinstance(stamps, pa.ChunkedArray | pa.Array):
        stamps = stamps.to_numpy(zero_copy_only=False)
    stamps = np.asarray(stamps)
    if stamps.shape != (n,):
        raise ValueError(f"{stamps.shape[0]} timestamps for {n} records")
    if stamps.dtype.kind == "f":
        # A null Arrow timestamp arrives as NaN: no timestamp.
        return np.where(np.isfinite(stamps), stamps, -1).astype(np.int64)
    return stamps.astype(np.int64, copy=False)


@dataclass(frozen=True)
class Extractor:
    """Reads (key, event time, amount) from batches of a user's records; picklable, so a
    grouping source and a Spark task use the very same one."""

    key: FieldSpec
    time: FieldSpec
    amount: FieldSpec | None = None

    def __post_init__(self) -> None:
        if self.key.source not in ("kafka-key", "json", "csv"):
            raise _spec_error("--key", self.key.text, f"not a key source ({KEY_SOURCES})")
        if self.time.source not in ("kafka-timestamp", "json", "csv"):
            raise _spec_error("--time", self.time.text, f"not a time source ({TIME_SOURCES})")
        if self.amount is not None and self.amount.source not in ("json", "csv"):
            problem = f"not an amount source ({AMOUNT_SOURCES})"
            raise _spec_error("--sum", self.amount.text, problem)
        formats = [(flag, s) for flag, s in self._flagged() if s.source in ("json", "csv")]
        for flag, spec in formats[1:]:
            first_flag, first = formats[0]
            if spec.source != first.source:
                raise _spec_error(
                    flag,
                    spec.text,
                    f"reads {spec.source} values but {first_flag} {_shown(first.text)} reads "
                    f"{first.source}: a topic has one value format",
                )

    def _flagged(self) -> list[tuple[str, FieldSpec]]:
        specs = [("--key", self.key), ("--time", self.time)]
        return specs if self.amount is None else [*specs, ("--sum", self.amount)]

    @property
    def value_format(self) -> str | None:
        """``json`` or ``csv`` if some spec reads the value, else None."""
        return next(
            (s.source for _, s in self._flagged() if s.source in ("json", "csv")),
            None,
        )

    def detail(self, reason: int) -> str:
        """One line for a dead letter: which spec refused the record, and why."""
        key, time, amount = self.key, self.time, self.amount
        if reason == UNDECODABLE:
            spec = next(s for _, s in self._flagged() if s.source in ("json", "csv"))
            if spec.source == "json":
                return f"{spec.text}: the value is not a JSON object"
            return f"{spec.text}: the value is not CSV (no value, or an unclosed quote)"
        if reason == NO_KEY:
            if key.source == "kafka-key":
                return f"{key.text}: the record has no key"
            if key.source == "json":
                return f"{key.text}: no string or integer field {key.field!r}"
            return f"{key.text}: no column {key.field}, or it is empty"
        if reason == KEY_TOO_LARGE:
            return f"{key.text}: the key is longer than {MAX_KEY_BYTES} bytes"
        if reason == BAD_TIME:
            if time.source == "kafka-timestamp":
                return f"{time.text}: the record has no timestamp"
            what = {
                "ms": "a number of milliseconds",
                "s": "a number of seconds",
                "iso": "an ISO-8601 time",
            }[time.unit or "ms"]
            where = f"field {time.field!r}" if time.source == "json" else f"column {time.field}"
            return f"{time.text}: {where} is missing or not {what} (within ±1e18 ms)"
        if reason == BAD_AMOUNT and amount is not None:
            where = (
                f"field {amount.field!r}" if amount.source == "json" else f"column {amount.field}"
            )
            return f"{amount.text}: {where} is missing or not a finite number"
        raise ValueError(f"no such reason: {reason}")

    def extract(
        self,
        values: Values | None,
        kafka_keys: Values | None,
        kafka_timestamps_ms: np.ndarray | pa.Array | None,
    ) -> Extraction:
        """Key, event time and amount of each record, and why a record is unusable.

        ``values`` and ``kafka_keys`` are Arrow binary columns or sequences of ``bytes``/
        ``None``; ``kafka_timestamps_ms`` int64 (negative: no timestamp). An input no spec
        reads may be None.
        """
        inputs = (values, kafka_keys, kafka_timestamps_ms)
        n = next((len(x) for x in inputs if x is not None), 0)
        fmt = self.value_format
        fields: dict[FieldSpec, _Field] = {}
        undecodable = np.zeros(n, dtype=bool)
        data = np.zeros(0, dtype=np.uint8)
        if fmt is not None:
            if values is None:
                raise ValueError(f"a {fmt} extractor needs the records' values")
            column, valid = binary_column(values)
            if len(column) != n:
                raise ValueError(f"{len(column)} values for {n} records")
            data = column.data
            specs = [s for _, s in self._flagged() if s.source == fmt]
            if fmt == "json":
                fields, decoded = self._scan_json(column, valid, specs)
            else:
                fields, decoded = self._scan_csv(column, valid, specs)
            undecodable = ~decoded

        keys, no_key, too_large = self._keys(data, fields, kafka_keys, n)
        times, time_ok = self._times(data, fields, kafka_timestamps_ms, n)
        if self.amount is None:
            amounts = np.zeros(n, dtype=np.int64)
            amount_ok = np.ones(n, dtype=bool)
        else:
            amounts, amount_ok = self._amounts(data, fields[self.amount])

        # Assigned from the last check to the first, so the first failing check wins.
        reasons = np.full(n, -1, dtype=np.int8)
        reasons[~amount_ok] = BAD_AMOUNT
        reasons[~time_ok] = BAD_TIME
        reasons[too_large] = KEY_TOO_LARGE
        reasons[no_key] = NO_KEY
        reasons[undecodable] = UNDECODABLE
        bad = reasons >= 0
        if bad.any():
            times[bad] = 0
            amounts[bad] = 0
            lengths = np.diff(keys.offsets)
            if (lengths[bad] > 0).any():
                keep = ~bad
                data_kept, offsets = _gather(
                    keys.data,
                    keys.offsets[:-1],
                    keys.offsets[1:],
                    np.zeros(n, dtype=np.int8),
                    keep,
                )
                keys = KeyBatch(data_kept, offsets)
        return Extraction(keys, times, amounts, reasons)

    # --- per source ---------------------------------------------------------------------------

    @staticmethod
    def _scan_json(
        column: KeyBatch, valid: np.ndarray, specs: list[FieldSpec]
    ) -> tuple[dict[FieldSpec, _Field], np.ndarray]:
        wanted = list(dict.fromkeys(str(s.field) for s in specs))
        encoded = [name.encode("utf-8", "surrogatepass") for name in wanted]
        names = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        name_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(name) for name in encoded], out=name_offsets[1:])
        ok, kinds, starts, ends, escapes = _scan_json(
            column.data, column.offsets, valid, names, name_offsets
        )
        fields = {}
        for spec in specs:
            j = wanted.index(str(spec.field))
            kind = kinds[:, j]
            modes = np.where(escapes[:, j], JSON_ESCAPED, RAW).astype(np.int8)
            fields[spec] = _Field(kind != K_MISSING, starts[:, j], ends[:, j], modes, kind)
        return fields, ok

    @staticmethod
    def _scan_csv(
        column: KeyBatch, valid: np.ndarray, specs: list[FieldSpec]
    ) -> tuple[dict[FieldSpec, _Field], np.ndarray]:
        wanted = list(dict.fromkeys(int(s.field) for s in specs))  # type: ignore[arg-type]
        ok, present, starts, ends, modes = _scan_csv(
            column.data, column.offsets, valid, np.array(wanted, dtype=np.int64)
        )
        fields = {}
        for spec in specs:
            j = wanted.index(int(spec.field))  # type: ignore[arg-type]
            fields[spec] = _Field(present[:, j], starts[:, j], ends[:, j], modes[:, j], None)
        return fields, ok

    def _keys(
        self,
        data: np.ndarray,
        fields: dict[FieldSpec, _Field],
        kafka_keys: Values | None,
        n: int,
    ) -> tuple[KeyBatch, np.ndarray, np.ndarray]:
        """(keys, no-key mask, too-large mask)."""
        if self.key.source == "kafka-key":
            if kafka_keys is None:
                raise ValueError("a kafka-key extractor needs the records' keys")
            keys, valid = binary_column(kafka_keys)
            if len(keys) != n:
                raise ValueError(f"{len(keys)} keys for {n} records")
            lengths = np.diff(keys.offsets)
            if not valid.all():
                # A null key's slice is whatever Arrow stored: make it empty before anyone
                # reads it as a key.
                keys = KeyBatch(
                    *_gather(
                        keys.data,
                        keys.offsets[:-1],
                        keys.offsets[1:],
                        np.zeros(n, dtype=np.int8),
                        valid,
                    )
                )
                lengths = np.diff(keys.offsets)
            return keys, ~valid | (lengths == 0), lengths > MAX_KEY_BYTES
        field = fields[self.key]
        present = field.present
        starts = field.starts
        if field.kinds is not None:
            is_int = field.kinds == K_INT
            present = (field.kinds == K_STRING) | is_int
            # -0 is the integer 0, whose decimal text is "0".
            two = np.flatnonzero(is_int & (field.ends - starts == 2))
            negative_zero = two[(data[starts[two]] == 45) & (data[starts[two] + 1] == 48)]
            if negative_zero.shape[0]:
                starts = starts.copy()
                starts[negative_zero] += 1
        keys = KeyBatch(*_gather(data, starts, field.ends, field.modes, present))
        lengths = np.diff(keys.offsets)
        return keys, lengths == 0, lengths > MAX_KEY_BYTES

    def _times(
        self,
        data: np.ndarray,
        fields: dict[FieldSpec, _Field],
        stamps: np.ndarray | pa.Array | None,
        n: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(event time in ms, ok mask)."""
        if self.time.source == "kafka-timestamp":
            times = _timestamps(stamps, n).copy()
            return times, times >= 0
        field = fields[self.time]
        present = field.present
        starts, ends = field.starts, field.ends
        csv = field.kinds is None
        if self.time.unit == "iso":
            if not csv:
                present = field.kinds == K_STRING
                escaped = present & (field.modes == JSON_ESCAPED)
                if escaped.any():
                    data, offsets = _gather(data, starts, ends, field.modes, present)
                    starts, ends = offsets[:-1], offsets[1:]
            else:
                # Doubled quotes are never part of a time.
                present = present & (field.modes == RAW)
            ok, times = _iso_times(data, starts, ends, present, csv)
            return times, ok
        if not csv:
            present = (field.kinds == K_INT) | (field.kinds == K_FLOAT)
        else:
            present = present & (field.modes == RAW)
        shift = 3 if self.time.unit == "s" else 0
        ok, times = _scaled_numbers(data, starts, ends, present, shift, csv)
        return times, ok

    def _amounts(self, data: np.ndarray, field: _Field) -> tuple[np.ndarray, np.ndarray]:
        """(amount in millionths, ok mask)."""
        csv = field.kinds is None
        if csv:
            present = field.present & (field.modes == RAW)
        else:
            present = (field.kinds == K_INT) | (field.kinds == K_FLOAT)
        ok, micros = _scaled_numbers(data, field.starts, field.ends, present, AMOUNT_DIGITS, csv)
        return micros, ok

    def amounts(self, values: Values) -> tuple[np.ndarray, np.ndarray]:
        """Only the amounts (int64 millionths; 0 where missing) and a mask of the records that
        have one: what a worker reads from the user's values it is handed, without the key
        and time the grouping stage already took from them."""
        if self.amount is None:
            raise ValueError("this extractor has no --sum spec")
        column, valid = binary_column(values)
        scan = self._scan_json if self.amount.source == "json" else self._scan_csv
        fields, decoded = scan(column, valid, [self.amount])
        micros, ok = self._amounts(column.data, fields[self.amount])
        ok &= decoded
        return np.where(ok, micros, 0), ok


def format_amount(micros: int) -> str:
    """An amount in millionths as the shortest exact decimal text (``1500000`` -> ``'1.5'``).

    Example:
        >>> format_amount(-2_500_000), format_amount(3_000_000), format_amount(7)
        ('-2.5', '3', '0.000007')
    """
    sign = "-" if micros < 0 else ""
    whole, fraction = divmod(abs(int(micros)), 10**AMOUNT_DIGITS)
    digits = f"{fraction:0{AMOUNT_DIGITS}d}".rstrip("0")
    return f"{sign}{whole}.{digits}" if digits else f"{sign}{whole}"

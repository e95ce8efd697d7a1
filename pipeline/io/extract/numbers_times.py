"""Exact decimals and ISO-8601 times from a batch's field spans, compiled by numba.

Layer: io.

A number's text becomes ``floor(value * 10**k)`` computed from its digits (``1.234`` s is
1234 ms, not the 1233 float arithmetic gives): times in ms and amounts in millionths
(:data:`AMOUNT_DIGITS`), so every sum is an exact int64 in any order. Design:
docs/design.md#records-and-topics.
"""

from __future__ import annotations

import numba
import numpy as np

from pipeline.io.extract.spans import (
    JSON_ESCAPED,
    K_FLOAT,
    K_INT,
    K_STRING,
    RAW,
    Field,
    gather,
    is_digit,
)

#: Times at or beyond this many ms from the epoch (31 million years) are typos, not times;
#: the bound also keeps the exact decimal arithmetic inside int64.
TIME_LIMIT_MS = 10**18
#: Amounts are kept in units of 10**-AMOUNT_DIGITS (finer digits floored): exact int64 sums.
AMOUNT_DIGITS = 6

_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


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
    while p < e and is_digit(data[p]):
        p += 1
    int_end = p
    frac_start = p
    frac_end = p
    if p < e and data[p] == 46:
        p += 1
        frac_start = p
        while p < e and is_digit(data[p]):
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
        ok = p < e and is_digit(data[p])
        while p < e and is_digit(data[p]):
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


@numba.njit(inline="always")
def _two_digits(data: np.ndarray, p: int) -> int:
    a = data[p]
    b = data[p + 1]
    if not (is_digit(a) and is_digit(b)):
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
                if p >= e or not is_digit(data[p]):
                    return False, 0
                scale = 100
                while p < e and is_digit(data[p]):
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
def _read_spans(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    present: np.ndarray,
    strip: bool,
    iso: bool,
    shift: int,
) -> tuple:
    """(ok, value) of each present span: its ISO-8601 time in epoch ms if ``iso``, else
    floor(x * 10**shift) of its decimal number text x (times in ms with shift 0 or 3, amounts
    in millionths with :data:`AMOUNT_DIGITS`); ``strip`` drops blanks around it (CSV)."""
    n = starts.shape[0]
    ok = np.zeros(n, dtype=np.bool_)
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        if present[i]:
            s, e = _strip(data, starts[i], ends[i], strip)
            if iso:
                ok[i], out[i] = _iso_ms(data, s, e)
            else:
                ok[i], out[i] = _scaled_floor(data, s, e, shift)
    return ok, out


def field_times(data: np.ndarray, field: Field, unit: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(event time in ms, ok mask) of a JSON or CSV time field in ``unit`` (``ms``, ``s`` or
    ``iso``): JSON numbers or strings as the unit wants, CSV text stripped of blanks."""
    present = field.present
    starts, ends = field.starts, field.ends
    csv = field.kinds is None
    if unit == "iso":
        if field.kinds is not None:
            present = field.kinds == K_STRING
            escaped = present & (field.modes == JSON_ESCAPED)
            if escaped.any():
                data, offsets = gather(data, starts, ends, field.modes, present)
                starts, ends = offsets[:-1], offsets[1:]
        else:
            # Doubled quotes are never part of a time.
            present = present & (field.modes == RAW)
        ok, times = _read_spans(data, starts, ends, present, csv, True, 0)
        return times, ok
    shift = 3 if unit == "s" else 0
    ok, times = _read_spans(data, starts, ends, _numbers(field), csv, False, shift)
    return times, ok


def field_amounts(data: np.ndarray, field: Field) -> tuple[np.ndarray, np.ndarray]:
    """(amount in millionths, ok mask) of a JSON or CSV amount field."""
    csv = field.kinds is None
    ok, micros = _read_spans(
        data, field.starts, field.ends, _numbers(field), csv, False, AMOUNT_DIGITS
    )
    return micros, ok


def _numbers(field: Field) -> np.ndarray:
    """The rows whose field may be a number: JSON numbers; CSV text without doubled quotes."""
    if field.kinds is None:
        return field.present & (field.modes == RAW)
    return (field.kinds == K_INT) | (field.kinds == K_FLOAT)


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

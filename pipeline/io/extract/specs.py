"""The ``--key``, ``--time`` and ``--sum`` specs: where a user's record holds its key, event
time and amount.

Layer: io.

``--key kafka-key | json:FIELD | csv:N``, ``--time kafka-timestamp | json:FIELD[:ms|s|iso] |
csv:N[:ms|s|iso]`` and ``--sum json:FIELD | csv:N`` become a :class:`FieldSpec` each, or an
:class:`ExtractorSpecError` of one line naming the flag. Design:
docs/design.md#records-and-topics.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEY_SOURCES = "kafka-key, json:FIELD, csv:N"
TIME_SOURCES = "kafka-timestamp, json:FIELD[:ms|s|iso], csv:N[:ms|s|iso]"
AMOUNT_SOURCES = "json:FIELD, csv:N"
TIME_UNITS = ("ms", "s", "iso")


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


def shown(text: str) -> str:
    # A spec with a newline or control character would break the one-line message.
    return text if text.isprintable() else repr(text)


def spec_error(flag: str, text: str, problem: str) -> ExtractorSpecError:
    printed = shown(text)
    # "--key json: names no field" reads better than "--key json:: ...".
    return ExtractorSpecError(f"{flag} {printed}{'' if printed.endswith(':') else ':'} {problem}")


def _value_field(flag: str, text: str, source: str, rest: str, unit: str | None) -> FieldSpec:
    if source == "json":
        if not rest:
            raise spec_error(flag, text, "names no field")
        return FieldSpec("json", rest, unit, text)
    if not re.fullmatch(r"[0-9]{1,9}", rest):
        raise spec_error(flag, text, "column must be a non-negative integer")
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
        raise spec_error("--key", text, f"not a key source ({KEY_SOURCES})")
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
        raise spec_error("--time", text, f"not a time source ({TIME_SOURCES})")
    field, colon, unit = rest.rpartition(":")
    if not colon:
        field, unit = rest, "ms"
    elif unit not in TIME_UNITS:
        raise spec_error("--time", text, f"unknown time unit {unit!r} (ms, s or iso)")
    return _value_field("--time", text, source, field, unit)


def parse_amount(text: str) -> FieldSpec:
    """``--sum``: ``json:FIELD`` or ``csv:N``, a number per record."""
    source, colon, rest = text.partition(":")
    if not colon or source not in ("json", "csv"):
        raise spec_error("--sum", text, f"not an amount source ({AMOUNT_SOURCES})")
    return _value_field("--sum", text, source, rest, None)


def check_together(key: FieldSpec, time: FieldSpec, amount: FieldSpec | None) -> None:
    """Raise :class:`ExtractorSpecError` unless each spec reads what its flag can and all the
    specs that read the value agree on its format (a topic has one)."""
    if key.source not in ("kafka-key", "json", "csv"):
        raise spec_error("--key", key.text, f"not a key source ({KEY_SOURCES})")
    if time.source not in ("kafka-timestamp", "json", "csv"):
        raise spec_error("--time", time.text, f"not a time source ({TIME_SOURCES})")
    if amount is not None and amount.source not in ("json", "csv"):
        raise spec_error("--sum", amount.text, f"not an amount source ({AMOUNT_SOURCES})")
    flagged = [("--key", key), ("--time", time), ("--sum", amount)]
    formats = [(flag, s) for flag, s in flagged if s is not None and s.source in ("json", "csv")]
    for flag, spec in formats[1:]:
        first_flag, first = formats[0]
        if spec.source != first.source:
            raise spec_error(
                flag,
                spec.text,
                f"reads {spec.source} values but {first_flag} {shown(first.text)} reads "
                f"{first.source}: a topic has one value format",
            )

"""The typed description of a user's windowed job, which every stage is handed.

Layer: io.

A :class:`Job` says where the columns of a record are (:class:`Column`), how a column's values
are read (:data:`NUMBER` or :data:`TEXT`), which columns group and which one the scheme routes
on, the window (:class:`Window`), the aggregates (:class:`Aggregate`), the ``WHERE`` predicate
(:data:`Predicate`) and the output columns in ``SELECT`` order. :func:`pipeline.io.query.parse.
parse_query` makes one from the query's text. The language: docs/query.md.

Example:
    >>> Window("hopping", size_ms=60_000, slide_ms=10_000).windows_per_record
    6
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from operators.aggregates import StateField, column_state, final
from pipeline.io.extract.specs import FieldSpec

#: How a column's values are read. A number is kept exactly in millionths, as ``--sum``'s
#: amounts are; a text is the field's text (a JSON string or integer, a CSV cell), as keys are.
NUMBER = "number"
TEXT = "text"

#: The table ``FROM`` names for skewer's own generated stream (topic ``keys``,
#: pipeline/io/records.py), whose columns are ``key`` and ``ts``; any other name is a topic.
OWN_STREAM = "keys"

#: The aggregates a query may use, as :attr:`Aggregate.function` spells them.
AGGREGATES = (
    "count(*)",
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "count(DISTINCT)",
    "approx_count_distinct",
    "percentile_approx",
)
#: Aggregates over a :data:`NUMBER` column.
NUMERIC_AGGREGATES = ("sum", "min", "max", "avg", "percentile_approx")


@dataclass(frozen=True)
class Column:
    """A column of the query's table: its name as written, where a record holds it (an
    extractor spec: ``kafka-key``, ``json:FIELD`` or ``csv:N``) and how it is read."""

    name: str
    spec: FieldSpec
    kind: str


@dataclass(frozen=True)
class Window:
    """``window(ts, size)`` (tumbling: ``slide_ms == size_ms``), ``window(ts, size, slide)``
    (hopping) or ``session_window(ts, gap)`` (``size_ms`` is the gap, ``slide_ms`` 0)."""

    kind: str
    size_ms: int
    slide_ms: int = 0

    @property
    def windows_per_record(self) -> int:
        """How many windows one record falls in (a session: one)."""
        if self.kind == "session":
            return 1
        return -(-self.size_ms // self.slide_ms)


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of the ``SELECT`` list: its function (one of :data:`AGGREGATES`), the
    column it reads (None for ``count(*)``), its output name and, for ``percentile_approx``, the
    quantile."""

    function: str
    column: str | None
    name: str
    quantile: float | None = None


@dataclass(frozen=True)
class Compare:
    """``column OP value`` with OP one of ``= != < <= > >=``; a number value is a Decimal."""

    op: str
    column: str
    value: Decimal | str


@dataclass(frozen=True)
class InList:
    column: str
    values: tuple[Decimal | str, ...]
    negated: bool = False


@dataclass(frozen=True)
class Like:
    """``column LIKE pattern`` with SQL's ``%``, ``_`` and ``\\`` escape."""

    column: str
    pattern: str
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    column: str
    negated: bool = False


@dataclass(frozen=True)
class And:
    left: Predicate
    right: Predicate


@dataclass(frozen=True)
class Or:
    left: Predicate
    right: Predicate


@dataclass(frozen=True)
class Not:
    operand: Predicate


Predicate = Compare | InList | Like | IsNull | And | Or | Not


@dataclass(frozen=True)
class Output:
    """An output column in ``SELECT`` order: ``source`` is a group column's name,
    ``window.start``/``window.end``, or an aggregate's name."""

    name: str
    source: str


@dataclass(frozen=True)
class Job:
    """A user's windowed job. ``table`` is ``FROM``'s topic (or :data:`OWN_STREAM`);
    ``group_by`` the grouping columns, together the key the scheme routes on;
    ``time`` where the event time is (None: in the header of skewer's own records);
    ``columns`` every column the query reads besides the event time."""

    text: str
    table: str
    columns: tuple[Column, ...]
    group_by: tuple[str, ...]
    time: FieldSpec | None
    window: Window
    aggregates: tuple[Aggregate, ...]
    where: Predicate | None
    outputs: tuple[Output, ...]

    def column(self, name: str) -> Column:
        return next(column for column in self.columns if column.name == name)

    @property
    def route_on(self) -> Column:
        """The first grouping column: the key the scheme routes on, or its first part when
        several columns group (the key is then all of them, :mod:`pipeline.io.extract.
        compound`)."""
        return self.column(self.group_by[0])

    @property
    def state_fields(self) -> tuple[StateField, ...]:
        """What the workers keep per (window, key) besides the count of records: for each
        column an aggregate reads, its count of non-null values, and its sum, least or greatest
        as the aggregates ask (``avg`` is a sum and a count), each once, in ``SELECT`` order.

        Example:
            >>> job = Job("", "t", (), ("k",), None, Window("tumbling", 1000, 1000),
            ...           (Aggregate("avg", "ms", "mean"), Aggregate("max", "ms", "slowest")),
            ...           None, ())
            >>> [field.name for field in job.state_fields]
            ['count(ms)', 'sum(ms)', 'max(ms)']
        """
        parts = {"count": (), "sum": ("sum",), "avg": ("sum",), "min": ("min",), "max": ("max",)}
        fields: dict[tuple[str, str], StateField] = {}
        for aggregate in self.aggregates:
            if aggregate.column is None:
                continue
            for part in ("count", *parts[aggregate.function]):
                name = f"{part}({aggregate.column})"
                fields.setdefault(
                    (part, aggregate.column), StateField(name, part, aggregate.column)
                )
        return tuple(fields.values())

    @property
    def value_format(self) -> str | None:
        """``json`` or ``csv`` when a column is read from the record's value, else None."""
        formats = {c.spec.source for c in self.columns}
        formats |= {self.time.source} if self.time is not None else set()
        return next((f for f in ("json", "csv") if f in formats), None)


#: What the live stages run of a job so far; :func:`live_refusal` names the first thing beyond.
LIVE_AGGREGATES = ("count(*)", "count", "sum", "min", "max", "avg")


def live_refusal(job: Job) -> str | None:
    """One line naming what the live stages do not run of ``job``, None if they run all of it:
    a tumbling window, ``count(*)``, ``count``, ``sum``, ``min``, ``max`` and ``avg`` of a
    topic's fields, a ``WHERE`` and grouping columns on them (docs/query.md#what-runs-live).

    Example:
        >>> hopping = Job("", "t", (), ("k",), None, Window("hopping", 60_000, 10_000), (), None,
        ...               ())
        >>> live_refusal(hopping)
        'hopping windows are not run live yet: the live stages run tumbling windows'
    """
    if job.window.kind != "tumbling":
        kind = job.window.kind
        return f"{kind} windows are not run live yet: the live stages run tumbling windows"
    if job.where is not None and job.table == OWN_STREAM:
        return "WHERE on skewer's own stream is not run live: it has no fields to filter on"
    beyond = [a for a in job.aggregates if a.function not in LIVE_AGGREGATES]
    if beyond:
        function = beyond[0].function
        called = function if "(" in function else f"{function}()"
        return (
            f"{called} is not run live yet: the live stages run count, sum, min, max and avg "
            "per key and window"
        )
    for aggregate in job.aggregates:
        if aggregate.column is not None and job.column(aggregate.column).spec.source not in (
            "json",
            "csv",
        ):
            return (
                f"{aggregate.function}({aggregate.column}) reads the Kafka record's "
                f"{job.column(aggregate.column).spec.source}: the live stages aggregate fields "
                "of the record's value"
            )
    return None


def output_row(
    job: Job,
    window_start_ms: int,
    key: str,
    count: int,
    merged: Sequence[Mapping[bytes, int]],
) -> dict[str, object]:
    """One (key, window) of a live run's result as the query names its columns: the grouping
    columns' texts (a key of several columns is their JSON array), the window's bounds as
    ISO-8601 UTC times, ``count(*)`` and each aggregate from the window's merged state
    (``merged``: a map per field of :attr:`Job.state_fields`), exact decimals as text and
    NULL as None.

    Example:
        >>> job = Job("", "t", (), ("user", "device"), None, Window("tumbling", 60_000, 60_000),
        ...           (Aggregate("count(*)", None, "hits"), Aggregate("max", "ms", "slowest")),
        ...           None, (Output("device", "device"), Output("start", "window.start"),
        ...            Output("hits", "hits"), Output("slowest", "slowest")))
        >>> key = '["u1","mobile"]'
        >>> output_row(job, 0, key, 3, [{key.encode(): 2}, {key.encode(): 7_500_000}])
        {'device': 'mobile', 'start': '1970-01-01T00:00:00.000Z', 'hits': 3, 'slowest': '7.5'}
    """
    parts = json.loads(key) if len(job.group_by) > 1 else [key]
    values: dict[str, object] = dict(zip(job.group_by, parts, strict=True))
    bounds = {"start": window_start_ms, "end": window_start_ms + job.window.size_ms}
    for bound, ms in bounds.items():
        values[f"window.{bound}"] = (
            datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
        ).replace("+00:00", "Z")
    fields, raw = job.state_fields, key.encode("utf-8", "surrogateescape")
    for aggregate in job.aggregates:
        if aggregate.column is None:
            values[aggregate.name] = count
            continue
        value = final(aggregate.function, [column_state(fields, merged, aggregate.column, raw)])
        # The shortest exact text, as --sum's sums are published.
        values[aggregate.name] = (
            format(value.normalize(), "f") if isinstance(value, Decimal) else value
        )
    return {output.name: values[output.source] for output in job.outputs}

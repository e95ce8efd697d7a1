"""A Spark SQL ``GROUP BY`` query, read by sqlglot into a :class:`~pipeline.io.query.job.Job`,
or refused with one line naming the construct and where it is.

Layer: io.

What a query may say, and why the rest is refused: docs/query.md.

Example:
    >>> job = parse_query(
    ...     "SELECT url, window.start, count(*) AS hits, sum(bytes) AS bytes FROM clicks "
    ...     "WHERE status = 200 GROUP BY url, window(timestamp_millis(ts), '1 minute')")
    >>> job.table, job.route_on.spec.text, job.time.text, job.window
    ('clicks', 'json:url', 'json:ts:ms', Window(kind='tumbling', size_ms=60000, slide_ms=60000))
    >>> [(a.function, a.column, a.name) for a in job.aggregates]
    [('count(*)', None, 'hits'), ('sum', 'bytes', 'bytes')]
    >>> parse_query("SELECT url, count(*) FROM clicks GROUP BY url HAVING count(*) > 9")
    Traceback (most recent call last):
    ...
    pipeline.io.query.parse.QueryError: --query: HAVING is not supported (line 1, column 47): \
filter the windows' rows where you read them
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlglot
from sqlglot import exp

from pipeline.io.extract import specs
from pipeline.io.extract.numbers_times import AMOUNT_DIGITS
from pipeline.io.query import job as j

#: Select arguments a job may not have, with the words that name them and what to do instead.
REFUSED_CLAUSES = {
    "having": ("HAVING", "filter the windows' rows where you read them"),
    "joins": ("a JOIN", "a job reads one topic"),
    "order": ("ORDER BY", "a window's rows are written as the window closes"),
    "limit": ("LIMIT", "a window's rows are written as the window closes"),
    "distinct": ("SELECT DISTINCT", "group by the columns instead"),
    "with_": ("WITH", "a job is one SELECT"),
    "qualify": ("QUALIFY", "a job is one SELECT"),
    "laterals": ("LATERAL VIEW", "a job reads one topic's fields"),
    "windows": ("a WINDOW clause", "group by window() or session_window()"),
    "offset": ("OFFSET", "a window's rows are written as the window closes"),
    "sort": ("SORT BY", "a window's rows are written as the window closes"),
    "cluster": ("CLUSTER BY", "the scheme places the keys"),
    "distribute": ("DISTRIBUTE BY", "the scheme places the keys"),
    "pivots": ("PIVOT", "a job is one GROUP BY"),
}
#: Spark's interval units a window's duration may use, in milliseconds.
DURATION_UNITS = {
    "millisecond": 1,
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}
#: More windows per record than this is refused: each record would update that many states.
MAX_WINDOWS_PER_RECORD = 100
COMPARISONS = {exp.EQ: "=", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
#: ``literal OP column`` read as ``column FLIPPED[OP] literal``.
FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
WINDOW_BOUNDS = ("start", "end")


class QueryError(ValueError):
    """A query skewer cannot run; str() is one line naming the construct and its position."""


def parse_query(text: str) -> j.Job:
    """The :class:`~pipeline.io.query.job.Job` ``text`` says, or :class:`QueryError`."""
    try:
        statements = sqlglot.parse(text, read="spark")
    except sqlglot.errors.ParseError as error:
        first = error.errors[0] if error.errors else {}
        where = f" (line {first.get('line', '?')}, column {first.get('col', '?')})"
        problem = str(first.get("description", error)).splitlines()[0]
        raise QueryError(f"--query: not Spark SQL{where}: {problem}") from None
    except sqlglot.errors.TokenError as error:
        raise QueryError(f"--query: not Spark SQL: {str(error).splitlines()[0]}") from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1:
        raise QueryError(f"--query: a job is one SELECT statement, not {len(statements)}")
    [statement] = statements
    if not isinstance(statement, exp.Select):
        raise _Reader(text).refused(statement, f"{statement.key.upper()} is not supported")
    return _Reader(text).job(statement)


class _Reader:
    """Reads one SELECT; keeps what it learned of the columns on the way."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.table = ""
        self.qualifiers: set[str] = set()
        self.columns: dict[str, j.Column] = {}
        #: column name -> the kinds its uses ask for, and where the first such use is.
        self.uses: dict[str, dict[str, exp.Expression]] = {}

    # --- where a construct is ------------------------------------------------------------

    def position(self, node: exp.Expression, keyword: str = "") -> str:
        """Where ``node`` begins in the text, or the last ``keyword`` before it (sqlglot keeps
        the positions of names and literals, not of keywords)."""
        starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
        if not starts:
            return ""
        start = min(starts)
        if keyword:
            found = list(re.finditer(rf"\b{keyword}\b", self.text[:start], re.IGNORECASE))
            start = found[-1].start() if found else start
        line = self.text.count("\n", 0, start) + 1
        return f" (line {line}, column {start - self.text.rfind(chr(10), 0, start)})"

    def refused(
        self, node: exp.Expression, problem: str, hint: str = "", keyword: str = ""
    ) -> QueryError:
        where = self.position(node, keyword)
        return QueryError(f"--query: {problem}{where}{': ' + hint if hint else ''}")

    # --- the statement -------------------------------------------------------------------

    def job(self, select: exp.Select) -> j.Job:
        for name, value in select.args.items():
            if value and name in REFUSED_CLAUSES:
                words, hint = REFUSED_CLAUSES[name]
                node = value[0] if isinstance(value, list) else value
                node = node if isinstance(node, exp.Expression) else select
                keyword = words.removeprefix("a ").split()[0]
                raise self.refused(node, f"{words} is not supported", hint, keyword)
            if value and name not in ("expressions", "from_", "where", "group"):
                raise self.refused(select, f"{name.upper().rstrip('_')} is not supported")
        for node in select.find_all(exp.Subquery, exp.Select, exp.Union):
            if node is not select:
                raise self.refused(
                    node, "a subquery is not supported", "a job is one SELECT", "SELECT"
                )
        self.read_from(select)
        group = select.args.get("group")
        if group is None:
            raise self.refused(select, "a job needs GROUP BY with window() or session_window()")
        group_by, time, window = self.read_group(group)
        where = select.args.get("where")
        predicate = self.predicate(where.this) if where is not None else None
        outputs, aggregates = self.read_select(select, group_by, window)
        columns = tuple(self.typed(column) for column in self.columns.values())
        return j.Job(
            self.text, self.table, columns, group_by, time, window, aggregates, predicate, outputs
        )

    def read_from(self, select: exp.Select) -> None:
        source = select.args.get("from_")
        if source is None:
            raise self.refused(select, "a job needs FROM naming its topic")
        table = source.this
        if not isinstance(table, exp.Table) or not table.name:
            raise self.refused(table, f"FROM {table.key.upper()} is not supported", "name a topic")
        self.table = ".".join(part.name for part in table.parts)
        self.qualifiers = {self.table, table.name} | ({table.alias} if table.alias else set())

    # --- GROUP BY and the window ---------------------------------------------------------

    def read_group(
        self, group: exp.Group
    ) -> tuple[tuple[str, ...], specs.FieldSpec | None, j.Window]:
        for name, value in group.args.items():
            if value and name != "expressions":
                raise self.refused(
                    group, f"GROUP BY {name.upper().replace('_', ' ')} is not supported"
                )
        columns: list[str] = []
        windows: list[tuple[specs.FieldSpec | None, j.Window]] = []
        for node in group.expressions:
            if isinstance(node, exp.Column):
                columns.append(self.use(node, None))
            elif _function_name(node) in ("window", "session_window"):
                windows.append(self.read_window(node))
            else:
                raise self.refused(
                    node,
                    f"GROUP BY {_spelled(node)} is not supported",
                    "group by columns and one window() or session_window()",
                )
        if len(windows) != 1:
            raise self.refused(
                group,
                f"GROUP BY has {len(windows)} windows",
                "group by exactly one window() or session_window()",
            )
        if not columns:
            raise self.refused(group, "GROUP BY names no column to group by")
        for name in columns:
            self.uses[name].setdefault("group", group)
        [(time, window)] = windows
        return tuple(dict.fromkeys(columns)), time, window

    def read_window(self, node: exp.Expression) -> tuple[specs.FieldSpec | None, j.Window]:
        name = _function_name(node)
        arguments = list(node.expressions)
        wanted = (2, 3, 4) if name == "window" else (2,)
        if len(arguments) not in wanted:
            raise self.refused(
                node,
                f"{name}() takes {' or '.join(map(str, wanted))} arguments, not {len(arguments)}",
            )
        time = self.time_spec(arguments[0])
        durations = [self.duration(argument) for argument in arguments[1:]]
        if name == "session_window":
            return time, j.Window("session", durations[0])
        if len(durations) == 3 and durations[2] != 0:
            raise self.refused(arguments[3], "a window start offset is not supported")
        size = durations[0]
        slide = durations[1] if len(durations) > 1 else size
        if slide > size:
            raise self.refused(arguments[2], "a window's slide is longer than its size")
        window = j.Window("tumbling" if slide == size else "hopping", size, slide)
        if window.windows_per_record > MAX_WINDOWS_PER_RECORD:
            raise self.refused(
                arguments[2],
                f"each record would fall in "
                f"{window.windows_per_record} windows (at most "
                f"{MAX_WINDOWS_PER_RECORD})",
            )
        return time, window

    def duration(self, node: exp.Expression) -> int:
        """Milliseconds of an interval string such as ``'1 minute'`` or ``'1 hour 30 minutes'``."""
        if not (isinstance(node, exp.Literal) and node.is_string):
            raise self.refused(node, "a window's duration must be a string such as '1 minute'")
        text = node.this.strip().lower()
        parts = re.findall(r"(\d+)\s*([a-z]+)", text)
        units = [DURATION_UNITS.get(unit.removesuffix("s")) for _, unit in parts]
        spelled = re.fullmatch(r"(\d+\s*[a-z]+\s*)+", text)
        if spelled is None or None in units:
            raise self.refused(
                node,
                f"not a duration: {node.this!r}",
                f"say a number and a unit ({', '.join(DURATION_UNITS)})",
            )
        milliseconds = sum(int(n) * (unit or 0) for (n, _), unit in zip(parts, units, strict=True))
        if milliseconds <= 0:
            raise self.refused(node, f"a window's duration must be positive, not {node.this!r}")
        return milliseconds

    def time_spec(self, node: exp.Expression) -> specs.FieldSpec | None:
        """Where the event time is: ``timestamp`` (Kafka's), ``timestamp_millis(f)``,
        ``timestamp_seconds(f)``, or an ISO-8601 text ``f`` (also ``to_timestamp(f)``); None for
        ``ts`` of skewer's own stream, whose records carry their event time in their header."""
        unit = "iso"
        if _function_name(node) in ("timestamp_millis", "timestamp_seconds"):
            unit = "ms" if _function_name(node) == "timestamp_millis" else "s"
            [node] = node.expressions or [None]
        elif isinstance(node, exp.Cast) and node.to.is_type("timestamp"):
            node = node.this
        if not isinstance(node, exp.Column):
            raise self.refused(
                node,
                f"{_spelled(node)} is not an event time",
                "say timestamp, timestamp_millis(f), timestamp_seconds(f) or an ISO-8601 field",
            )
        name = self.column_name(node)
        field = self.own_field(node)
        if self.table == j.OWN_STREAM:
            if name != "ts" or unit != "iso":
                raise self.refused(node, "the event time of skewer's own stream is ts")
            return None
        if field is None and name == "timestamp" and unit == "iso":
            return specs.parse_time("kafka-timestamp")
        if field is not None and field.startswith("csv:"):
            return specs.parse_time(f"{field}:{unit}")
        return specs.parse_time(f"json:{field or name}:{unit}")

    # --- SELECT --------------------------------------------------------------------------

    def read_select(
        self, select: exp.Select, group_by: tuple[str, ...], window: j.Window
    ) -> tuple[tuple[j.Output, ...], tuple[j.Aggregate, ...]]:
        outputs: list[j.Output] = []
        aggregates: list[j.Aggregate] = []
        bounds_of = "session_window" if window.kind == "session" else "window"
        for item in select.expressions:
            node = item.this if isinstance(item, exp.Alias) else item
            alias = item.alias if isinstance(item, exp.Alias) else ""
            if isinstance(node, exp.Star):
                raise self.refused(
                    node, "SELECT * is not supported", "name the grouped columns and the aggregates"
                )
            if isinstance(node, exp.Column) and node.table in ("window", "session_window"):
                if node.table != bounds_of or node.name not in WINDOW_BOUNDS:
                    raise self.refused(
                        node,
                        f"{node.sql('spark')} is not a column of this job",
                        f"say {bounds_of}.start or {bounds_of}.end",
                    )
                outputs.append(j.Output(alias or node.name, f"window.{node.name}"))
            elif isinstance(node, exp.Column):
                name = self.column_name(node)
                if name not in group_by:
                    raise self.refused(node, f"{name} is neither grouped nor aggregated")
                outputs.append(j.Output(alias or name, name))
            elif isinstance(node, exp.AggFunc):
                aggregate = self.aggregate(node, alias or node.sql("spark").lower())
                aggregates.append(aggregate)
                outputs.append(j.Output(aggregate.name, aggregate.name))
            else:
                raise self.refused(
                    node,
                    f"{_spelled(node)} is not supported in SELECT",
                    "select grouped columns, window bounds and aggregates",
                )
        names = [output.name for output in outputs]
        for name in names:
            if names.count(name) > 1:
                raise self.refused(select, f"two output columns are named {name}")
        if not aggregates:
            raise self.refused(select, "SELECT has no aggregate")
        return tuple(outputs), tuple(aggregates)

    def aggregate(self, node: exp.AggFunc, name: str) -> j.Aggregate:
        argument = node.this
        if isinstance(node, exp.Count):
            if isinstance(argument, exp.Star):
                return j.Aggregate("count(*)", None, name)
            if isinstance(argument, exp.Distinct):
                if len(argument.expressions) != 1:
                    raise self.refused(node, "count(DISTINCT) of several columns is not supported")
                [argument] = argument.expressions
                return j.Aggregate("count(DISTINCT)", self.argument(node, argument, None), name)
            return j.Aggregate("count", self.argument(node, argument, None), name)
        if isinstance(node, exp.ApproxDistinct):
            return j.Aggregate("approx_count_distinct", self.argument(node, argument, None), name)
        if isinstance(node, exp.ApproxQuantile):
            quantile = node.args.get("quantile")
            if not isinstance(quantile, exp.Literal) or quantile.is_string:
                raise self.refused(
                    quantile or node,
                    "percentile_approx's percentage must be one number between 0 and 1",
                )
            q = float(quantile.this)
            if not 0.0 <= q <= 1.0:
                raise self.refused(
                    quantile, f"percentile_approx's percentage {q:g} is not between 0 and 1"
                )
            column = self.argument(node, argument, j.NUMBER)
            return j.Aggregate("percentile_approx", column, name, quantile=q)
        functions = {exp.Sum: "sum", exp.Min: "min", exp.Max: "max", exp.Avg: "avg"}
        function = functions.get(type(node))
        if function is None:
            hint = "use percentile_approx" if isinstance(node, exp.Quantile) else ""
            label = _function_label(node)
            raise self.refused(
                node,
                f"aggregate {label} is not supported",
                hint or f"use {', '.join(j.AGGREGATES)}",
                label[:-2],
            )
        return j.Aggregate(function, self.argument(node, argument, j.NUMBER), name)

    def argument(self, call: exp.Expression, node: exp.Expression, kind: str | None) -> str:
        if not isinstance(node, exp.Column) or node.table in ("window", "session_window"):
            raise self.refused(
                node,
                f"{_function_label(call)} of {_spelled(node)} is not supported",
                "aggregate a column",
            )
        return self.use(node, kind)

    # --- WHERE ---------------------------------------------------------------------------

    def predicate(self, node: exp.Expression) -> j.Predicate:
        if isinstance(node, exp.Paren):
            return self.predicate(node.this)
        if isinstance(node, exp.And):
            return j.And(self.predicate(node.this), self.predicate(node.expression))
        if isinstance(node, exp.Or):
            return j.Or(self.predicate(node.this), self.predicate(node.expression))
        if isinstance(node, exp.Not):
            return j.Not(self.predicate(node.this))
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            return j.IsNull(self.filtered(node.this, None))
        if isinstance(node, exp.Like) and not node.args.get("escape"):
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise self.refused(pattern, "LIKE needs a string pattern")
            return j.Like(
                self.filtered(node.this, j.TEXT), pattern.this, bool(node.args.get("negate"))
            )
        if isinstance(node, exp.In) and not node.args.get("query"):
            values = [self.literal(value) for value in node.expressions]
            kinds = {j.TEXT if isinstance(v, str) else j.NUMBER for v in values}
            if len(kinds) != 1:
                raise self.refused(node, "IN mixes numbers and strings")
            return j.InList(self.filtered(node.this, kinds.pop()), tuple(values))
        if type(node) in COMPARISONS:
            op = COMPARISONS[type(node)]
            left, right = node.this, node.expression
            if isinstance(left, exp.Column) == isinstance(right, exp.Column):
                raise self.refused(
                    node,
                    f"{_spelled(node)} is not supported",
                    "compare a column with a number or a string",
                )
            if not isinstance(left, exp.Column):
                left, right, op = right, left, FLIPPED[op]
            value = self.literal(right)
            kind = j.TEXT if isinstance(value, str) else j.NUMBER
            return j.Compare(op, self.filtered(left, kind), value)
        raise self.refused(
            node,
            f"{_spelled(node)} is not supported in WHERE",
            "use comparisons, IN, LIKE, IS NULL, AND, OR and NOT",
        )

    def filtered(self, node: exp.Expression, kind: str | None) -> str:
        if not isinstance(node, exp.Column):
            raise self.refused(
                node, f"WHERE on {_spelled(node)} is not supported", "filter on a column"
            )
        return self.use(node, kind)

    def literal(self, node: exp.Expression) -> Decimal | str:
        negative = isinstance(node, exp.Neg)
        inner = node.this if negative else node
        if not isinstance(inner, exp.Literal) or (negative and inner.is_string):
            raise self.refused(node, f"{_spelled(node)} is not a number or a string")
        if inner.is_string:
            return str(inner.this)
        try:
            number = Decimal(inner.this)
        except InvalidOperation:
            raise self.refused(node, f"{inner.this} is not a number") from None
        exponent = number.as_tuple().exponent
        if isinstance(exponent, int) and exponent < -AMOUNT_DIGITS:
            raise self.refused(
                node,
                f"{inner.this} has more than {AMOUNT_DIGITS} decimal "
                "digits (numbers are kept in millionths)",
            )
        return -number if negative else number

    # --- columns -------------------------------------------------------------------------

    def column_name(self, node: exp.Column) -> str:
        if node.args.get("db") or node.args.get("catalog"):
            raise self.refused(node, f"{node.sql('spark')} is not a column of {self.table}")
        if node.table and node.table not in self.qualifiers | {"value"}:
            raise self.refused(node, f"{node.sql('spark')} is not a column of {self.table}")
        return f"value.{node.name}" if node.table == "value" else node.name

    def own_field(self, node: exp.Column) -> str | None:
        """``json:``-less field of a value column: ``value.f`` is the JSON field f even when
        f is ``key`` or ``timestamp``; ``_cN`` is CSV column N."""
        if node.table == "value":
            return node.name
        match = re.fullmatch(r"_c([0-9]{1,9})", node.name)
        return f"csv:{int(match.group(1))}" if match else None

    def use(self, node: exp.Column, kind: str | None) -> str:
        """Note a use of a column (``kind``: what it asks for, None for any) and return its
        name; refuse a column skewer's own stream does not have."""
        name = self.column_name(node)
        self.uses.setdefault(name, {}).setdefault(kind or "any", node)
        if name not in self.columns:
            self.columns[name] = self.column(node, name)
        return name

    def column(self, node: exp.Column, name: str) -> j.Column:
        field = self.own_field(node)
        if self.table == j.OWN_STREAM and (field is not None or name != "key"):
            raise self.refused(
                node,
                f"skewer's own stream has no column {name}",
                "its records carry a key and an event time (ts)",
            )
        if field is None and name == "key":
            spec = specs.parse_key("kafka-key")
        elif field is None and name == "timestamp":
            raise self.refused(node, "timestamp is the event time only", "group by window()")
        elif field is not None and field.startswith("csv:"):
            spec = specs.parse_key(field)
        else:
            spec = specs.parse_key(f"json:{field or name}")
        return j.Column(name, spec, j.TEXT)

    def typed(self, column: j.Column) -> j.Column:
        """The column with the kind its uses ask for: a number where one asks for a number,
        text where one asks for text; refused where they disagree."""
        uses = self.uses[column.name]
        if j.NUMBER in uses and j.TEXT in uses:
            raise QueryError(
                f"--query: {column.name} is read as a number"
                f"{self.position(uses[j.NUMBER])} and as text"
                f"{self.position(uses[j.TEXT])}: a column is one or the other"
            )
        kind = j.NUMBER if j.NUMBER in uses else j.TEXT
        if kind == j.NUMBER and column.spec.source == "kafka-key":
            raise self.refused(uses[j.NUMBER], "the Kafka key is read as text, not a number")
        if kind == j.NUMBER:
            spec = specs.parse_amount(column.spec.text)
            return j.Column(column.name, spec, kind)
        return column


def _function_name(node: exp.Expression) -> str:
    """A call's name in lower case, as written (sqlglot keeps unknown calls Anonymous)."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return ""


def _function_label(node: exp.Expression) -> str:
    """A call's name as Spark spells it, such as ``percentile()``."""
    return f"{node.sql('spark').split('(', 1)[0].lower()}()"


def _spelled(node: Any) -> str:
    """A short rendering of ``node`` for a message, on one line."""
    text = " ".join(node.sql("spark").split()) if isinstance(node, exp.Expression) else str(node)
    return text if len(text) <= 40 else text[:37] + "..."

"""A query's run checked by Spark SQL itself: the query's own text run in batch over the
records the run read, every row compared with the run's.

Layer: runs.

The recount (:mod:`pipeline.runs.recount`) extracts each record's columns with the run's own
extractor and hands them to Spark as a view: each column under its name in the query, a number
as ``DECIMAL(18, 6)`` (the exact millionths the run keeps), a text as a string, and the
extracted event time; the late records the run reported and the records no extractor could
read are left out. The query's text, with its ``FROM`` naming the view and its window's time
being the extracted one (:func:`spark_sql_text`), then runs on Spark SQL unchanged: its
``WHERE``, grouping, window and aggregates are Spark's. Each row of the run (one per key and
final window, :func:`pipeline.io.query.job.output_row`) must be one of Spark's, and none of
Spark's may be missing (:func:`compare_rows`). docs/query.md#checked-by-spark-sql.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.io.query.job import NUMBER, Column, Job

#: The view the recount's records are in, for the query's FROM.
VIEW = "skewer_recount"
#: The view's column of each record's extracted event time (epoch ms).
EVENT_TIME = "skewer_event_time_ms"
#: How a number column reaches Spark: exact millionths, as the run keeps them, below 10^12.
NUMBER_TYPE = pa.decimal128(18, 6)


def spark_sql_text(job: Job) -> str:
    """The query's text with ``FROM`` reading :data:`VIEW` (under the table's own name, so
    qualified columns still resolve) and its window's time the extracted event time.

    Example:
        >>> from pipeline.io.query.parse import parse_query
        >>> print(spark_sql_text(parse_query(
        ...     "SELECT url, count(*) FROM `clicks-1` GROUP BY url, window(ts, '1 second')")))
        ... # doctest: +NORMALIZE_WHITESPACE
        SELECT url, COUNT(*) FROM skewer_recount AS `clicks-1`
        GROUP BY url, WINDOW(TIMESTAMP_MILLIS(skewer_event_time_ms), '1 second')
    """
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(job.text, read="spark")
    for table in list(tree.find_all(exp.Table)):
        table.replace(exp.alias_(exp.to_table(VIEW), table.name, table=True))
    for call in tree.find_all(exp.Anonymous):
        if str(call.name).lower() in ("window", "session_window"):
            call.expressions[0].replace(sqlglot.parse_one(f"timestamp_millis({EVENT_TIME})"))
    return tree.sql(dialect="spark")


def view_arrays(
    columns: Sequence[Column], read: dict[str, pa.Array], event_time_ms: np.ndarray
) -> tuple[list[str], list[pa.Array]]:
    """The view's names and arrays of one batch, from the extractor's columns (``read``: a
    number's int64 millionths, a text's bytes; null where SQL's NULL)."""
    names, arrays = [EVENT_TIME], [pa.array(event_time_ms, pa.int64())]
    for column in columns:
        values = read[column.name]
        names.append(column.name)
        if column.kind == NUMBER:
            arrays.append(_decimals(values))
        else:
            arrays.append(values.cast(pa.string()))
    return names, arrays


def view_schema(columns: Sequence[Column]) -> str:
    """The Spark schema of :func:`view_arrays`' columns, to follow the recount's."""
    types = [f"`{EVENT_TIME}` long"]
    types += [f"`{c.name}` {'decimal(18,6)' if c.kind == NUMBER else 'string'}" for c in columns]
    return ", ".join(types)


def _decimals(millionths: pa.Array) -> pa.Array:
    """int64 millionths as ``DECIMAL(18, 6)``: the same integers, unscaled (no rounding)."""
    values = millionths.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    present = ~millionths.is_null().to_numpy(zero_copy_only=False)
    wide = np.empty((values.shape[0], 2), dtype=np.int64)
    wide[:, 0], wide[:, 1] = values, values >> 63  # little-endian int128, sign extended
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(
        NUMBER_TYPE, values.shape[0], [validity, pa.py_buffer(wide.tobytes())]
    )


def cell(value: Any) -> Any:
    """One of Spark's values as the run's rows show it: a decimal as its shortest exact
    text, a time as ISO-8601 UTC to the millisecond."""
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, datetime):
        stamp = value.astimezone(UTC).isoformat(timespec="milliseconds")
        return stamp.replace("+00:00", "Z")
    return value


@dataclass
class RowComparison:
    """The run's rows against Spark SQL's: how many of either, and the first few that only
    one side has (JSON text, ``run:`` or ``spark:`` before it)."""

    compared: int = 0
    mismatch_count: int = 0
    mismatches: list[str] = field(default_factory=list)


def compare_rows(
    job: Job, ours: Sequence[dict[str, Any]], spark_rows: Sequence[Sequence[Any]], keep: int = 20
) -> RowComparison:
    """``ours`` (the run's rows) against ``spark_rows`` (Spark's, columns in ``SELECT`` order),
    as multisets.

    Example:
        >>> from pipeline.io.query.parse import parse_query
        >>> job = parse_query("SELECT u, sum(b) AS b FROM t GROUP BY u, "
        ...                   "window(timestamp_millis(ts), '1 second')")
        >>> compare_rows(job, [{"u": "a", "b": "1.5"}], [("a", Decimal("1.500000"))])
        RowComparison(compared=1, mismatch_count=0, mismatches=[])
    """
    names = [output.name for output in job.outputs]
    run = Counter(json.dumps([row[name] for name in names]) for row in ours)
    spark = Counter(json.dumps([cell(value) for value in row]) for row in spark_rows)
    only = [f"run: {text}" for text in (run - spark).elements()]
    only += [f"spark: {text}" for text in (spark - run).elements()]
    return RowComparison(sum((run | spark).values()), len(only), only[:keep])

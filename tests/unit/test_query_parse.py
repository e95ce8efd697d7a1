"""A query's text read into the typed job, and each construct skewer cannot run refused with
one line naming it and its position."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.io.query import job as j
from pipeline.io.query.parse import QueryError, parse_query

CLICKS = """SELECT url, window.start, window.end, count(*) AS hits, sum(bytes) AS bytes,
       min(ms) AS fastest, max(ms) AS slowest, avg(ms) AS mean_ms,
       approx_count_distinct(user) AS users, percentile_approx(ms, 0.99) AS p99_ms
FROM clicks WHERE status = 200
GROUP BY url, window(timestamp_millis(ts), '1 minute', '10 seconds')"""


def test_the_full_query_becomes_one_typed_job() -> None:
    job = parse_query(CLICKS)
    assert job.table == "clicks"
    assert job.group_by == ("url",) and job.route_on.spec.text == "json:url"
    assert job.time is not None and job.time.text == "json:ts:ms"
    assert job.window == j.Window("hopping", 60_000, 10_000)
    assert job.window.windows_per_record == 6
    assert [(a.function, a.column, a.name, a.quantile) for a in job.aggregates] == [
        ("count(*)", None, "hits", None),
        ("sum", "bytes", "bytes", None),
        ("min", "ms", "fastest", None),
        ("max", "ms", "slowest", None),
        ("avg", "ms", "mean_ms", None),
        ("approx_count_distinct", "user", "users", None),
        ("percentile_approx", "ms", "p99_ms", 0.99),
    ]
    assert [o.name for o in job.outputs] == [
        "url",
        "start",
        "end",
        "hits",
        "bytes",
        "fastest",
        "slowest",
        "mean_ms",
        "users",
        "p99_ms",
    ]
    kinds = {c.name: (c.kind, c.spec.text) for c in job.columns}
    assert kinds == {
        "url": (j.TEXT, "json:url"),
        "bytes": (j.NUMBER, "json:bytes"),
        "ms": (j.NUMBER, "json:ms"),
        "user": (j.TEXT, "json:user"),
        "status": (j.NUMBER, "json:status"),
    }
    assert job.where == j.Compare("=", "status", Decimal(200))
    assert job.value_format == "json"


def test_sessions_distinct_counts_and_compound_keys() -> None:
    job = parse_query(
        "SELECT user, device, session_window.start, count(DISTINCT url) AS pages, count(url) "
        "FROM visits GROUP BY user, device, session_window(at, '5 minutes')"
    )
    assert job.window == j.Window("session", 300_000)
    assert job.group_by == ("user", "device") and job.route_on.name == "user"
    assert job.time is not None and job.time.text == "json:at:iso"
    assert [(a.function, a.name) for a in job.aggregates] == [
        ("count(DISTINCT)", "pages"),
        ("count", "count(url)"),
    ]
    assert [o.source for o in job.outputs] == [
        "user",
        "device",
        "window.start",
        "pages",
        "count(url)",
    ]


def test_kafka_columns_csv_columns_and_skewers_own_stream() -> None:
    kafka = parse_query("SELECT key, count(*) FROM t GROUP BY key, window(timestamp, '10 seconds')")
    assert kafka.route_on.spec.text == "kafka-key"
    assert kafka.time is not None and kafka.time.text == "kafka-timestamp"
    assert kafka.window == j.Window("tumbling", 10_000, 10_000) and kafka.value_format is None

    csv = parse_query(
        "SELECT _c0, sum(_c2) FROM t GROUP BY _c0, window(timestamp_seconds(_c1), "
        "'1 hour 30 minutes')"
    )
    assert csv.route_on.spec.text == "csv:0" and csv.column("_c2").spec.text == "csv:2"
    assert csv.time is not None and csv.time.text == "csv:1:s"
    assert csv.window.size_ms == 5_400_000 and csv.value_format == "csv"

    shadowed = parse_query(
        "SELECT value.key, count(*) FROM t GROUP BY value.key, window(value.timestamp, '1 second')"
    )
    assert shadowed.route_on.spec.text == "json:key"
    assert shadowed.time is not None and shadowed.time.text == "json:timestamp:iso"

    own = parse_query("SELECT key, count(*) FROM keys GROUP BY key, window(ts, '10 seconds')")
    assert own.table == j.OWN_STREAM and own.time is None


def test_where_reads_comparisons_in_like_null_and_logic() -> None:
    job = parse_query(
        "SELECT url, count(*) FROM t WHERE (status >= 500 OR 404 = status) AND url NOT LIKE "
        "'/health%' AND method IN ('GET', 'HEAD') AND NOT region IS NULL AND ms > -1.5 "
        "GROUP BY url, window(timestamp, '1 minute')"
    )
    assert job.where == j.And(
        j.And(
            j.And(
                j.And(
                    j.Or(
                        j.Compare(">=", "status", Decimal(500)),
                        j.Compare("=", "status", Decimal(404)),
                    ),
                    j.Like("url", "/health%", negated=True),
                ),
                j.InList("method", ("GET", "HEAD")),
            ),
            j.Not(j.IsNull("region")),
        ),
        j.Compare(">", "ms", Decimal("-1.5")),
    )
    assert job.column("status").kind == j.NUMBER and job.column("method").kind == j.TEXT
    assert job.column("region").kind == j.TEXT


GROUPED = "GROUP BY url, window(timestamp, '1 minute')"

#: Queries skewer refuses, and what the one line must say (its position included).
REFUSED = [
    (
        "SELECT url, count(*) FROM t GROUP BY url HAVING count(*) > 1",
        "HAVING is not supported (line 1, column 42)",
    ),
    (
        "SELECT url, count(*) FROM t JOIN u ON t.a = u.a " + GROUPED,
        "a JOIN is not supported (line 1, column 29)",
    ),
    (
        "SELECT url, count(*) FROM (SELECT url FROM t) " + GROUPED,
        "a subquery is not supported (line 1, column 28)",
    ),
    (
        "SELECT url, count(*) FROM t WHERE url IN (SELECT u FROM v) " + GROUPED,
        "a subquery is not supported (line 1, column 43)",
    ),
    (
        "SELECT url, percentile(ms, 0.5) FROM t " + GROUPED,
        "aggregate percentile() is not supported (line 1, column 13): use percentile_approx",
    ),
    ("SELECT url, stddev(ms) FROM t " + GROUPED, "aggregate stddev() is not supported"),
    (
        "SELECT url, count(*) FROM t GROUP BY url, window(timestamp, '1 minute', '5 minutes')",
        "a window's slide is longer than its size (line 1, column 73)",
    ),
    (
        "SELECT url, count(*) FROM t GROUP BY url, window(timestamp, '1 fortnight')",
        "not a duration: '1 fortnight' (line 1, column 61)",
    ),
    ("SELECT url, count(*) FROM t GROUP BY url", "GROUP BY has 0 windows (line 1, column 38)"),
    ("SELECT url, ms, count(*) FROM t " + GROUPED, "ms is neither grouped nor aggregated"),
    (
        "SELECT url, upper(url), count(*) FROM t " + GROUPED,
        "UPPER(url) is not supported in SELECT (line 1, column 13)",
    ),
    (
        "SELECT url, count(*) FROM t WHERE a = b " + GROUPED,
        "a = b is not supported (line 1, column 35): compare a column with a number or a string",
    ),
    (
        "SELECT url, count(*) FROM t WHERE lower(url) = 'a' " + GROUPED,
        "LOWER(url) = 'a' is not supported",
    ),
    (
        "SELECT url, sum(url) FROM t WHERE url LIKE 'a%' " + GROUPED,
        "url is read as a number (line 1, column 17) and as text (line 1, column 35)",
    ),
    ("SELECT url, sum(ms * 2) FROM t " + GROUPED, "sum() of ms * 2 is not supported"),
    (
        "SELECT url, count(*) FROM t WHERE ms > 0.1234567 " + GROUPED,
        "0.1234567 has more than 6 decimal digits",
    ),
    ("SELECT url, count(*) FROM t GROUP BY url, window(timestamp, '1 minute'", "not Spark SQL"),
    ("SELECT url, count(*) FROM t " + GROUPED + " ORDER BY url", "ORDER BY is not supported"),
    (
        "SELECT url, count(*) FROM t GROUP BY url, window(timestamp, '1 day', '1 second')",
        "each record would fall in 86400 windows",
    ),
    ("SELECT url, count(*) FROM keys " + GROUPED, "skewer's own stream has no column url"),
    ("SELECT url FROM t " + GROUPED, "SELECT has no aggregate"),
    ("SELECT 1; SELECT 2", "a job is one SELECT statement, not 2"),
    (
        "SELECT url, count(*) FROM t GROUP BY url, window(timestamp, '1 minute') LIMIT 5",
        "LIMIT is not supported (line 1, column 73)",
    ),
    ("SELECT url, count(*) AS n, sum(ms) AS n FROM t " + GROUPED, "two output columns are named n"),
    (
        "SELECT url, count(*) FROM t GROUP BY url, window(ts, '1 minute'), window(ts, '2 minutes')",
        "GROUP BY has 2 windows",
    ),
    (
        "SELECT url, count(*) FROM t GROUP BY ROLLUP(url), window(timestamp, '1 minute')",
        "GROUP BY ROLLUP (url) is not supported",
    ),
]


@pytest.mark.parametrize(("query", "said"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_each_unsupported_construct_is_refused_in_one_line_naming_it(query: str, said: str) -> None:
    with pytest.raises(QueryError) as refused:
        parse_query(query)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("--query: ")
    assert said in line

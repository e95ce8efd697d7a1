"""WHERE over a batch by Arrow's kernels equals SQL's three-valued logic row by row."""

from __future__ import annotations

import re
from decimal import Decimal

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from pipeline.io.query import job as j
from pipeline.io.query.parse import parse_query
from pipeline.io.query.predicate import columns_read, kept

NUMBERS = st.one_of(st.none(), st.integers(-3, 3).map(lambda n: n * 500_000))
TEXTS = st.one_of(st.none(), st.sampled_from([b"", b"a", b"ab", b"b_", b"%a", b"ba"]))
LITERAL_NUMBERS = st.sampled_from([Decimal("-1"), Decimal("0"), Decimal("0.5"), Decimal("1.5")])
LITERAL_TEXTS = st.sampled_from(["", "a", "ab", "b_", "ba"])
PATTERNS = st.sampled_from(["a%", "%a", "_", "b\\_", "%", "a_", "\\%a"])


def leaves() -> st.SearchStrategy[j.Predicate]:
    ops = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])
    return st.one_of(
        st.builds(j.Compare, ops, st.just("n"), LITERAL_NUMBERS),
        st.builds(j.Compare, ops, st.just("t"), LITERAL_TEXTS),
        st.builds(
            j.InList, st.just("n"), st.lists(LITERAL_NUMBERS, min_size=1).map(tuple), st.booleans()
        ),
        st.builds(
            j.InList, st.just("t"), st.lists(LITERAL_TEXTS, min_size=1).map(tuple), st.booleans()
        ),
        st.builds(j.Like, st.just("t"), PATTERNS, st.booleans()),
        st.builds(j.IsNull, st.sampled_from(["n", "t"]), st.booleans()),
    )


PREDICATES = st.recursive(
    leaves(),
    lambda inner: st.one_of(
        st.builds(j.And, inner, inner), st.builds(j.Or, inner, inner), st.builds(j.Not, inner)
    ),
    max_leaves=6,
)


def like_regex(pattern: str) -> re.Pattern[bytes]:
    out, escaped = "", False
    for char in pattern:
        if escaped:
            out, escaped = out + re.escape(char), False
        elif char == "\\":
            escaped = True
        else:
            out += {"%": ".*", "_": "."}.get(char, re.escape(char))
    return re.compile(out.encode(), re.DOTALL)


def literal(value: Decimal | str) -> bytes | int:
    return value.encode() if isinstance(value, str) else int(value * 1_000_000)


def sql_truth(predicate: j.Predicate, row: dict[str, object]) -> bool | None:
    """SQL's three-valued truth of ``predicate`` on one row, written the slow, plain way."""
    if isinstance(predicate, j.And):
        left, right = sql_truth(predicate.left, row), sql_truth(predicate.right, row)
        return False if False in (left, right) else (None if None in (left, right) else True)
    if isinstance(predicate, j.Or):
        left, right = sql_truth(predicate.left, row), sql_truth(predicate.right, row)
        return True if True in (left, right) else (None if None in (left, right) else False)
    if isinstance(predicate, j.Not):
        truth = sql_truth(predicate.operand, row)
        return None if truth is None else not truth
    value = row[predicate.column]
    if isinstance(predicate, j.IsNull):
        return (value is not None) if predicate.negated else (value is None)
    if value is None:
        return None
    if isinstance(predicate, j.Compare):
        other = literal(predicate.value)
        truth: bool = {
            "=": value == other,
            "!=": value != other,
            "<": value < other,
            "<=": value <= other,
            ">": value > other,
            ">=": value >= other,
        }[predicate.op]
        return truth
    if isinstance(predicate, j.Like):
        truth = like_regex(predicate.pattern).fullmatch(value) is not None  # type: ignore[arg-type]
    else:
        truth = value in [literal(v) for v in predicate.values]
    return (not truth) if predicate.negated else truth


@given(PREDICATES, st.lists(st.tuples(NUMBERS, TEXTS), max_size=30))
def test_kept_rows_are_those_where_sql_says_true(
    predicate: j.Predicate, rows: list[tuple[int | None, bytes | None]]
) -> None:
    columns = {
        "n": pa.array([n for n, _ in rows], pa.int64()),
        "t": pa.array([t for _, t in rows], pa.binary()),
    }
    expected = [sql_truth(predicate, {"n": n, "t": t}) is True for n, t in rows]
    assert kept(predicate, columns).tolist() == expected
    assert columns_read(predicate) <= {"n", "t"}


def test_a_parsed_where_filters_a_batch() -> None:
    job = parse_query(
        "SELECT url, count(*) FROM t WHERE status >= 500 AND url NOT LIKE '/health%' "
        "GROUP BY url, window(timestamp, '1 minute')"
    )
    assert job.where is not None and columns_read(job.where) == {"status", "url"}
    columns = {
        "status": pa.array([500_000_000, 200_000_000, 503_000_000, None, 501_000_000]),
        "url": pa.array([b"/a", b"/b", b"/health/z", b"/c", None]),
    }
    assert kept(job.where, columns).tolist() == [True, False, False, False, False]

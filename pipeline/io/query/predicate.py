"""A query's ``WHERE``, evaluated over a whole batch by Arrow's compute kernels.

Layer: io.

A batch is one Arrow array per column the predicate reads: a :data:`~pipeline.io.query.job.
NUMBER` column as int64 millionths, a :data:`~pipeline.io.query.job.TEXT` column as binary,
null where the record has no such field (or, for a number, a field that is not one). Logic is
SQL's three-valued one (Arrow's Kleene kernels): a comparison with NULL is NULL, and a row is
kept only where the predicate is TRUE, as Spark keeps it.

Example:
    >>> import pyarrow as pa
    >>> from decimal import Decimal
    >>> from pipeline.io.query import job as j
    >>> where = j.Or(j.Compare(">=", "status", Decimal(500)), j.Like("url", "/api/%"))
    >>> kept(where, {"status": pa.array([200_000_000, 503_000_000, None, None]),
    ...              "url": pa.array([b"/api/a", b"/", b"/api/b", None])}).tolist()
    [True, True, True, False]
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.extract.numbers_times import AMOUNT_DIGITS
from pipeline.io.query import job as j

COMPARE = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def kept(predicate: j.Predicate, columns: Mapping[str, pa.Array]) -> np.ndarray:
    """Boolean mask of the rows where ``predicate`` is TRUE."""
    truth = _truth(predicate, columns)
    return np.asarray(pc.fill_null(truth, False).to_numpy(zero_copy_only=False), dtype=bool)


def columns_read(predicate: j.Predicate) -> set[str]:
    """The names of the columns ``predicate`` reads."""
    if isinstance(predicate, j.And | j.Or):
        return columns_read(predicate.left) | columns_read(predicate.right)
    if isinstance(predicate, j.Not):
        return columns_read(predicate.operand)
    return {predicate.column}


def scalar(value: Decimal | str) -> pa.Scalar:
    """A literal as its column holds it: a number in millionths, a string as UTF-8 bytes."""
    if isinstance(value, str):
        return pa.scalar(value.encode(), pa.binary())
    return pa.scalar(int(value.scaleb(AMOUNT_DIGITS)), pa.int64())


def _truth(predicate: j.Predicate, columns: Mapping[str, pa.Array]) -> pa.Array:
    if isinstance(predicate, j.And):
        return pc.and_kleene(_truth(predicate.left, columns), _truth(predicate.right, columns))
    if isinstance(predicate, j.Or):
        return pc.or_kleene(_truth(predicate.left, columns), _truth(predicate.right, columns))
    if isinstance(predicate, j.Not):
        return pc.invert(_truth(predicate.operand, columns))
    column = columns[predicate.column]
    if isinstance(predicate, j.IsNull):
        return pc.is_valid(column) if predicate.negated else pc.is_null(column)
    if isinstance(predicate, j.Compare):
        return COMPARE[predicate.op](column, scalar(predicate.value))
    if isinstance(predicate, j.Like):
        truth = pc.match_like(column, predicate.pattern)
    else:
        values = pa.array([scalar(value).as_py() for value in predicate.values], column.type)
        # is_in answers FALSE for a NULL row; SQL's ``NULL IN (...)`` is NULL.
        unknown = pa.nulls(len(column), pa.bool_())
        truth = pc.if_else(pc.is_null(column), unknown, pc.is_in(column, value_set=values))
    return pc.invert(truth) if predicate.negated else truth

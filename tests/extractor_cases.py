"""Shared by the extractor tests (tests/unit/test_extractors*.py): build an extractor, run it
on a list and on Arrow alike, name the reasons, decode a value as ``json.loads`` does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.io.dead_letters import (
    REASONS,
)
from pipeline.io.extractors import (
    Extraction,
    Extractor,
    parse_amount,
    parse_key,
    parse_time,
)

OK = -1
TIME_LIMIT = 10**18


def extractor(key: str, time: str, amount: str | None = None) -> Extractor:
    return Extractor(parse_key(key), parse_time(time), parse_amount(amount) if amount else None)


def run(ex: Extractor, values: list[bytes | None], keys: Any = None, stamps: Any = None) -> Any:
    """Extract from a list and from Arrow; both must agree exactly. Returns the list result."""
    n = len(values)
    if ex.key.source == "kafka-key" and keys is None:
        keys = [b"k"] * n
    if ex.time.source == "kafka-timestamp" and stamps is None:
        stamps = np.zeros(n, dtype=np.int64)
    from_list = ex.extract(values, keys, stamps)
    arrow_keys = pa.array(keys, pa.binary()) if keys is not None else None
    from_arrow = ex.extract(pa.array(values, pa.binary()), arrow_keys, stamps)
    assert_same(from_list, from_arrow)
    assert len(from_list.keys) == n
    assert from_list.event_time_ms.dtype == np.int64 and from_list.event_time_ms.shape == (n,)
    assert from_list.amount_micros.dtype == np.int64 and from_list.amount_micros.shape == (n,)
    assert from_list.reasons.dtype == np.int8 and from_list.reasons.shape == (n,)
    bad = from_list.reasons >= 0
    assert all(from_list.keys[i] == b"" for i in np.flatnonzero(bad))
    assert not from_list.event_time_ms[bad].any() and not from_list.amount_micros[bad].any()
    return from_list


def assert_same(a: Extraction, b: Extraction) -> None:
    assert a.keys.to_list() == b.keys.to_list()
    assert a.event_time_ms.tolist() == b.event_time_ms.tolist()
    assert a.amount_micros.tolist() == b.amount_micros.tolist()
    assert a.reasons.tolist() == b.reasons.tolist()


def named(reasons: np.ndarray) -> list[str]:
    return [REASONS[r] if r >= 0 else "ok" for r in reasons]


def utc_ms(text: str) -> int:
    """Epoch ms of an ISO text by ``datetime`` (no offset = UTC), floored to the ms."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def reference_decode(value: bytes | None) -> dict[str, Any] | None:
    """The object json.loads makes of a value (numbers as written), or None."""
    if value is None:
        return None
    try:
        text = value.decode("utf-8", "surrogatepass")
        obj = json.loads(text, parse_float=Decimal)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None

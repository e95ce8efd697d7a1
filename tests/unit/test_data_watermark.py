"""A user topic's watermark and lateness rule (pipeline.stages.user_topic), without services."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.io.records import END_OF_STREAM
from pipeline.stages.user_topic import NO_WATERMARK, DataWatermark, late_rows


def late_by_loop(
    times: list[int], valid: list[bool], bound: int, window: int, lateness: int, floor: int
) -> list[bool]:
    """The rule written out record by record: the watermark before a record is the highest
    valid event time before it minus the bound (never below ``floor``)."""
    highest = None
    out = []
    for t, ok in zip(times, valid, strict=True):
        before = floor
        if highest is not None:
            before = max(before, highest - bound)
        closes = (t // window) * window + window - 1 + lateness
        out.append(ok and before != NO_WATERMARK and closes <= before)
        if ok:
            highest = t if highest is None else max(highest, t)
    return out


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 200_000), st.booleans()), min_size=1, max_size=60),
    bound=st.integers(0, 20_000),
    lateness=st.integers(0, 5_000),
    split=st.integers(0, 60),
)
def test_lateness_depends_on_the_stream_order_not_on_batches(
    rows: list[tuple[int, bool]], bound: int, lateness: int, split: int
) -> None:
    times = [t for t, _ in rows]
    valid = [ok for _, ok in rows]
    expected = late_by_loop(times, valid, bound, 10_000, lateness, NO_WATERMARK)
    # the same rows in two batches: the first batch's watermark state carries over
    watermark = DataWatermark(bound_ms=bound)
    got: list[bool] = []
    for start, stop in ((0, split), (split, len(rows))):
        t = np.array(times[start:stop], dtype=np.int64)
        v = np.array(valid[start:stop], dtype=bool)
        late = late_rows(t, v, watermark, 10_000, lateness)
        got += late.tolist()
        watermark.observe(t[v & ~late])
        watermark.advance()
    assert got == expected


def test_an_idle_floor_makes_older_records_late_and_finish_ends_the_stream() -> None:
    watermark = DataWatermark(bound_ms=1_000)
    watermark.raise_to(50_000)
    assert watermark.advance() == 50_000
    late = late_rows(np.array([39_999, 40_000, 50_000]), np.ones(3, bool), watermark, 10_000, 0)
    assert late.tolist() == [True, True, False]
    watermark.finish()
    assert watermark.advance() == END_OF_STREAM and watermark.ended


def test_the_watermark_state_survives_the_offset_metadata() -> None:
    watermark = DataWatermark(bound_ms=5_000, end_offset=42)
    watermark.observe(np.array([100_000]))
    watermark.raise_to(7)
    watermark.advance()
    restored = DataWatermark(bound_ms=5_000).restored(watermark.to_metadata())
    assert restored == watermark
    assert DataWatermark(bound_ms=5).restored(None) == DataWatermark(bound_ms=5)

"""A user topic's watermark and lateness rule (pipeline.stages.user_topic), without services."""

from __future__ import annotations

import re

import numpy as np
import pytest
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


def test_ending_offsets_reach_the_grouping_stage_and_survive_redis() -> None:
    from pipeline.cli.arguments import UsageError
    from pipeline.cli.group import with_ending_offsets
    from pipeline.io import config
    from pipeline.io.kafka_io import RunNames
    from pipeline.runs.plan import RunPlan
    from pipeline.stages.user_topic import describe, restore

    plan = RunPlan(
        scheme="pkg", records=10, sources=2, input_topic="t", ending_offsets=(5, 7), run_id="r"
    )
    argv = plan.argv("group", config.load({}))
    assert argv[argv.index("--ending-offsets") + 1] == "5,7"
    topic = plan.user_topic()
    assert topic is not None and topic.ending_offsets == (5, 7)
    restored, _prefix = restore(describe(topic, RunNames("r")))
    assert restored == topic
    bare = RunPlan(scheme="pkg", records=10, input_topic="t", run_id="r").user_topic()
    assert bare is not None and restore(describe(bare, RunNames("r")))[0].ending_offsets is None
    assert "--ending-offsets" not in RunPlan(scheme="pkg", records=10, run_id="r").argv("group")
    assert with_ending_offsets(bare, "3,4", 2).ending_offsets == (3, 4)
    for listed, sources, message in [
        ("3", 2, "--ending-offsets gives 1 offset(s) for 2 partition(s)"),
        ("3,x", 2, "--ending-offsets '3,x': not a list of offsets"),
        ("3,-1", 2, "--ending-offsets must be >= 0, got [3, -1]"),
    ]:
        with pytest.raises(UsageError, match=re.escape(message)):
            with_ending_offsets(bare, listed, sources)
    with pytest.raises(UsageError, match="--ending-offsets needs --input-topic"):
        with_ending_offsets(None, "3,4", 2)

"""The grouping-stage benchmarks run: `python -m bench.grouping_stage` and `skewer bench own-topic`.

Their committed results (bench/results/grouping_stage.md, own_topic.md) are only as good as the
code that can re-run them, so each runs here once at a small size against the real services:
every input record read, every rate positive, the ratio computed from the pair.
"""

from __future__ import annotations

import pytest

from bench import grouping_stage, own_topic
from pipeline.io import config

pytestmark = [pytest.mark.integration]


def test_the_grouping_stage_benchmark_measures_a_scheme_and_its_passthrough(
    settings: config.Settings,
) -> None:
    data = grouping_stage.run(
        records=20_000, workers=4, batch_size=5_000, schemes=["pkg"], repeats=1, log=lambda *_: None
    )
    [row] = data["rows"]
    assert row["scheme"] == "pkg"
    assert row["rate"] > 0 and row["passthrough"] > 0
    assert row["ratio"] == pytest.approx(row["rate"] / row["passthrough"])


def test_the_own_topic_benchmark_measures_every_input(settings: config.Settings) -> None:
    result = own_topic.run(records=20_000, workers=4, rounds=1, log=lambda *_: None)
    rows = {row["input"]: row for row in result.data["rows"]}
    assert set(rows) == set(own_topic.INPUTS)
    for row in rows.values():
        assert row["rate"] > 0 and row["own"] > 0
        assert row["ratio"] == pytest.approx(row["rate"] / row["own"])

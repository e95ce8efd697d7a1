"""The grouping-stage benchmarks run: `skewer bench grouping` and `skewer bench own-topic`.

Their committed results (bench/results/grouping_stage.md, own_topic.md) are only as good as the
code that can re-run them, so each runs here once at a small size against the real services:
every input record read, every rate positive, the ratio computed from the pair, and nothing of
the run left behind.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import grouping_stage, own_topic
from pipeline.io import config, kafka_security

pytestmark = [pytest.mark.integration]


def _bench_leftovers(settings: config.Settings, redis: Any) -> set[str]:
    """The grouping bench's topics and Redis keys that exist now."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_security.admin_config(settings.kafka_bootstrap))
    topics = admin.list_topics(timeout=10).topics
    keys = {key.decode() for key in redis.scan_iter(match="skewer:bench-stage-*", count=1000)}
    return {name for name in topics if name.startswith("bench-stage-")} | keys


def test_the_grouping_stage_benchmark_measures_a_scheme_and_its_passthrough_per_interval(
    settings: config.Settings, redis: Any
) -> None:
    before = _bench_leftovers(settings, redis)
    result = grouping_stage.run(
        records=20_000,
        workers=4,
        batch_size=5_000,
        schemes=["pkg"],
        repeats=1,
        commit_intervals_ms=[100, 5],
        log=lambda *_: None,
    )
    rows = {row["commit_interval_ms"]: row for row in result.data["rows"]}
    assert set(rows) == {100, 5}
    for row in rows.values():
        assert row["scheme"] == "pkg"
        assert row["rate"] > 0 and row["passthrough"] > 0
        assert row["ratio"] == pytest.approx(row["rate"] / row["passthrough"])
        assert row["transactions"] >= 4  # 20,000 records (and watermarks) in batches of 5,000
    intervals = [summary["commit_interval_ms"] for summary in result.data["intervals"]]
    assert intervals == [100, 5]
    assert "| 100 ms |" in result.markdown and "| 5 ms |" in result.markdown
    # All five of the run's topics (late too) and every measurement's Redis keys are gone.
    assert _bench_leftovers(settings, redis) - before == set()


def test_the_own_topic_benchmark_measures_every_input(settings: config.Settings) -> None:
    result = own_topic.run(records=20_000, workers=4, rounds=1, log=lambda *_: None)
    rows = {row["input"]: row for row in result.data["rows"]}
    assert set(rows) == set(own_topic.INPUTS)
    for row in rows.values():
        assert row["rate"] > 0 and row["own"] > 0
        assert row["ratio"] == pytest.approx(row["rate"] / row["own"])

"""pipeline/observe/ without services: bucket conversion, imbalance gauges, label handling,
target files, the exporter's HTTP endpoint and final scrape, multiprocess mode, the Prometheus
configuration and recording rules (promtool), exact values throughout.

Long because the observe layer's checks share one set of fake counters and exporter fixtures.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from operators import registry
from operators.keys import KeyBatch
from operators.metrics import (
    bucket_upper_ms,
    imbalance,
    latency_buckets,
    load_figures,
    max_avg_ratio,
)
from pipeline.io import config
from pipeline.io.kafka_io import RunNames
from pipeline.io.records import encode_input
from pipeline.observe import aggregator as aggregator_metrics
from pipeline.observe import controller as controller_metrics
from pipeline.observe import exporter as exporter_module
from pipeline.observe import grouping as grouping_metrics
from pipeline.observe import producer as producer_metrics
from pipeline.observe import series as metric_series
from pipeline.observe import workers as worker_metrics
from pipeline.runs.plan import RunPlan
from pipeline.services import manager
from pipeline.stages import grouping
from producers.kafka_producer import plan_stream

PROMETHEUS_DIR = config.DEPLOY_DIR / "prometheus"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")


@pytest.fixture
def settings(tmp_path: Path) -> config.Settings:
    """Settings with a private run dir and a Prometheus address nobody listens on."""
    return config.load(
        {"SKEWER_RUN_DIR": str(tmp_path / "run"), "SKEWER_PROMETHEUS_URL": "http://127.0.0.1:9"}
    )


def _get(url: str, user_agent: str = "skewer-test") -> str:
    request = urllib.request.Request(url, headers={"User-Agent": user_agent})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read().decode()


def _samples(text: str, run: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, labels without run/scheme) -> value, for the series of run ``run``."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("run") == run:
                labels = tuple(
                    sorted((k, v) for k, v in sample.labels.items() if k not in ("run", "scheme"))
                )
                out[(sample.name, labels)] = sample.value
    return out


# --- the series and their labels -------------------------------------------------------------


def test_every_contract_series_is_defined_once_with_run_and_scheme() -> None:
    contract = {
        "skewer_producer_records_total": ("producer",),
        "skewer_grouping_records_total": ("source",),
        "skewer_grouping_routed_total": ("source", "worker"),
        "skewer_grouping_dead_letters_total": ("source", "reason"),
        "skewer_grouping_late_records_total": ("source",),
        "skewer_grouping_filtered_records_total": ("source",),
        "skewer_grouping_batch_seconds": ("source",),
        "skewer_routing_table_version": ("source",),
        "skewer_routing_table_entries": ("source",),
        "skewer_worker_records_total": ("worker",),
        "skewer_worker_latency_seconds": ("worker",),
        "skewer_worker_lag_records": ("worker",),
        "skewer_worker_state_entries": ("worker",),
        "skewer_worker_field_entries": ("worker", "field"),
        "skewer_worker_held_records_total": ("worker",),
        "skewer_worker_late_records_total": ("worker",),
        "skewer_worker_rejected_total": ("worker",),
        "skewer_worker_batches_total": ("worker",),
        "skewer_imbalance_records": (),
        "skewer_imbalance_fraction": (),
        "skewer_load_max_over_avg": (),
        "skewer_aggregator_windows_final_total": (),
        "skewer_aggregator_records_final_total": (),
        "skewer_replication": (),
        "skewer_watermark_seconds": (),
        "skewer_controller_intervals_total": ("outcome",),
        "skewer_controller_imbalance": (),
        "skewer_controller_tolerance": (),
        "skewer_controller_table_version": (),
        "skewer_controller_table_entries": (),
        "skewer_planning_seconds": (),
        "skewer_migrations_total": (),
        "skewer_migration_in_progress": (),
        "skewer_migration_keys_moved_total": (),
        "skewer_migration_state_entries_moved_total": (),
        "skewer_migration_state_bytes_moved_total": (),
        "skewer_migration_held_records_total": (),
        "skewer_migration_duration_seconds": (),
    }
    defined = {s.name: s.labels for s in metric_series.SERIES}
    assert len(defined) == len(metric_series.SERIES)
    # The contract's series exactly, plus the exporter's own error counter.
    assert defined == {**contract, "skewer_exporter_errors_total": ("stage",)}
    for series in metric_series.SERIES:
        assert series.labelnames[:2] == ("run", "scheme")
        assert series.name.endswith("_total") == (series.kind == "counter")
        assert series.stage in (*metric_series.STAGES, "any")


def test_run_labels_are_set_in_one_place() -> None:
    labels = metric_series.RunLabels("r7", "fish")
    assert labels.of() == {"run": "r7", "scheme": "fish"}
    assert labels.of(worker=2, source=0) == {
        "run": "r7",
        "scheme": "fish",
        "worker": "2",
        "source": "0",
    }
    assert labels.values(3) == ["r7", "fish", "3"]
    with pytest.raises(ValueError, match="need a run and a scheme"):
        metric_series.RunLabels("r7", "")


def test_scheme_and_port_resolution() -> None:
    assert exporter_module.scheme_label("pkg", {"GROUPING_SCHEME": "key"}) == "pkg"
    assert exporter_module.scheme_label(None, {"GROUPING_SCHEME": " fish "}) == "fish"
    assert exporter_module.scheme_label(None, {}) == "unknown"
    assert exporter_module.resolve_port(None, {}) == 0
    assert exporter_module.resolve_port(None, {"SKEWER_METRICS_PORT": "9464"}) == 9464
    assert exporter_module.resolve_port(-1, {"SKEWER_METRICS_PORT": "9464"}) == -1
    with pytest.raises(exporter_module.MetricsError, match=r"^--metrics-port must be -1 \(off\)"):
        exporter_module.resolve_port(65536, {})
    with pytest.raises(
        exporter_module.MetricsError, match=r"^SKEWER_METRICS_PORT must be .* got 'x'$"
    ):
        exporter_module.resolve_port(None, {"SKEWER_METRICS_PORT": "x"})


def test_a_bad_metrics_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli.app import main

    with pytest.raises(SystemExit) as exit_info:
        main(["produce", "--records", "10", "--metrics-port", "-2"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "skewer produce: error: argument --metrics-port: "
        "must be -1 (off), 0 (a free port) or 1..65535, got '-2'"
    )


def test_run_plan_passes_the_scheme_label_to_every_stage() -> None:
    plan = RunPlan(scheme="fish", records=10, workers=2, sources=1, run_id="x")
    for stage in ("produce", "group", "work", "aggregate"):
        argv = plan.argv(stage, config.load({}))
        assert argv[argv.index("--scheme") + 1] == "fish"


def test_run_plan_sends_its_spark_master_to_the_work_stage_only() -> None:
    plan = RunPlan(scheme="pkg", records=10, run_id="x", spark_master="spark://m:7077")
    argv = plan.argv("work", config.load({}))
    assert argv[argv.index("--spark-master") + 1] == "spark://m:7077"
    assert "--spark-master" not in plan.argv("group", config.load({}))
    assert plan.work_options(config.load({})).task_count == plan.workers


# --- pure conversions ------------------------------------------------------------------------


def test_latency_edges_are_redis_edges_rounded_up() -> None:
    edges = worker_metrics.LATENCY_EDGES
    assert len(edges) == 21  # 1 ms .. 100 s, 4 per decade
    assert [e for _, e in edges[:5]] == [0.001, 0.001779, 0.003163, 0.005624, 0.01]
    assert edges[-1] == (100, 100.0)
    for bucket, edge in edges:
        exact = bucket_upper_ms(bucket) / 1000
        # Never below the Redis edge, and below the next Redis edge (no bucket is moved).
        assert exact <= edge < bucket_upper_ms(bucket + 1) / 1000


def test_latency_buckets_count_exactly_what_lies_below_each_edge() -> None:
    rng = np.random.default_rng(7)
    latency_ms = np.concatenate([10 ** rng.uniform(-1, 5.5, 5000), [0.2, 1.0, 100_000.0]])
    buckets, counts = np.unique(latency_buckets(latency_ms), return_counts=True)
    histogram = dict(zip(buckets.tolist(), counts.tolist(), strict=True))
    exported = worker_metrics.latency_le_buckets(histogram)
    assert [le for le, _ in exported[:3]] == ["0.001", "0.001779", "0.003163"]
    assert exported[-1] == ("+Inf", len(latency_ms))
    for (bucket, _), (_, cumulative) in zip(worker_metrics.LATENCY_EDGES, exported, strict=False):
        # Independently: records at or below the Redis edge (latency_buckets clamps to >= 1 ms).
        expected = int((np.maximum(latency_ms, 1.0) <= bucket_upper_ms(bucket) * (1 + 1e-12)).sum())
        assert cumulative == expected


def test_latency_sum_is_the_geometric_bucket_centres() -> None:
    histogram = {0: 2, 1: 3, 40: 1}
    expected_ms = 2 * 0.5 + 3 * 10 ** (0.5 / 20) + 1 * 10 ** (39.5 / 20)
    assert worker_metrics.latency_sum_seconds(histogram) == pytest.approx(
        expected_ms / 1000, rel=1e-12
    )


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ([6, 2, 1], (3.0, 3.0 / 9, 2.0)),
        ([5, 5, 5, 5], (0.0, 0.0, 1.0)),
        ([0, 0, 0], (0.0, 0.0, 0.0)),
        ([8, 0, 0, 0], (6.0, 0.75, 4.0)),
    ],
)
def test_load_figures(loads: list[int], expected: tuple[float, float, float]) -> None:
    assert load_figures(loads) == expected
    # The one definition, operators.metrics' (the gauges read 0 before any load).
    if sum(loads):
        assert expected[0] == imbalance(loads) and expected[2] == max_avg_ratio(loads)


def test_records_per_producer_follow_the_stream_plan() -> None:
    plan = plan_stream(1000, sources=3, event_rate=1000, start_ms=0)
    for acked in (0, 1, 2, 3, 500, 999, 1000):
        by_hand = np.bincount(plan.producer[:acked], minlength=3).tolist()
        assert producer_metrics.records_per_producer(acked, 3) == by_hand


def test_lag_and_the_spark_offset_log(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    assert worker_metrics.committed_offsets(checkpoint, "t-work") == {}
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{"a":"b"}}'
    for batch, offsets in ((0, {"0": 5, "1": 7}), (1, {"0": 11, "1": 13, "2": 2})):
        (checkpoint / "offsets" / str(batch)).write_text(
            f"v1\n{metadata}\n{json.dumps({'t-work': offsets})}"
        )
    (checkpoint / "commits" / "0").write_text("v1\n{}")
    (checkpoint / "commits" / ".0.crc").write_text("")
    # Batch 1 is logged but not committed: the query has consumed batch 0's offsets.
    assert worker_metrics.committed_offsets(checkpoint, "t-work") == {0: 5, 1: 7}
    (checkpoint / "commits" / "1").write_text("v1\n{}")
    assert worker_metrics.committed_offsets(checkpoint, "t-work") == {0: 11, 1: 13, 2: 2}
    assert worker_metrics.committed_offsets(checkpoint, "other") == {}
    assert worker_metrics.lag_per_partition([20, 13, 2, 4], {0: 11, 1: 13, 2: 2}) == [9, 0, 0, 4]


def test_real_time_lag_counts_from_the_offset_each_worker_applied(tmp_path: Path) -> None:
    """In Real-Time Mode the checkpoint logs offsets only when a batch ends: the lag is what
    follows each worker's last applied offset (none applied: the whole partition)."""
    lag = worker_metrics.WorkTopicLag(
        "127.0.0.1:1", "t-work", 3, tmp_path, applied=lambda: [9, None, 3]
    )
    lag.end_offsets = lambda: [20, 6, 4]  # type: ignore[method-assign]
    assert lag() == [10, 6, 0]


# --- worker and aggregator families ----------------------------------------------------------


class _Families:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _exposition(families: list[Any]) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(_Families(families))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_worker_families_from_given_redis_counters() -> None:
    labels = metric_series.RunLabels("w1", "key")
    stats = worker_metrics.WorkerStats(
        records=[30, 10, 10, 10],
        late=[0, 1, 0, 0],
        rejected=[0, 0, 2, 0],
        batches=[3, 3, 3, 3],
        held=[0, 0, 0, 4],
        latency=[{0: 30}, {20: 10}, {}, {21: 5, 200: 5}],
        state_entries=[7, 3, 2, 1],
    )
    text = _exposition(worker_metrics.worker_families(labels, stats, lag=[0, 5, 0, 1]))
    samples = _samples(text, "w1")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # every sample carries run and scheme
            assert (sample.labels["run"], sample.labels["scheme"]) == ("w1", "key")
    w = (("worker", "0"),)
    assert samples[("skewer_worker_records_total", w)] == 30
    assert samples[("skewer_worker_late_records_total", (("worker", "1"),))] == 1
    assert samples[("skewer_worker_rejected_total", (("worker", "2"),))] == 2
    assert samples[("skewer_worker_held_records_total", (("worker", "3"),))] == 4
    assert samples[("skewer_worker_batches_total", w)] == 3
    assert samples[("skewer_worker_state_entries", w)] == 7
    assert samples[("skewer_worker_lag_records", (("worker", "1"),))] == 5
    assert samples[("skewer_imbalance_records", ())] == 15.0
    assert samples[("skewer_imbalance_fraction", ())] == 0.25
    assert samples[("skewer_load_max_over_avg", ())] == 2.0
    bucket = "skewer_worker_latency_seconds_bucket"
    assert samples[(bucket, (("le", "0.001"), ("worker", "0")))] == 30
    assert samples[(bucket, (("le", "0.005624"), ("worker", "1")))] == 0
    assert samples[(bucket, (("le", "0.01"), ("worker", "1")))] == 10
    assert samples[(bucket, (("le", "0.01"), ("worker", "3")))] == 0
    assert samples[(bucket, (("le", "0.01779"), ("worker", "3")))] == 5
    assert samples[(bucket, (("le", "100.0"), ("worker", "3")))] == 5
    assert samples[(bucket, (("le", "+Inf"), ("worker", "3")))] == 10
    assert samples[("skewer_worker_latency_seconds_count", (("worker", "2"),))] == 0
    # Without lag (Kafka unreadable) the other series are still there.
    names = {f.name for f in worker_metrics.worker_families(labels, stats, lag=None)}
    assert "skewer_worker_lag_records" not in names and "skewer_worker_records" in names


def test_aggregator_families() -> None:
    labels = metric_series.RunLabels("a1", "pkg")
    totals = {"windows": 5, "records": 200_000, "state_entries": 300, "distinct_keys": 200}
    samples = _samples(
        _exposition(aggregator_metrics.aggregator_families(labels, totals, 12_500)), "a1"
    )
    assert samples == {
        ("skewer_aggregator_windows_final_total", ()): 5,
        ("skewer_aggregator_records_final_total", ()): 200_000,
        ("skewer_replication", ()): 1.5,
        ("skewer_watermark_seconds", ()): 12.5,
    }
    empty = _samples(_exposition(aggregator_metrics.aggregator_families(labels, {}, None)), "a1")
    assert empty == {
        ("skewer_aggregator_windows_final_total", ()): 0,
        ("skewer_aggregator_records_final_total", ()): 0,
    }


# --- in-process stage metrics ----------------------------------------------------------------


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_producer_metrics_count_acknowledged_records_once() -> None:
    labels = metric_series.RunLabels("p-unit", "pkg")
    producer = producer_metrics.ProducerMetrics(labels, sources=2)
    producer.acked(5)
    producer.acked(3)  # a smaller lower bound changes nothing
    assert _value("skewer_producer_records_total", **labels.of(producer=0)) == 3
    assert _value("skewer_producer_records_total", **labels.of(producer=1)) == 2
    producer.acked(10)
    assert _value("skewer_producer_records_total", **labels.of(producer=0)) == 5
    assert _value("skewer_producer_records_total", **labels.of(producer=1)) == 5


@dataclass
class _Message:
    """The part of a confluent-kafka Message a grouping source reads."""

    key_bytes: bytes | None
    value_bytes: bytes
    at: int

    def key(self) -> bytes | None:
        return self.key_bytes

    def value(self) -> bytes:
        return self.value_bytes

    def topic(self) -> str:
        return "keys"

    def partition(self) -> int:
        return 1

    def offset(self) -> int:
        return self.at


def test_grouping_metrics_count_what_a_source_commits() -> None:
    """A source's committed batch reaches the series: records, per-worker routing (the
    scheme's), dead letters per reason (zero before any), batch time and table gauges."""
    labels = metric_series.RunLabels("g-unit", "key")
    config = grouping.StageConfig(
        bootstrap="",
        redis_url="",
        names=RunNames("g-unit"),
        scheme="key",
        n_workers=3,
        n_sources=2,
    )
    source_metrics = grouping_metrics.GroupingMetrics(labels, 1, 3, reasons=grouping.REASONS)
    source = grouping.GroupingSource(config, 1, None, source_metrics)  # type: ignore[arg-type]
    of = labels.of
    assert _value("skewer_grouping_dead_letters_total", **of(source=1, reason="no-key")) == 0
    value = encode_input(np.array([1]), np.array([0]), np.array([0]))[0]
    keys = [b"a", b"b", b"a", None, b"c"]
    messages = [_Message(key, value, at) for at, key in enumerate(keys)]
    output = source.route_batch(messages, grouping.SourceWatermark())
    source._committed(output, len(messages), 0.02)
    expected = np.bincount(
        registry.create("key", 3).route(KeyBatch.from_bytes([b"a", b"b", b"a", b"c"])),
        minlength=3,
    )
    routed = [_value("skewer_grouping_routed_total", **of(source=1, worker=w)) for w in range(3)]
    assert routed == expected.tolist() and source.summary.routed == expected.tolist()
    assert _value("skewer_grouping_records_total", **of(source=1)) == 5
    assert _value("skewer_grouping_dead_letters_total", **of(source=1, reason="no-key")) == 1
    assert _value("skewer_grouping_batch_seconds_count", **of(source=1)) == 1
    assert _value("skewer_routing_table_version", **of(source=1)) == 0
    assert source.summary.batches == 1 and source.summary.dead_letters["no-key"] == 1


def test_grouping_metrics_count_what_a_querys_where_leaves_out() -> None:
    """A user topic's records the WHERE leaves out are neither routed nor dead letters: they
    are counted apart, in the summary and the series."""
    from pipeline.stages.user_topic import UserTopic, topic_extractor

    query = (
        "SELECT u, count(*) FROM t WHERE n >= 2 GROUP BY u, window(timestamp_millis(ts), "
        "'10 seconds')"
    )
    topic = UserTopic("t", topic_extractor("json:u", "json:ts:ms", None, query), query=query)
    labels = metric_series.RunLabels("g-where", "key")
    config = grouping.StageConfig(
        bootstrap="",
        redis_url="",
        names=RunNames("g-where"),
        scheme="key",
        n_workers=2,
        n_sources=1,
        input=topic,
    )
    source_metrics = grouping_metrics.GroupingMetrics(labels, 0, 2, reasons=grouping.REASONS)
    source = grouping.GroupingSource(config, 0, None, source_metrics)  # type: ignore[arg-type]
    values = [
        b'{"u": "a", "ts": 1, "n": 1}',
        b'{"u": "b", "ts": 2, "n": 2}',
        b'{"u": "c", "ts": 3}',
        b'{"ts": 4, "n": 5}',
        b'{"u": "d", "ts": 5, "n": 3}',
    ]
    messages = [_Message(None, value, at) for at, value in enumerate(values)]
    output = source.route_batch(messages, source.input.fresh_watermark())
    source._committed(output, len(messages), 0.01)
    assert output.data_rows.tolist() == [1, 4] and output.filtered_rows.tolist() == [0, 2]
    of = labels.of
    assert _value("skewer_grouping_filtered_records_total", **of(source=0)) == 2
    assert _value("skewer_grouping_dead_letters_total", **of(source=0, reason="no-key")) == 1
    assert source.summary.filtered == 2 and sum(source.summary.routed) == 2


def test_controller_metrics() -> None:
    labels = metric_series.RunLabels("c-unit", "mintable")
    controller = controller_metrics.ControllerMetrics(labels)
    controller.interval("balanced", imbalance=0.05, tolerance=0.1)
    controller.interval("rebalanced", imbalance=0.4)
    controller.table(2, 35)
    with controller.time_planning():
        pass
    controller.migration_started()
    assert _value("skewer_migration_in_progress", **labels.of()) == 1
    controller.moved(keys=3, state_entries=40, state_bytes=4000)
    controller.moved(held_records=12)
    controller.migration_completed(0.75)
    with pytest.raises(ValueError, match="outcome 'done' is not one of balanced"):
        controller.interval("done")
    assert _value("skewer_controller_intervals_total", **labels.of(outcome="balanced")) == 1
    assert _value("skewer_controller_intervals_total", **labels.of(outcome="infeasible")) == 0
    assert _value("skewer_controller_imbalance", **labels.of()) == 0.4
    assert _value("skewer_controller_tolerance", **labels.of()) == 0.1
    assert _value("skewer_controller_table_version", **labels.of()) == 2
    assert _value("skewer_controller_table_entries", **labels.of()) == 35
    assert _value("skewer_planning_seconds_count", **labels.of()) == 1
    assert _value("skewer_migrations_total", **labels.of()) == 1
    assert _value("skewer_migration_in_progress", **labels.of()) == 0
    assert _value("skewer_migration_keys_moved_total", **labels.of()) == 3
    assert _value("skewer_migration_state_entries_moved_total", **labels.of()) == 40
    assert _value("skewer_migration_state_bytes_moved_total", **labels.of()) == 4000
    assert _value("skewer_migration_held_records_total", **labels.of()) == 12
    assert _value("skewer_migration_duration_seconds_sum", **labels.of()) == 0.75


@pytest.mark.parametrize("scheme", ["pkg", "potc", "greedy-online", "mixed"])
def test_table_gauges_of_every_kind_of_scheme(scheme: str) -> None:
    # potc and greedy-online keep a key -> worker memory without versions: the gauges must
    # read it rather than fail the grouping source after its first batch.
    labels = metric_series.RunLabels(f"unit-table-{scheme}", scheme)
    grouping = grouping_metrics.GroupingMetrics(labels, 0, 4)
    routing = registry.create(scheme, 4, source=0, n_sources=1)
    routing.route(KeyBatch.from_strings(["a", "b", "a", "c"]))
    grouping.table_of(routing)
    table = getattr(routing, "table", None)
    entries = 0 if table is None else len(table)
    assert _value("skewer_routing_table_entries", **labels.of(source="0")) == entries
    assert _value("skewer_routing_table_version", **labels.of(source="0")) == getattr(
        table, "version", 0
    )
    if scheme in ("potc", "greedy-online"):
        assert entries == 3


# --- target files and the exporter -----------------------------------------------------------


def test_target_document_and_path(tmp_path: Path) -> None:
    assert exporter_module.target_document("127.0.0.1", 4321, "work", "r-1") == [
        {
            "targets": ["127.0.0.1:4321"],
            "labels": {"stage": "work", "instance": "127.0.0.1/work/r-1"},
        }
    ]
    assert exporter_module.target_document("0.0.0.0", 9464, "group", "r-1")[0]["targets"] == [
        "127.0.0.1:9464"
    ]
    assert exporter_module.target_document("::1", 1, "group", "r-1")[0]["targets"] == ["[::1]:1"]
    # A stage started again serves on another port: its series stay the same ones.
    again = exporter_module.target_document("127.0.0.1", 5555, "work", "r-1")
    assert (
        again[0]["labels"]
        == exporter_module.target_document("127.0.0.1", 4321, "work", "r-1")[0]["labels"]
    )
    assert (
        exporter_module.target_path(tmp_path, "group", "r-1", 42) == tmp_path / "group-r-1-42.json"
    )


def test_stale_targets_of_dead_processes_are_removed(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import os; print(os.getpid())"]
    finished = subprocess.run(command, check=True, capture_output=True, text=True)
    dead_pid = int(finished.stdout)
    dead = tmp_path / f"work-r-{dead_pid}.json"
    alive = tmp_path / f"work-r-{os.getpid()}.json"
    other = tmp_path / "notes.json"
    for path in (dead, alive, other):
        path.write_text("[]")
    assert exporter_module.remove_stale_targets(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_exporter_serves_writes_its_target_and_cleans_up(settings: config.Settings) -> None:
    labels = metric_series.RunLabels("e-unit", "pkg")
    exporter = exporter_module.start_exporter("produce", "e-unit", "pkg", 0, settings=settings)
    try:
        producer_metrics.ProducerMetrics(labels, 1).acked(4)
        target = settings.prometheus_targets_dir / f"produce-e-unit-{os.getpid()}.json"
        assert exporter.target_path == target
        assert json.loads(target.read_text()) == [
            {
                "targets": [f"127.0.0.1:{exporter.port}"],
                "labels": {"stage": "produce", "instance": "127.0.0.1/produce/e-unit"},
            }
        ]
        samples = _samples(_get(f"{exporter.url}/metrics"), "e-unit")
        assert samples[("skewer_producer_records_total", (("producer", "0"),))] == 4
    finally:
        began = time.monotonic()
        exporter.close()
    # Nobody scraped and no Prometheus answers: no waiting for a last scrape (which would last
    # the linger, 10 s; half of it leaves room for a loaded machine).
    assert time.monotonic() - began < exporter_module.DEFAULT_LINGER_SECONDS / 2
    assert not target.exists()
    with pytest.raises(OSError):
        _get(f"http://127.0.0.1:{exporter.port}/metrics")


def test_exporter_waits_for_one_prometheus_scrape_at_the_end(settings: config.Settings) -> None:
    exporter = exporter_module.start_exporter("aggregate", "e-linger", "pkg", 0, settings=settings)
    closing = threading.Thread(target=exporter.close, kwargs={"linger": 10.0})
    _get(f"{exporter.url}/metrics", user_agent="Prometheus/2.42.0")  # it is being scraped
    closing.start()
    time.sleep(0.5)
    _get(f"{exporter.url}/metrics", user_agent="curl/8.0")  # not Prometheus: keeps waiting
    time.sleep(0.5)
    assert closing.is_alive()
    _get(f"{exporter.url}/metrics", user_agent="Prometheus/2.42.0")
    closing.join(2.0)
    assert not closing.is_alive()


def test_sigterm_removes_the_target_of_a_stage_without_a_handler(tmp_path: Path) -> None:
    """``skewer produce`` has no SIGTERM handler: the exporter closes, then the process dies
    of SIGTERM as it would have."""
    script = (
        "import sys, time\n"
        "from pipeline.observe.exporter import start_exporter\n"
        "exporter = start_exporter('produce', 'e-term', 'pkg', 0)\n"
        "print(exporter.target_path, flush=True)\n"
        "time.sleep(60)\n"
    )
    environ = {
        **os.environ,
        "SKEWER_RUN_DIR": str(tmp_path),
        "SKEWER_PROMETHEUS_URL": "http://127.0.0.1:9",
    }
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=environ
    )
    try:
        target = Path(child.stdout.readline().strip())  # type: ignore[union-attr]
        assert target.exists() and target.parent == tmp_path / "prometheus" / "targets"
        child.terminate()
        assert child.wait(10) == -signal.SIGTERM
        assert not target.exists()
    finally:
        child.kill()
        child.wait()


def test_disabled_and_busy_ports(settings: config.Settings) -> None:
    off = exporter_module.start_exporter("work", "e-off", "key", -1, settings=settings)
    assert (off.enabled, off.port, off.url, off.target_path) == (False, None, None, None)
    off.close()
    assert not settings.prometheus_targets_dir.exists()
    first = exporter_module.start_exporter("work", "e-busy", "key", 0, settings=settings)
    try:
        with pytest.raises(
            exporter_module.MetricsError, match=f"cannot serve metrics on 127.0.0.1:{first.port}"
        ):
            exporter_module.start_exporter("work", "e-busy", "key", first.port, settings=settings)
    finally:
        first.close(linger=0)


def _child_routes(run: str, count: int) -> None:
    """A grouping source's process: records into the parent's multiprocess folder."""
    from pipeline.observe.grouping import GroupingMetrics
    from pipeline.observe.series import RunLabels

    grouping = GroupingMetrics(RunLabels(run, "pkg"), count, 2)
    grouping.batch(count, [count, 0], {}, 0.01)
    grouping.table(3, count)


def test_multiprocess_exporter_merges_its_children(settings: config.Settings) -> None:
    exporter = exporter_module.start_exporter(
        "group", "e-multi", "pkg", 0, multiprocess=True, settings=settings
    )
    directory = exporter.multiprocess_dir
    try:
        assert directory is not None and os.environ[exporter_module.MULTIPROC_VARIABLE] == str(
            directory
        )
        context = multiprocessing.get_context("spawn")
        for count in (1, 2):  # two sources, one process each, both gone before the scrape
            child = context.Process(target=_child_routes, args=("e-multi", count))
            child.start()
            child.join(60)
            assert child.exitcode == 0
        samples = _samples(_get(f"{exporter.url}/metrics"), "e-multi")
    finally:
        exporter.close(linger=0)
    assert samples[("skewer_grouping_records_total", (("source", "1"),))] == 1
    assert samples[("skewer_grouping_routed_total", (("source", "2"), ("worker", "0")))] == 2
    assert samples[("skewer_routing_table_entries", (("source", "2"),))] == 2
    assert samples[("skewer_routing_table_version", (("source", "1"),))] == 3
    assert exporter_module.MULTIPROC_VARIABLE not in os.environ
    assert not directory.exists()


# --- Prometheus configuration ----------------------------------------------------------------


def test_native_config_has_the_skewer_job_and_the_rules(settings: config.Settings) -> None:
    [prometheus] = manager.native_services(settings, ["prometheus"])
    parsed = yaml.safe_load(prometheus.prometheus_config())
    assert parsed["global"]["evaluation_interval"] == "5s"
    assert parsed["rule_files"] == ["rules.yml"]
    jobs = {job["job_name"]: job for job in parsed["scrape_configs"]}
    assert jobs["skewer"]["scrape_interval"] == "1s"
    assert jobs["skewer"]["file_sd_configs"] == [
        {"files": [f"{settings.prometheus_targets_dir}/*.json"], "refresh_interval": "1s"}
    ]
    prometheus.prepare()
    assert prometheus.targets_dir.is_dir()
    assert prometheus.rules_path.read_text() == (PROMETHEUS_DIR / "rules.yml").read_text()
    assert prometheus.write_config() is False  # unchanged: nothing to write or reload
    prometheus.config_path.write_text("# an older checkout's config\n")
    assert prometheus.write_config() is True
    assert prometheus.config_path.read_text() == prometheus.prometheus_config()


@needs_promtool
def test_promtool_accepts_the_rules_and_the_generated_config(settings: config.Settings) -> None:
    [prometheus] = manager.native_services(settings, ["prometheus"])
    prometheus.prepare()
    for command in (
        ["promtool", "check", "rules", str(PROMETHEUS_DIR / "rules.yml")],
        ["promtool", "check", "config", str(prometheus.config_path)],
    ):
        checked = subprocess.run(command, capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "SUCCESS" in checked.stdout


@needs_promtool
def test_recording_rules_compute_the_papers_figures(tmp_path: Path) -> None:
    """promtool's rule unit tests: four workers at 6, 2, 0, 0 records/s, so the load rates are
    exactly 6, 2, 0, 0: throughput 8, I = 6 - 2 = 4, I / sum = 0.5, lambda = 6 / 2 = 3."""
    run = 'run="r",scheme="pkg",job="skewer",instance="w:1"'
    series = [
        {"series": f'skewer_worker_records_total{{{run},worker="{w}"}}', "values": f"0+{rate}x180"}
        for w, rate in enumerate((6, 2, 0, 0))
    ]
    bucket = "skewer_worker_latency_seconds_bucket"
    series += [
        {"series": f'{bucket}{{{run},worker="0",le="{le}"}}', "values": f"0+{rate}x180"}
        for le, rate in (("0.001", 0), ("0.01", 100), ("+Inf", 100))
    ]

    def sample(name: str, value: float, **extra: str) -> dict[str, Any]:
        labels = ",".join(f'{k}="{v}"' for k, v in {"run": "r", "scheme": "pkg", **extra}.items())
        return {"labels": f"{name}{{{labels}}}", "value": value}

    def expect(name: str, value: float) -> dict[str, Any]:
        return {"expr": name, "eval_time": "2m", "exp_samples": [sample(name, value)]}

    loads = {
        "expr": "skewer:worker_load:rate1m",
        "eval_time": "2m",
        "exp_samples": [
            sample("skewer:worker_load:rate1m", rate, worker=str(w))
            for w, rate in enumerate((6, 2, 0, 0))
        ],
    }

    tests = {
        "rule_files": [str(PROMETHEUS_DIR / "rules.yml")],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": series,
                "promql_expr_test": [
                    loads,
                    expect("skewer:throughput:rate1m", 8),
                    expect("skewer:imbalance_records:rate1m", 4),
                    expect("skewer:imbalance_fraction:rate1m", 0.5),
                    expect("skewer:load_max_over_avg:rate1m", 3),
                    # p50: rank 50 of 100/s, all in (0.001, 0.01]: linear within the bucket,
                    # in Prometheus' own floating-point order of operations.
                    expect("skewer:latency_seconds:p50_1m", 0.001 + (0.01 - 0.001) * (50 / 100)),
                    expect("skewer:latency_seconds:p99_1m", 0.001 + (0.01 - 0.001) * (99 / 100)),
                ],
            }
        ],
    }
    path = tmp_path / "rules_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    checked = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

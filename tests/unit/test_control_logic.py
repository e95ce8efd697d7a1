"""Pure parts of the routing-table control plane: balance measures and tolerances, compact
statistics reports, moves per old worker, offset metadata, TABLE_SWITCH markers at a worker."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators import registry
from operators.base import KeyStatistics, RoutingTable
from operators.keys import KeyBatch
from pipeline.io import records
from pipeline.io.control_store import StatisticsReport, join_names, split_names
from pipeline.stages.control_plane import compact_report
from pipeline.stages.controller import moves_by_old_worker, table_schemes
from pipeline.stages.grouping import SourceWatermark, offset_metadata, parse_offset_metadata
from pipeline.stages.worker_task import decode_partition, to_worker_batch


def test_table_schemes_are_the_seven_of_seeds_000_and_004() -> None:
    assert table_schemes() == ["scan", "redist", "readj", "llfd", "mintable", "minmig", "mixed"]


@pytest.mark.parametrize("name", ["llfd", "mintable", "minmig", "mixed"])
def test_fang_measures_one_sided_theta_against_theta_max(name: str) -> None:
    scheme = registry.create(name, 4, theta_max=0.1)
    assert scheme.tolerance == 0.1
    # avg 10, max 13: theta = 0.3
    assert scheme.measured_imbalance(np.array([13, 9, 9, 9])) == pytest.approx(0.3)
    assert scheme.within_tolerance(np.array([11, 10, 10, 9]))  # theta = 0.1
    assert not scheme.within_tolerance(np.array([12, 10, 9, 9]))
    assert scheme.measured_imbalance(np.zeros(4)) == 0.0


@pytest.mark.parametrize("name", ["scan", "redist", "readj"])
def test_gedik_measures_max_over_min_against_alpha(name: str) -> None:
    scheme = registry.create(name, 3, alpha=1.5)
    assert scheme.tolerance == 1.5
    assert scheme.measured_imbalance(np.array([30, 20, 25])) == pytest.approx(1.5)
    assert scheme.within_tolerance(np.array([30, 20, 25]))
    assert not scheme.within_tolerance(np.array([31, 20, 25]))
    assert scheme.measured_imbalance(np.array([5, 0, 1])) == math.inf
    assert scheme.measured_imbalance(np.zeros(3)) == 1.0


@pytest.mark.parametrize("name", ["readj", "mixed"])
def test_workers_of_ids_is_the_routing_of_keys(name: str) -> None:
    scheme = registry.create(name, 5)
    keys = KeyBatch.from_ints(np.arange(200))
    ids = keys.key_ids()
    scheme.install(RoutingTable(ids[:3], [4, 4, 4], version=1))
    assert scheme.workers_of_ids(ids).tolist() == scheme.route(keys).tolist()
    assert scheme.base_workers_of_ids(ids).tolist() == scheme.base_workers(keys).tolist()


def stats_of(keys: list[bytes], loads: list[int]) -> KeyStatistics:
    batch = KeyBatch.from_bytes(keys)
    ids, counts = np.unique(batch.key_ids(), return_counts=True)
    frequency = counts.astype(np.float64)
    return KeyStatistics(ids, frequency, frequency, frequency * 2, np.array(loads), len(keys))


def test_compact_report_keeps_the_heaviest_keys_with_their_bytes() -> None:
    keys = [b"a"] * 5 + [b"b"] * 3 + [b"c"] * 2 + [b"d"]
    stats = stats_of(keys, [6, 5])
    recent = [KeyBatch.from_bytes(keys[:6]), KeyBatch.from_bytes(keys[6:])]
    report = compact_report(stats, recent, {}, source=1, round_=4, table_version=2, max_keys=3)
    by_name = dict(zip(report.names, report.frequency.tolist(), strict=True))
    assert by_name == {b"a": 5.0, b"b": 3.0, b"c": 2.0}
    assert report.unnamed == 1  # d's one record: beyond the 3 heaviest
    assert report.worker_loads.tolist() == [6, 5] and report.records == 11
    assert report.state_size.tolist() == (report.frequency * 2).tolist()
    assert (report.source, report.round, report.table_version) == (1, 4, 2)
    # the ids stay those of the names
    assert KeyBatch.from_bytes(report.names).key_ids().tolist() == report.key_ids.tolist()


def test_compact_report_leaves_out_keys_it_cannot_name_and_uses_known_names() -> None:
    keys = [b"a"] * 5 + [b"b"] * 3
    stats = stats_of(keys, [8])
    b_id = int(KeyBatch.from_bytes([b"b"]).key_ids()[0])
    # "a" is in no recent batch and not known: left out, its 5 records are "unnamed"
    report = compact_report(
        stats, [KeyBatch.from_bytes([b"x"])], {b_id: b"b"}, source=0, round_=1, table_version=0
    )
    assert report.names == [b"b"] and report.unnamed == 5


def test_report_fields_round_trip_including_empty_and_binary_names() -> None:
    report = StatisticsReport(
        source=0,
        round=1,
        table_version=0,
        key_ids=np.array([1, 2], dtype=np.int64),
        frequency=np.array([1.0, 2.0]),
        cost=np.array([1.0, 2.0]),
        state_size=np.array([3.0, 4.0]),
        worker_loads=np.array([1, 2, 0]),
        records=3,
        names=[b"\x00\xff", b"x" * 300],
        unnamed=0,
    )
    back = StatisticsReport.from_fields(report.to_fields())
    assert back.names == report.names
    assert back.state_size.tolist() == [3.0, 4.0] and back.worker_loads.tolist() == [1, 2, 0]
    assert split_names(*join_names([])) == []


def test_moves_are_grouped_by_old_worker_and_skip_unmoved_keys() -> None:
    names = {10: b"p", 11: b"q", 12: b"r", 13: b"s"}
    moves = moves_by_old_worker(
        np.array([10, 11, 12, 13]), np.array([0, 1, 0, 2]), np.array([1, 1, 2, 0]), names
    )
    assert moves == {0: {b"p": 1, b"r": 2}, 2: {b"s": 0}}


def test_offset_metadata_carries_watermarks_and_the_table_version() -> None:
    watermark = SourceWatermark({0: 5_000, 1: 7_000}, forwarded=5_000)
    text = offset_metadata(watermark, 3)
    back, version = parse_offset_metadata(text)
    assert version == 3 and back.producers == {0: 5_000, 1: 7_000} and back.forwarded == 5_000
    # version 0 leaves the issue-4 metadata unchanged, which old checkpoints also parse as 0
    assert offset_metadata(watermark, 0) == watermark.to_metadata()
    assert parse_offset_metadata(watermark.to_metadata())[1] == 0
    assert parse_offset_metadata(None) == (SourceWatermark(), 0)


def test_a_worker_batch_carries_each_sources_newest_table_switch() -> None:
    inputs, _ = records.decode_input(
        records.encode_input(np.array([5, 6]), np.array([0, 0]), np.array([0, 1]))
    )
    values = records.encode_work(inputs, source=0, table_version=1)
    values.insert(0, records.encode_marker(records.Kind.TABLE_SWITCH, 0, table_version=1))
    values.append(records.encode_marker(records.Kind.TABLE_SWITCH, 1, table_version=2))
    values.append(records.encode_marker(records.Kind.TABLE_SWITCH, 1, table_version=1))
    keys = [None, b"k", b"k", None, None]
    decoded = decode_partition(keys, values)
    assert decoded.switches.tolist() == [True, False, False, True, True]
    assert decoded.rejected == 0 and decoded.data_records == 2
    batch = to_worker_batch(
        decoded,
        np.zeros(5, dtype=np.int64),
        worker=0,
        batch_id=1,
        now_ms=0,
        window_ms=10,
        n_sources=2,
    )
    assert dict(batch.source_versions) == {0: 1, 1: 2}
    assert batch.counts.tolist() == [2] and batch.records == 2


def test_skewer_control_says_what_is_wrong_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.cli.app import main

    assert main(["control", "--scheme", "pkg", "--workers", "4"]) == 0
    assert "pkg routes without a routing table: nothing to control" in capsys.readouterr().out
    assert main(["control", "--scheme", "mixed", "--workers", "0"]) == 2
    assert capsys.readouterr().err == "skewer control: error: --workers must be >= 1, got 0\n"
    monkeypatch.delenv("GROUPING_SCHEME", raising=False)
    assert main(["control", "--workers", "4"]) == 2
    assert "no scheme" in capsys.readouterr().err
    # An unreachable Redis: exit 1, and the password in the URL is not printed.
    monkeypatch.setenv("SKEWER_REDIS_URL", "redis://:s3cret@127.0.0.1:1/0")
    assert main(["control", "--scheme", "mixed", "--workers", "4"]) == 1
    err = capsys.readouterr().err
    assert "redis://:***@127.0.0.1:1/0" in err and "s3cret" not in err

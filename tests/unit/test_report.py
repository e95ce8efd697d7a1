"""The run report's figures from hand-made samples, and the figure it draws (runs/report.py).

Expected values are worked out by hand in the comments: per interval, d = L(k) - L(k-1),
I = max d - avg d, fraction = I / sum d, lambda = max d / avg d. Every expected quotient is
the correctly rounded value of the same rational the code divides, so equality is exact.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from pipeline.runs.report import (
    FIGURE_DPI,
    FIGURE_INCHES,
    Rebalance,
    ReportData,
    ReportError,
    Sample,
    build_figure,
    default_path,
    interval_series,
    save_figure,
)

NAN = math.nan

# Four workers; the grouping stage (routed) runs one sample ahead of the workers (records).
SAMPLES = [
    Sample(1_000, (0, 0, 0, 0), (0, 0, 0, 0)),
    Sample(2_000, (0, 0, 0, 0), (40, 20, 20, 0)),  # nothing processed yet
    Sample(3_000, (40, 20, 20, 0), (80, 40, 40, 40)),
    Sample(3_500, (80, 40, 40, 40), (80, 40, 40, 40)),
    Sample(4_500, (80, 40, 40, 40), (80, 40, 40, 40)),  # a duplicate (aggregator restarted)
    Sample(5_500, (100, 70, 60, 50), (100, 70, 60, 50)),
]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_interval_series_of_processed_records_is_exact() -> None:
    series = interval_series(SAMPLES)
    # Interval ends, seconds after the first sample.
    assert series.seconds.tolist() == [1.0, 2.0, 2.5, 3.5, 4.5]
    assert series.records.tolist() == [0, 80, 120, 0, 80]
    # d = (0,0,0,0): no figure. d = (40,20,20,0): avg 20, I 20, 20/80, lambda 40/20.
    # d = (40,20,20,40): avg 30, I 10, 10/120, lambda 40/30. The duplicate: no figure.
    # d = (20,30,20,10): avg 20, I 10, 10/80, lambda 30/20.
    np.testing.assert_array_equal(series.imbalance_fraction, [NAN, 0.25, 10 / 120, NAN, 0.125])
    np.testing.assert_array_equal(series.max_avg, [NAN, 2.0, 40 / 30, NAN, 1.5])
    # Cumulative: (0,0,0,0) none; (40,20,20,0) 40/20; (80,40,40,40) 80/50 twice; then
    # (100,70,60,50) 100/70.
    np.testing.assert_array_equal(series.cumulative_max_avg, [NAN, 2.0, 80 / 50, 80 / 50, 100 / 70])


def test_interval_series_of_routed_records_is_exact() -> None:
    series = interval_series(SAMPLES, "routed")
    assert series.records.tolist() == [80, 120, 0, 0, 80]
    np.testing.assert_array_equal(series.imbalance_fraction, [0.25, 10 / 120, NAN, NAN, 0.125])
    np.testing.assert_array_equal(series.max_avg, [2.0, 40 / 30, NAN, NAN, 1.5])


def test_the_fraction_is_lambda_rescaled_so_one_curve_has_both_scales() -> None:
    series = interval_series(SAMPLES)
    workers = len(SAMPLES[0].records)
    np.testing.assert_allclose(
        series.imbalance_fraction, (series.max_avg - 1) / workers, rtol=1e-12
    )


def test_a_duplicate_sample_changes_no_figure_of_a_non_empty_interval() -> None:
    without = interval_series([s for i, s in enumerate(SAMPLES) if i != 4])
    with_duplicate = interval_series(SAMPLES)
    kept = ~np.isnan(with_duplicate.max_avg)
    np.testing.assert_array_equal(
        with_duplicate.max_avg[kept], without.max_avg[~np.isnan(without.max_avg)]
    )
    assert with_duplicate.records.sum() == without.records.sum() == 280


def test_fewer_than_two_samples_have_no_intervals_and_bad_counters_are_refused() -> None:
    assert interval_series(SAMPLES[:1]).seconds.size == 0
    assert interval_series([]).max_avg.size == 0
    with pytest.raises(ValueError, match="counter"):
        interval_series(SAMPLES, "rejected")


def test_samples_round_trip_through_json_and_malformed_ones_are_refused() -> None:
    sample = SAMPLES[2]
    assert json.loads(sample.to_json()) == {
        "t_ms": 3000,
        "records": [40, 20, 20, 0],
        "routed": [80, 40, 40, 40],
    }
    assert Sample.from_json(sample.to_json().encode()) == sample
    for bad, error in (
        (b"not json", ValueError),
        (b'{"t_ms": 1, "records": [1]}', KeyError),
        (b'{"t_ms": 1, "records": [1, 2], "routed": [1]}', ValueError),
        (b'{"t_ms": 1, "records": [], "routed": []}', ValueError),
        (b'{"t_ms": 1, "records": 5, "routed": 5}', TypeError),
    ):
        with pytest.raises(error):
            Sample.from_json(bad)


def test_rebalances_parse_with_and_without_completion() -> None:
    assert Rebalance.from_json(b'{"version": 3, "published_ms": 10, "completed_ms": 25}') == (
        Rebalance(3, 10, 25)
    )
    assert Rebalance.from_json('{"version": 4, "published_ms": 30, "extra": 1}') == Rebalance(
        4, 30, None
    )
    with pytest.raises(KeyError):
        Rebalance.from_json(b'{"version": 4}')


def report_data(**overrides: object) -> ReportData:
    fields: dict[str, object] = {
        "run_id": "demo-unit",
        "scheme": "key",
        "per_worker": [100, 70, 60, 50],
        "samples": SAMPLES,
        "rebalances": [Rebalance(2, 2_500, 3_000), Rebalance(3, 4_000, None)],
    }
    fields.update(overrides)
    return ReportData(**fields)  # type: ignore[arg-type]


def test_report_data_figures_and_title() -> None:
    data = report_data()
    assert (data.workers, data.records) == (4, 280)
    assert data.final_max_avg == 100 / 70
    assert data.title() == (
        "run demo-unit · scheme key · W=4 workers · 280 records · final max/avg load λ = 1.429"
    )


def test_the_figure_has_the_imbalance_progress_and_load_panels_with_their_data() -> None:
    figure = build_figure(report_data())
    assert figure.get_suptitle() == report_data().title()
    time_axes, progress_axes, load_axes = figure.axes
    assert time_axes.get_title() == (
        "imbalance over time: the load the grouping stage gave the workers"
    )
    assert progress_axes.get_title() == "records processed per worker over time"
    assert load_axes.get_title() == "records processed per worker (cumulative)"
    # The right-hand scale of the top panel: I(t) / records.
    (fraction_axis,) = time_axes.child_axes
    assert fraction_axis.get_ylabel() == "imbalance I(t) / records"
    # Top: the routed records' figures (test_interval_series_of_routed_records_is_exact).
    lines = {line.get_label(): line for line in time_axes.get_lines()}
    per_interval = lines["per interval (about 1 s)"]
    cumulative = lines["cumulative"]
    np.testing.assert_array_equal(per_interval.get_xdata(), [1.0, 2.0, 2.5, 3.5, 4.5])
    np.testing.assert_array_equal(per_interval.get_ydata(), [2.0, 40 / 30, NAN, NAN, 1.5])
    # Routed cumulative: (40,20,20,0) 40/20, then (80,40,40,40) 80/50 three times, 100/70.
    np.testing.assert_array_equal(cumulative.get_ydata(), [2.0, 1.6, 1.6, 1.6, 100 / 70])
    # One marker line per rebalance at its publication (seconds after the first sample), and
    # a shaded span for the one that completed.
    markers = [line for line in time_axes.get_lines() if line.get_color() == "#2ca02c"]
    assert [line.get_xdata()[0] for line in markers] == [1.5, 3.0]
    assert len(time_axes.patches) == 1
    assert [text.get_text() for text in time_axes.texts] == ["v2", "v3"]
    # Bottom left: each worker's cumulative records at the samples, the most loaded labelled.
    worker_lines = progress_axes.get_lines()
    assert [list(line.get_ydata()) for line in worker_lines[:4]] == [
        [0, 0, 40, 80, 80, 100],
        [0, 0, 20, 40, 40, 70],
        [0, 0, 20, 40, 40, 60],
        [0, 0, 0, 40, 40, 50],
    ]
    assert worker_lines[0].get_label() == "worker 0 (most loaded)"
    assert list(worker_lines[4].get_ydata()) == [0, 0, 20, 50, 50, 70]  # the average
    # Bottom right: the cumulative records per worker; the dashed line: their average.
    assert [bar.get_height() for bar in load_axes.patches] == [100, 70, 60, 50]
    (average,) = load_axes.get_lines()
    assert average.get_ydata()[0] == 70.0
    assert load_axes.get_legend().get_texts()[0].get_text() == "average 70"


def test_a_run_without_samples_still_shows_its_loads() -> None:
    figure = build_figure(report_data(samples=[], rebalances=[]))
    time_axes, progress_axes, load_axes = figure.axes
    assert [text.get_text() for text in time_axes.texts] == ["no timeline samples"]
    assert [text.get_text() for text in progress_axes.texts] == ["no timeline samples"]
    assert [bar.get_height() for bar in load_axes.patches] == [100, 70, 60, 50]


def test_the_png_has_the_figure_size(tmp_path: Path) -> None:
    path = save_figure(build_figure(report_data()), tmp_path / "reports" / "r.png")
    assert path == tmp_path / "reports" / "r.png"
    assert png_size(path) == (FIGURE_INCHES[0] * FIGURE_DPI, FIGURE_INCHES[1] * FIGURE_DPI)
    assert png_size(path) == (1200, 800)


def test_an_unwritable_path_is_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ReportError) as error:
        save_figure(build_figure(report_data()), blocker / "r.png")
    # The folder to create is a file.
    assert str(error.value) == f"cannot write {blocker / 'r.png'}: File exists"


def test_default_path_is_under_the_run_dir() -> None:
    assert default_path("demo-1", Path("/x/run")) == Path("/x/run/reports/demo-1.png")

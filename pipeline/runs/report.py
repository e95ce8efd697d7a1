"""The run report: one PNG of a live run's imbalance over time and per-worker load.

Layer: runs.

It reads only the run's own counters in Redis: the timeline samples the aggregator writes
(:mod:`pipeline.observe.timeline`), ``stats:records``, and the controller's rebalances. From
successive samples the interval's per-worker loads give the papers' figures per interval
(:func:`operators.metrics.imbalance`, :func:`~operators.metrics.max_avg_ratio`): the top panel
plots lambda of the *routed* counters (the load the scheme gave each worker) with I(t) on its
right axis; the bottom panels show the processed records per worker over time and at the end.
Rebalances are vertical lines with a shaded span until their migration completed. Malformed
entries are skipped and counted (:attr:`ReportData.skipped`). See docs/metrics.md.

Example (three samples of two workers, one second apart):
    >>> samples = [Sample(0, (0, 0), (0, 0)), Sample(1000, (30, 10), (30, 10)),
    ...            Sample(2000, (50, 30), (50, 30))]
    >>> series = interval_series(samples)
    >>> series.seconds.tolist(), series.records.tolist()
    ([1.0, 2.0], [40, 40])
    >>> series.imbalance_fraction.tolist(), series.max_avg.tolist()
    ([0.25, 0.0], [1.5, 1.0])
    >>> series.cumulative_max_avg.tolist()
    [1.5, 1.25]
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from operators.metrics import imbalance, load_figures, max_avg_ratio
from pipeline.io.redis_layout import RunKeys
from pipeline.io.state_store import StateStore
from pipeline.observe.timeline import Sample, timeline_key

if TYPE_CHECKING:
    import redis as redis_module
    from matplotlib.figure import Figure

#: The PNG: inches and dots per inch (1200 x 800 pixels).
FIGURE_INCHES = (12.0, 8.0)
FIGURE_DPI = 100


def rebalances_key(run_id: str) -> str:
    """``skewer:{run}:ctl:rebalances``: the controller's list of rebalances."""
    return RunKeys(run_id).ctl_rebalances


class ReportError(Exception):
    """No report: an unknown run (nothing of it in Redis) or a path that cannot be written.
    The message is one line for the user."""


@dataclass(frozen=True)
class IntervalSeries:
    """Per-interval figures between successive samples (NaN where an interval is empty)."""

    #: End of each interval, seconds since the first sample.
    seconds: np.ndarray
    #: Records processed in the interval (all workers).
    records: np.ndarray
    #: I(t) / records of the interval.
    imbalance_fraction: np.ndarray
    #: max_i d_i / avg_i d_i of the interval.
    max_avg: np.ndarray
    #: max_i L_i / avg_i L_i of the cumulative loads at the interval's end.
    cumulative_max_avg: np.ndarray


def interval_series(samples: Sequence[Sample], counter: str = "records") -> IntervalSeries:
    """The figures of every interval between two successive samples, from ``counter``
    (``"records"``: processed by the workers; ``"routed"``: sent by the grouping stage)."""
    if counter not in ("records", "routed"):
        raise ValueError(f"counter must be 'records' or 'routed', got {counter!r}")
    seconds, records, fraction, ratio, cumulative = [], [], [], [], []
    for before, after in itertools.pairwise(samples):
        loads_before, loads_after = getattr(before, counter), getattr(after, counter)
        loads = [a - b for a, b in zip(loads_after, loads_before, strict=True)]
        total = sum(loads)
        seconds.append((after.t_ms - samples[0].t_ms) / 1000)
        records.append(total)
        fraction.append(float(imbalance(loads)) / total if total else math.nan)
        ratio.append(float(max_avg_ratio(loads)) if total else math.nan)
        cumulative.append(float(max_avg_ratio(loads_after)) if sum(loads_after) else math.nan)
    return IntervalSeries(
        seconds=np.array(seconds, dtype=np.float64),
        records=np.array(records, dtype=np.int64),
        imbalance_fraction=np.array(fraction, dtype=np.float64),
        max_avg=np.array(ratio, dtype=np.float64),
        cumulative_max_avg=np.array(cumulative, dtype=np.float64),
    )


@dataclass(frozen=True)
class Rebalance:
    """One routing-table change the controller published (``completed_ms`` None: in flight)."""

    version: int
    published_ms: int
    completed_ms: int | None

    @classmethod
    def from_json(cls, raw: bytes | str) -> Rebalance:
        value = json.loads(raw)
        completed = value.get("completed_ms")
        return cls(
            int(value["version"]),
            int(value["published_ms"]),
            None if completed is None else int(completed),
        )


@dataclass(frozen=True)
class ReportData:
    """Everything the figure shows, read from Redis once."""

    run_id: str
    scheme: str
    #: Cumulative records processed per worker (``stats:records``) when the report was made.
    per_worker: list[int]
    samples: list[Sample]
    rebalances: list[Rebalance] = field(default_factory=list)
    #: Malformed entries skipped: {"timeline": n, "rebalances": n}.
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return len(self.per_worker)

    @property
    def records(self) -> int:
        return sum(self.per_worker)

    @property
    def final_max_avg(self) -> float:
        return load_figures(self.per_worker)[2]

    def title(self) -> str:
        return (
            f"run {self.run_id} · scheme {self.scheme} · W={self.workers} workers · "
            f"{self.records:,} records · final max/avg load λ = {self.final_max_avg:.3f}"
        )


def _parse_list(raw: Sequence[bytes], parse: Callable[[bytes], Any]) -> tuple[list[Any], int]:
    parsed, bad = [], 0
    for item in raw:
        try:
            parsed.append(parse(item))
        except (ValueError, KeyError, TypeError):
            bad += 1
    return parsed, bad


def _workers(client: redis_module.Redis, keys: RunKeys, samples: Sequence[Sample]) -> int:
    """W: the run's recorded config, else the samples' width, else the highest worker seen."""
    recorded = client.hget(keys.config, "workers")
    if recorded is not None:
        return int(recorded)
    if samples:
        return len(samples[-1].records)
    workers = [int(w) for w in client.hkeys(keys.stats("records"))]
    return max(workers) + 1 if workers else 0


def load_report_data(client: redis_module.Redis, run_id: str, scheme: str) -> ReportData:
    """The run's samples, final loads and rebalances; :class:`ReportError` if Redis has
    neither samples nor worker counters of ``run_id``."""
    store = StateStore(client, run_id)
    samples, bad_samples = _parse_list(client.lrange(timeline_key(run_id), 0, -1), Sample.from_json)
    # Samples of another width (a run restarted with another W) cannot be differenced.
    width = len(samples[-1].records) if samples else 0
    mixed = sum(1 for s in samples if len(s.records) != width)
    samples = [s for s in samples if len(s.records) == width]
    workers = _workers(client, store.keys, samples)
    if workers == 0:
        raise ReportError(
            f"run {run_id!r} has no timeline samples and no worker counters in Redis "
            f"({store.keys.stats('*')})"
        )
    rebalances, bad_rebalances = _parse_list(
        client.lrange(rebalances_key(run_id), 0, -1), Rebalance.from_json
    )
    return ReportData(
        run_id=run_id,
        scheme=scheme,
        per_worker=store.processed_per_worker(workers).tolist(),
        samples=samples,
        rebalances=sorted(rebalances, key=lambda r: r.published_ms),
        skipped={"timeline": bad_samples + mixed, "rebalances": bad_rebalances},
    )


# --- the figure -------------------------------------------------------------------------------

PROCESSED_COLOR = "#1f77b4"
HOT_COLOR = "#d62728"
REBALANCE_COLOR = "#2ca02c"
#: The imbalance panel's λ axis reaches at least this far, so reports of one W compare at a
#: glance (a balanced run's curve stays visibly low instead of filling the panel).
MIN_LAMBDA_AXIS = 3.0


def build_figure(data: ReportData) -> Figure:
    """The report's figure (not saved): imbalance over time on top; below, records processed
    per worker over time and at the end."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGURE_INCHES, dpi=FIGURE_DPI, layout="constrained")
    figure.suptitle(data.title(), fontsize=12)
    grid = figure.add_gridspec(2, 2, height_ratios=(3, 2))
    _imbalance_panel(figure.add_subplot(grid[0, :]), data)
    _progress_panel(figure.add_subplot(grid[1, 0]), data)
    _load_panel(figure.add_subplot(grid[1, 1]), data)
    return figure


def _no_samples(axes: Any) -> None:
    axes.text(0.5, 0.5, "no timeline samples", transform=axes.transAxes, ha="center", va="center")


def _imbalance_panel(axes: Any, data: ReportData) -> None:
    workers = data.workers
    axes.set_title("imbalance over time: the load the grouping stage gave the workers")
    axes.set_xlabel("seconds since the first sample")
    axes.set_ylabel("max/avg load λ")
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    upper = max(MIN_LAMBDA_AXIS, data.final_max_avg)
    if len(data.samples) < 2:
        _no_samples(axes)
    else:
        routed = interval_series(data.samples, "routed")
        axes.step(
            routed.seconds,
            routed.max_avg,
            where="pre",
            color=PROCESSED_COLOR,
            linewidth=1.6,
            label="per interval (about 1 s)",
        )
        axes.plot(
            routed.seconds,
            routed.cumulative_max_avg,
            color=HOT_COLOR,
            linewidth=2.4,
            label="cumulative",
        )
        _rebalance_markers(axes, data)
        upper = max(upper, float(np.nanmax(np.append(routed.max_avg, 1.0))))
        axes.set_xlim(0, max(1.0, float(routed.seconds[-1])))
        axes.legend(loc="upper right", fontsize=8)
    axes.set_ylim(0.9, upper * 1.08)
    # I(t) / records = (λ - 1) / W: the same curve read on the papers' other scale.
    fraction = axes.secondary_yaxis(
        "right", functions=(lambda lam: (lam - 1) / workers, lambda f: f * workers + 1)
    )
    fraction.set_ylabel("imbalance I(t) / records")


def _rebalance_markers(axes: Any, data: ReportData) -> None:
    t0 = data.samples[0].t_ms
    for number, rebalance in enumerate(data.rebalances):
        start = (rebalance.published_ms - t0) / 1000
        label = "rebalance published (shaded: migrating)" if number == 0 else None
        axes.axvline(start, color=REBALANCE_COLOR, linewidth=1.2, label=label)
        if rebalance.completed_ms is not None:
            end = (rebalance.completed_ms - t0) / 1000
            axes.axvspan(start, end, color=REBALANCE_COLOR, alpha=0.15)
        axes.annotate(
            f"v{rebalance.version}",
            (start, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10),
            textcoords="offset points",
            fontsize=8,
            color=REBALANCE_COLOR,
        )


def _hottest(loads: np.ndarray) -> int | None:
    return int(np.argmax(loads)) if loads.sum() else None


def _progress_panel(axes: Any, data: ReportData) -> None:
    axes.set_title("records processed per worker over time")
    axes.set_xlabel("seconds since the first sample")
    axes.set_ylabel("records (cumulative)")
    if not data.samples:
        _no_samples(axes)
        return
    seconds = np.array([(s.t_ms - data.samples[0].t_ms) / 1000 for s in data.samples])
    records = np.array([s.records for s in data.samples], dtype=np.int64)
    hottest = _hottest(records[-1])
    for worker in range(records.shape[1]):
        hot = worker == hottest
        axes.plot(
            seconds,
            records[:, worker],
            color=HOT_COLOR if hot else PROCESSED_COLOR,
            linewidth=2.0 if hot else 1.0,
            alpha=1.0 if hot else 0.6,
            label=f"worker {worker} (most loaded)" if hot else None,
        )
    axes.plot(
        seconds, records.mean(axis=1), color="black", linestyle="--", linewidth=1.2, label="average"
    )
    axes.legend(loc="upper left", fontsize=8)


def _load_panel(axes: Any, data: ReportData) -> None:
    loads = np.array(data.per_worker, dtype=np.int64)
    average = loads.sum() / len(loads)
    hottest = _hottest(loads)
    colors = [HOT_COLOR if w == hottest else PROCESSED_COLOR for w in range(len(loads))]
    axes.bar(np.arange(len(loads)), loads, color=colors)
    axes.axhline(
        average, color="black", linestyle="--", linewidth=1.2, label=f"average {average:,.0f}"
    )
    axes.set_title("records processed per worker (cumulative)")
    axes.set_xlabel("worker")
    axes.set_ylabel("records")
    axes.set_xticks(np.arange(len(loads)))
    axes.legend(loc="upper right", fontsize=8)


def default_path(run_id: str, run_dir: Path) -> Path:
    """``{run_dir}/reports/{run}.png`` (``run_dir`` from :func:`pipeline.io.config.load`)."""
    return run_dir / "reports" / f"{run_id}.png"


def save_figure(figure: Figure, path: Path) -> Path:
    """Write the PNG (creating its folder); :class:`ReportError` with the reason if it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png", dpi=FIGURE_DPI)
    except OSError as error:
        raise ReportError(f"cannot write {path}: {error.strerror or error}") from None
    return path


def write_run_report(
    client: redis_module.Redis, run_id: str, scheme: str, path: Path
) -> tuple[Path, ReportData]:
    """Read the run from Redis and write its PNG at ``path``: (path, what it shows)."""
    data = load_report_data(client, run_id, scheme)
    return save_figure(build_figure(data), path), data


def report_for_demo(
    client: redis_module.Redis, run_id: str, scheme: str, run_dir: Path, say: Callable[[str], None]
) -> str | None:
    """The end of ``skewer demo``: the report at its default path, before the run's Redis keys
    are deleted. A report that cannot be written is one line through ``say`` (the run itself
    succeeded, so its summary and exit code stand); returns the path written, or None."""
    try:
        return str(write_run_report(client, run_id, scheme, default_path(run_id, run_dir))[0])
    except ReportError as error:
        say(f"report not written: {error}")
        return None

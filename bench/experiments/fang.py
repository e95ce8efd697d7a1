"""Experiment 6: Fang et al.'s Mixed, MinTable and MinMig (and Gedik's Readj) under fluctuation.

Layer: bench. Fang et al., "Parallel Stream Processing Against Workload Skewness and Variance"
(2017), §5: a new routing table is planned at the end of every interval from that interval's
statistics; the paper reports migration cost, table size and planning time against θ_max
(Fig. 9), the fluctuation rate f (Fig. 12, against Readj) and R_max (Fig. 17), for w = 1 and 5.

Here a Zipf stream (z = 0.85) over K keys is cut into intervals, ``drift:mode=fluctuate`` swaps
key frequencies at each interval's start, and every scheme plans on exact per-key statistics
and installs its plan; all share one consistent-hash ring. Metrics: *skew* = max/avg load
before and after the plan, *migration* = % of the window state moved, *table* = entries,
*plan ms*, *balanced* = share of plans with skew after <= 1 + θ_max. Readj gets the α whose
Eq. 15 allowance equals θ_max (:func:`readj_alpha`). The setup and how to read the results:
docs/schemes.md#fang-et-al-experiment; the report: :mod:`bench.fang_report`.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.experiment import ExperimentResult
from bench.fang_report import FANG, Setup, figures, render
from operators import registry
from operators.base import KeyStatistics, TableScheme
from operators.keys import KeyBatch
from producers.workloads import parse

FULL = Setup(
    keys=100_000,
    records=500_000,
    intervals=14,
    workers=10,
    z=0.85,
    thetas=(0.01, 0.02, 0.04, 0.08, 0.16, 0.32),
    rates=(0.0, 0.25, 0.5, 1.0, 1.5, 2.0),
    windows=(1, 5),
    table_limits=(0, 5, 10, 20, 40, 80, None),
    key_counts=(10_000, 100_000, 1_000_000),
)
QUICK = Setup(
    keys=4_000,
    records=40_000,
    intervals=5,
    workers=5,
    z=0.85,
    thetas=(0.08, 0.16),
    rates=(0.0, 1.0),
    windows=(1, 5),
    table_limits=(5, None),
    key_counts=(2_000, 4_000),
    warmup=1,
)


@dataclass
class Stream:
    """Per-interval key counts, columns in ascending key-id order (the statistics' order)."""

    key_ids: np.ndarray
    counts: np.ndarray  # (intervals, keys), float64

    def statistics(self, interval: int, window: int) -> KeyStatistics:
        """What the sources would report at the end of ``interval`` (every key with state)."""
        state = self.counts[max(0, interval - window + 1) : interval + 1].sum(axis=0)
        live = state > 0
        cost = self.counts[interval][live]
        return KeyStatistics(
            key_ids=self.key_ids[live],
            frequency=cost,
            cost=cost.copy(),
            state_size=state[live],
            worker_loads=np.zeros(1),  # not used by the planners; set below by the caller
            records=int(cost.sum()),
        )


def fluctuating_stream(setup: Setup, rate: float, keys: int | None = None, seed: int = 7) -> Stream:
    """The ``drift:mode=fluctuate`` workload at fluctuation rate ``rate``, counted per interval."""
    n_keys = keys or setup.keys
    records = setup.records if keys is None else 10 * n_keys
    intervals = setup.intervals if keys is None else 2
    spec = (
        f"drift:mode=fluctuate,z={setup.z},keys={n_keys},n={records * intervals},f={rate},"
        f"intervals={intervals},workers={setup.workers},seed={seed}"
    )
    ranks = parse(spec).ints() - 1
    counts = np.stack(
        [
            np.bincount(ranks[i * records : (i + 1) * records], minlength=n_keys)
            for i in range(intervals)
        ]
    ).astype(np.float64)
    key_ids = KeyBatch.from_ints(np.arange(1, n_keys + 1, dtype=np.int64)).key_ids()
    order = np.argsort(key_ids)
    return Stream(key_ids[order], counts[:, order])


def readj_alpha(theta: float, workers: int) -> float:
    """Gedik's max/min bound α whose Eq. 15 allowance (α-1)/(1+α/(N-1)) equals θ."""
    if workers <= 1:
        return 1.0 + theta
    return (1.0 + theta) / (1.0 - theta / (workers - 1))


def readj_available() -> bool:
    return importlib.util.find_spec("operators.schemes.gedik") is not None


def make_scheme(name: str, setup: Setup, theta: float, window: int, **extra: Any) -> TableScheme:
    if name == "readj":
        params = {"alpha": readj_alpha(theta, setup.workers), "replicas": 100, **extra}
    else:
        params = {"theta_max": theta, "window": window, "replicas": 100, **extra}
        if name != "mintable":
            params.setdefault("beta", setup.beta)
    scheme = registry.create(name, setup.workers, **params)
    assert isinstance(scheme, TableScheme)
    return scheme


def replay(scheme: TableScheme, stream: Stream, window: int, theta: float) -> dict[str, np.ndarray]:
    """Plan after every interval, install, and measure; one row per plan."""
    rows: list[tuple[float, ...]] = []
    for interval in range(stream.counts.shape[0]):
        stats = stream.statistics(interval, window)
        base = scheme.ring.owners(stats.key_ids)
        before = np.bincount(
            scheme.table.apply(stats.key_ids, base), weights=stats.cost, minlength=scheme.n_workers
        )
        stats.worker_loads = before.astype(np.int64)
        started = time.perf_counter()
        plan = scheme.plan(stats)
        seconds = time.perf_counter() - started
        after = np.bincount(
            plan.table.apply(stats.key_ids, base), weights=stats.cost, minlength=scheme.n_workers
        )
        moved = np.isin(stats.key_ids, plan.moved_keys, assume_unique=True)
        total = float(stats.state_size.sum())
        skew_after = float(after.max() / after.mean())
        rows.append(
            (
                float(before.max() / before.mean()),
                skew_after,
                100.0 * float(stats.state_size[moved].sum()) / total,
                float(len(plan.table)),
                1000.0 * seconds,
                float(skew_after <= (1.0 + theta) * (1 + 1e-9)),
                float(bool(plan.details.get("degenerated", False))),
                float(plan.details.get("tracked", 0)),
            )
        )
        scheme.install(plan.table)
    table = np.array(rows)
    names = (
        "skew_before",
        "skew_after",
        "migration",
        "table",
        "plan_ms",
        "balanced",
        "degenerated",
        "tracked",
    )
    return {name: table[:, i] for i, name in enumerate(names)}


def summary(series: dict[str, np.ndarray], warmup: int) -> dict[str, float]:
    out = {name: float(values[warmup:].mean()) for name, values in series.items()}
    out["plan_ms_max"] = float(series["plan_ms"].max())
    out["table_final"] = float(series["table"][-1])
    out["balanced"] *= 100.0
    out["degenerated"] *= 100.0
    return out


def run_readj(
    setup: Setup, stream: Stream, theta: float, window: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Readj's best run over ``setup.readj_sigmas``: best balance, then least migration."""
    best: tuple[tuple[float, float], dict[str, float], dict[str, np.ndarray]] | None = None
    for sigma in setup.readj_sigmas:
        series = replay(
            make_scheme("readj", setup, theta, window, sigma=sigma), stream, window, theta
        )
        row = summary(series, setup.warmup) | {"sigma": sigma}
        rank = (row["skew_after"], row["migration"])
        if best is None or rank < best[0]:
            best = (rank, row, series)
    assert best is not None
    return best[1], best[2]


def run(quick: bool = False) -> ExperimentResult:
    setup = QUICK if quick else FULL
    started = time.perf_counter()
    with_readj = readj_available()
    schemes = (*FANG, "readj") if with_readj else FANG
    streams = {rate: fluctuating_stream(setup, rate) for rate in setup.rates}
    default = streams[setup.rate] if setup.rate in streams else fluctuating_stream(setup, 1.0)
    data: dict[str, Any] = {"setup": setup.__dict__, "theta": [], "rate": [], "limit": []}

    # Fig. 9: θ_max, both windows, R_max at the default.
    for window in setup.windows:
        for theta in setup.thetas:
            for name in schemes:
                if name == "readj" and window != setup.windows[0]:
                    continue
                if name == "readj" and theta < setup.readj_min_theta:
                    if theta == max(t for t in setup.thetas if t < setup.readj_min_theta):
                        # Too slow to replay: time two plans, to report what it costs.
                        short = Stream(default.key_ids, default.counts[:2])
                        series = replay(make_scheme(name, setup, theta, window), short, 1, theta)
                        data["readj_slow"] = {
                            "theta": theta,
                            "plan_ms": float(series["plan_ms"][-1]),
                            "tracked": float(series["tracked"][-1]),
                        }
                    continue
                if name == "readj":
                    row, _ = run_readj(setup, default, theta, window)
                else:
                    scheme = make_scheme(
                        name, setup, theta, window, max_table_size=setup.table_limit
                    )
                    row = summary(replay(scheme, default, window, theta), setup.warmup)
                data["theta"].append({"scheme": name, "window": window, "theta": theta, **row})

    # Fig. 12: fluctuation rate, w = 1.
    growth: dict[str, np.ndarray] = {}
    window = setup.windows[0]
    for rate, stream in streams.items():
        for name in ("hash", *schemes):
            if name == "readj":
                row, series = run_readj(setup, stream, setup.theta, window)
            elif name == "hash":  # the consistent hash alone: a table of at most 0 entries
                scheme = make_scheme("mintable", setup, setup.theta, window, max_table_size=0)
                series = replay(scheme, stream, window, setup.theta)
                row = summary(series, setup.warmup)
            else:
                scheme = make_scheme(
                    name, setup, setup.theta, window, max_table_size=setup.table_limit
                )
                series = replay(scheme, stream, window, setup.theta)
                row = summary(series, setup.warmup)
            if rate == setup.rate and name != "hash":
                growth[name] = series["table"]
            data["rate"].append({"scheme": name, "rate": rate, **row})

    # Fig. 17 / 18: R_max, w = 5 (None = unbounded: MinMig's own growth).
    window = setup.windows[-1]
    for limit in setup.table_limits:
        for name in FANG:
            scheme = make_scheme(name, setup, setup.theta, window, max_table_size=limit)
            series = replay(scheme, default, window, setup.theta)
            if limit is None and name == "minmig":
                growth["minmig (no R_max, w=5)"] = series["table"]
            row = summary(series, setup.warmup)
            data["limit"].append({"scheme": name, "limit": limit, **row})

    # Planning time against the number of keys (Fig. 10; Fig. 11's 0.6 s / 6 s), θ = 0.01.
    data["keys"] = []
    for n_keys in setup.key_counts:
        stream = fluctuating_stream(setup, setup.rate, keys=n_keys)
        for name in FANG:
            scheme = make_scheme(name, setup, 0.01, 1, max_table_size=max(20, n_keys // 100))
            series = replay(scheme, stream, 1, 0.01)
            data["keys"].append(
                {
                    "scheme": name,
                    "keys": n_keys,
                    "plan_ms": float(series["plan_ms"][-1]),
                    "skew_after": float(series["skew_after"][-1]),
                    "table": float(series["table"][-1]),
                }
            )
    data["growth"] = {name: series.tolist() for name, series in growth.items()}
    data["seconds"] = time.perf_counter() - started
    data["readj"] = with_readj
    return ExperimentResult(
        name="fang",
        title="Fang et al.: Mixed vs MinTable, MinMig and Readj under workload fluctuation",
        markdown=render(setup, data, quick),
        figures=figures(setup, data, growth),
        data=data,
    )

"""Experiment 2: PKG with local load estimation vs global information vs periodic probing.

Layer: bench. Nasir et al., "The Power of Both Choices", ICDE 2015, §V-B Q2, Figs. 2-3: H
(hashing), G (PKG with the true global loads), L_S (each of S sources counts what it sent) and
L_S P (L_S reset from the true loads at every probe), S in {1, 5, 10, 20}, W in {5, 10, 50,
100}, on the WP-like and TW-like streams of :mod:`bench.experiments.pkg_table2`. Metrics,
probing interval and what S = 1 means: docs/schemes.md#pkg-load-estimation; results in
bench/results/pkg_estimation.md.
"""

from __future__ import annotations

import platform
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.experiment import ExperimentResult
from bench.experiments.pkg_table2 import DATASETS, workload
from operators.schemes.pkg import DEFAULT_PROBE_INTERVAL
from operators.simulator import SimulationResult, simulate

WORKERS = (5, 10, 50, 100)
SOURCES = (1, 5, 10, 20)
FAST_PROBE_INTERVAL = 1_000
#: The I(t) plot of Fig. 3: S = 5, W = 10 and 50 ("W = 5 and W = 100 are omitted as they are
#: similar to W = 10 and W = 50, respectively").
TIME_SOURCES = 5
TIME_WORKERS = (10, 50)


def jaccard(first: np.ndarray, second: np.ndarray) -> float:
    """Jaccard index of two routings as sets of (record, worker) pairs."""
    agree = int(np.count_nonzero(first == second))
    return agree / (2 * first.shape[0] - agree)


def _fmt(value: float) -> str:
    return "0" if value == 0 else f"{value:.2g}"


def run(quick: bool = False) -> ExperimentResult:
    records = 60_000 if quick else 4_000_000
    workers = (5, 50) if quick else WORKERS
    sources = (1, 5) if quick else SOURCES
    checkpoints = 1000
    began = time.perf_counter()

    data: dict[str, dict] = {}
    series: dict[tuple[str, int, str], SimulationResult] = {}
    for dataset in DATASETS:
        z, keys = workload(dataset, records)
        columns: dict[str, list[float]] = {}
        overlap: dict[str, list[float]] = {}

        for n_workers in workers:
            hashing = simulate("key", keys, n_workers, 1, checkpoints=checkpoints)
            columns.setdefault("H", []).append(hashing.imbalance_avg_fraction)
            exact = simulate("pkg-global", keys, n_workers, 1, checkpoints=checkpoints)
            columns.setdefault("G", []).append(exact.imbalance_avg_fraction)
            for n_sources in sources[1:]:
                local = simulate("pkg", keys, n_workers, n_sources, checkpoints=checkpoints)
                columns.setdefault(f"L{n_sources}", []).append(local.imbalance_avg_fraction)
                overlap.setdefault(f"L{n_sources}", []).append(
                    jaccard(exact.workers, local.workers)
                )
                probed = simulate(
                    "pkg-probing", keys, n_workers, n_sources, checkpoints=checkpoints
                )
                columns.setdefault(f"L{n_sources}P", []).append(probed.imbalance_avg_fraction)
                if n_sources == TIME_SOURCES:
                    fast = simulate(
                        "pkg-probing",
                        keys,
                        n_workers,
                        n_sources,
                        params={"probe_interval": FAST_PROBE_INTERVAL},
                        checkpoints=checkpoints,
                    )
                    columns.setdefault(f"L{n_sources}P-fast", []).append(
                        fast.imbalance_avg_fraction
                    )
                    if n_workers in TIME_WORKERS:
                        for label, result in (
                            ("H", hashing),
                            ("G", exact),
                            (f"L{n_sources}", local),
                            (f"L{n_sources}P", probed),
                        ):
                            series[(dataset, n_workers, label)] = result
        data[dataset] = {"z": z, "p1": DATASETS[dataset][0], "columns": columns, "jaccard": overlap}
    elapsed = time.perf_counter() - began

    sections = []
    ratios: list[float] = []
    probe_gain: list[float] = []
    for dataset, info in data.items():
        columns = info["columns"]
        order = ["H", "G"]
        for n_sources in sources[1:]:
            order += [f"L{n_sources}", f"L{n_sources}P"]
            if f"L{n_sources}P-fast" in columns:
                order.append(f"L{n_sources}P-fast")
        names = {
            "G": "G (= L1 = L1P)",
            f"L{TIME_SOURCES}P-fast": f"L{TIME_SOURCES}P every {FAST_PROBE_INTERVAL:,}",
        }
        table = "| W | " + " | ".join(names.get(c, c) for c in order) + " |\n"
        table += "|---|" + "---|" * len(order) + "\n"
        for i, n_workers in enumerate(workers):
            table += f"| {n_workers} | " + " | ".join(_fmt(columns[c][i]) for c in order) + " |\n"
            g = columns["G"][i]
            for n_sources in sources[1:]:
                local = columns[f"L{n_sources}"][i]
                ratios.append(local / g if g > 0 else np.inf)
                probe_gain.append(columns[f"L{n_sources}P"][i] / local if local > 0 else 1.0)
        overlaps = "; ".join(
            f"{name}: " + " ".join(f"{v:.0%}" for v in values)
            for name, values in info["jaccard"].items()
        )
        sections.append(
            f"""### {dataset}-like (Zipf z = {info["z"]:.3f}, p1 = {info["p1"]:.2%})

Fraction of average imbalance, mean I(t) / m (Fig. 2's metric):

{table}
Jaccard overlap of each L_S's decisions with G's, W = {", ".join(map(str, workers))}: \
{overlaps}.
"""
        )

    per_source = {
        s: max(
            (
                info["columns"][f"L{s}"][i] / info["columns"]["G"][i]
                for info in data.values()
                for i in range(len(workers))
                if info["columns"]["G"][i] > 0
            ),
            default=float("nan"),
        )
        for s in sources[1:]
    }
    within = [s for s, r in per_source.items() if r < 10]
    worst_local = max(
        (
            info["columns"][f"L{s}"][i] * records
            for info in data.values()
            for s in sources[1:]
            for i in range(len(workers))
            if info["columns"]["G"][i] < 1e-4
        ),
        default=0.0,
    )
    worst_global = max(
        (
            info["columns"]["G"][i] * records
            for info in data.values()
            for i in range(len(workers))
            if info["columns"]["G"][i] < 1e-4
        ),
        default=0.0,
    )
    overlaps_all = [v for info in data.values() for vs in info["jaccard"].values() for v in vs]
    low_overlap = min(overlaps_all, default=float("nan"))
    high_overlap = max(overlaps_all, default=float("nan"))
    finite = [r for r in ratios if np.isfinite(r)]
    worst_ratio = max(finite) if finite else float("nan")
    local_better_than_hashing = all(
        info["columns"][f"L{s}"][i] < info["columns"]["H"][i]
        for info in data.values()
        for s in sources[1:]
        for i in range(len(workers))
    )
    markdown = (
        f"""PKG's load estimation variants on the streams of Experiment 1 (`pkg_table2`),
{records:,} records, {checkpoints} checkpoints; probes every {DEFAULT_PROBE_INTERVAL:,} records
(P) and every {FAST_PROBE_INTERVAL:,} (P-fast, S = {TIME_SOURCES});
{elapsed:.0f} s on {platform.machine()}. Each cell runs `operators.simulator.simulate`.

"""
        + "\n".join(sections)
        + f"""
### Against the paper

| claim (ICDE'15 §V-B Q2) | ours |
|---|---|
| PKG with local estimation (L) always has a lower imbalance than H | \
{"yes" if local_better_than_hashing else "**no**"} |
| L is always within one order of magnitude of G | largest L_S / G: {worst_ratio:.3g} \
({"yes" if worst_ratio < 10 else "**no**"}) |
| robust to the number of sources | largest L_S / G per S: \
{", ".join(f"S = {s}: {r:.3g}" for s, r in per_source.items())}; within 10× for S = \
{", ".join(map(str, within)) or "none"} |
| G and L overlap 47% (Jaccard) yet balance alike | see the Jaccard lines above |
| probing (L5P1) does not improve the balance, nor does probing more often | L_S P / L_S: \
{min(probe_gain, default=float("nan")):.3g} – {max(probe_gain, default=float("nan")):.3g} |

### Where we agree, and why not

- In the balanced regime (p1/2 < 1/W) G keeps the mean of I(t) at {worst_global:.1f} records
  or less; L_S sits above it because each of the S sources balances only its own
  sub-stream and, as the paper argues (§III-B), the global imbalance is then at most the sum
  of the S local ones. The gap is about one record per source, so L_S / G grows roughly
  linearly with S where G is that small (ratio rows above). The paper does not give its S
  grid; its "less than one order of magnitude" holds in ours for the S listed in the
  robustness row, and in this regime L_S's mean imbalance never exceeds {worst_local:.0f}
  records out of {records:,}.
- In the saturated regime (p1/2 > 1/W) every variant is dominated by the top key's two
  workers, so L = G = P to within a few percent, as in the paper's Fig. 3 where "all
  techniques lead to the same high load imbalance".
- Probing resets each source to its share of the true loads. Since local estimation already
  balances each source's own sub-stream, the reset only tells a source about the other
  sources' current deviations, which they are correcting anyway. In ours probing trims L's
  imbalance by at most {100 * (1 - min(probe_gain, default=1.0)):.0f}% (and probing
  {DEFAULT_PROBE_INTERVAL // FAST_PROBE_INTERVAL}× more often adds little), closing a small
  part of the gap to G: the paper saw no gain at all; both support its conclusion that
  "local information is sufficient".
- The Jaccard overlap of L and G ({low_overlap:.0%}–{high_overlap:.0%}) is close to the
  paper's 47%: the variants send about half of the records to different workers, yet both
  keep the stream balanced to within a few records, as the paper found.
"""
    )

    figures = {"fraction": _bars(data, workers, sources)}
    if series:
        figures["through_time"] = _through_time(series, records)
    return ExperimentResult(
        name="pkg_estimation",
        title="PKG local vs global load estimation vs periodic probing (Fig. 2, Fig. 3)",
        markdown=markdown,
        figures=figures,
        data={
            "records": records,
            "workers": list(workers),
            "sources": list(sources),
            "probe_interval": DEFAULT_PROBE_INTERVAL,
            "fast_probe_interval": FAST_PROBE_INTERVAL,
            "datasets": data,
            "seconds": elapsed,
        },
    )


def _bars(data: dict[str, dict], workers: tuple[int, ...], sources: tuple[int, ...]) -> plt.Figure:
    figure, axes = plt.subplots(1, len(data), figsize=(12, 4.2), sharey=True)
    for axis, (dataset, info) in zip(np.atleast_1d(axes), data.items(), strict=True):
        labels = ["H", "G"] + [f"L{s}" for s in sources[1:]] + [f"L{s}P" for s in sources[1:]]
        width = 0.8 / len(labels)
        for j, label in enumerate(labels):
            values = np.maximum(np.asarray(info["columns"][label]), 1e-9)
            axis.bar(np.arange(len(workers)) + j * width, values, width, label=label)
        axis.set_yscale("log")
        axis.set_xticks(np.arange(len(workers)) + 0.4 - width / 2, [f"W={w}" for w in workers])
        axis.set_title(f"{dataset}-like (p1 = {info['p1']:.2%})")
        axis.grid(True, axis="y", which="both", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("mean I(t) / m")
    np.atleast_1d(axes)[-1].legend(fontsize=7, ncol=2)
    figure.suptitle("Fraction of average imbalance (PKG Fig. 2): H, G, L_S, L_S P")
    figure.tight_layout()
    return figure


def _through_time(series: dict[tuple[str, int, str], SimulationResult], records: int) -> plt.Figure:
    panels = list(dict.fromkeys((d, w) for d, w, _ in series))
    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8), sharey=True)
    for axis, (dataset, n_workers) in zip(np.atleast_1d(axes), panels, strict=True):
        for (d, w, label), result in series.items():
            if (d, w) != (dataset, n_workers):
                continue
            t = result.checkpoint_records
            fraction = result.imbalance_series / t
            # A perfectly balanced checkpoint (I = 0) has no place on a log axis: leave a gap.
            axis.plot(t, np.where(fraction > 0, fraction, np.nan), label=label)
        axis.set_yscale("log")
        axis.set_xlabel("records t")
        axis.set_title(f"{dataset}-like, W = {n_workers}, S = {TIME_SOURCES}")
        axis.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("I(t) / t")
    np.atleast_1d(axes)[-1].legend(fontsize=8)
    figure.suptitle(f"Imbalance through time (PKG Fig. 3), {records:,} records")
    figure.tight_layout()
    return figure

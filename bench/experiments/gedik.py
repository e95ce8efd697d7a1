"""Experiment 5: Gedik's scan, redist, readj vs consistent and uniform hashing as channels grow.

Layer: bench. Gedik, "Partitioning Functions for Stateful Data Parallelism in Stream
Processing", VLDB Journal 2014, §5.1, Fig. 6: start with one channel and add one per
adaptation period up to 32, re-planning from the previous function each time (Zipf z = 1 over
10^6 keys, alpha = 1.2, sigma = 0.1, LCL, U^APM), reporting relative imbalance ``b`` (Eq. 11)
and relative migration ``m`` (Eq. 12) over five seeds. How frequencies reach the planner:
docs/schemes.md#gedik-experiment; results in bench/results/gedik_channels.md.
"""

from __future__ import annotations

import platform
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from bench.experiment import ExperimentResult
from operators import registry
from operators.keys import KeyBatch
from operators.schemes.gedik import GedikScheme, imbalance_allowance
from producers.workloads import Zipf

ALGORITHMS = ("scan", "redist", "readj")
METHODS = ("uniform", "consistent", *ALGORITHMS)
ALPHA = 1.2
SIGMA = 0.1
SHOWN_CHANNELS = (2, 4, 8, 10, 16, 20, 24, 32)


def relative_imbalance(frequency: np.ndarray, workers: np.ndarray, n_channels: int) -> float:
    """Eq. 11 under LCL: (b_s * b_c * b_n)^(1/3), b_k = (max/min load) / alpha."""
    linear = np.bincount(workers, weights=frequency, minlength=n_channels)
    constant = np.bincount(workers, minlength=n_channels).astype(np.float64)
    ratios = []
    for loads in (linear, constant, linear):
        low = loads.min()
        ratios.append(loads.max() / low / ALPHA if low > 0 else np.inf)
    return float(np.prod(ratios) ** (1.0 / 3.0))


def relative_migration(
    frequency: np.ndarray, before: np.ndarray, after: np.ndarray, n_channels: int
) -> float:
    """Eq. 12 with beta_s linear: M / (sum f / N)."""
    return float(np.sum(frequency[before != after]) / (np.sum(frequency) / n_channels))


def one_run(n_keys: int, records: int, max_channels: int, seed: int) -> dict[str, np.ndarray]:
    """b, m per method and channel count (index N - 2 for N = 2..max), plus sizes and times."""
    workload = Zipf(z=1.0, n_keys=n_keys, n=records, seed=seed)
    frequency = workload.probabilities()
    domain = KeyBatch.from_ints(np.arange(1, n_keys + 1, dtype=np.int64))
    domain_ids = domain.key_ids()
    stream = domain.take(workload.ints() - 1)

    # epsilon = delta/10 at the largest channel count planned, so every step's delta is covered
    epsilon = SIGMA * imbalance_allowance(ALPHA, max_channels) / max_channels / 10.0
    schemes: dict[str, GedikScheme] = {
        name: registry.create(name, 1, seed=seed, alpha=ALPHA, sigma=SIGMA, epsilon=epsilon)
        for name in ALGORITHMS
    }
    # The sketch counts keys whatever the routing, so one object's statistics serve all three.
    schemes["scan"].route(stream)
    stats = schemes["scan"].statistics(reset=False)
    counter_entries = len(schemes["scan"].counter)

    steps = max_channels - 1
    out = {
        "b": np.zeros((len(METHODS), steps)),
        "m": np.zeros((len(METHODS), steps)),
        "table": np.zeros((len(ALGORITHMS), steps)),
        "seconds": np.zeros((len(ALGORITHMS), steps)),
        "counter_entries": np.array([counter_entries]),
    }
    previous = {method: np.zeros(n_keys, dtype=np.int32) for method in METHODS}
    for step, n_channels in enumerate(range(2, max_channels + 1)):
        current: dict[str, np.ndarray] = {}
        for a, name in enumerate(ALGORITHMS):
            scheme = schemes[name]
            plan = scheme.plan(stats, n_workers=n_channels)
            scheme.resize(n_channels, plan.table)
            out["table"][a, step] = len(plan.table)
            out["seconds"][a, step] = plan.planning_seconds
        ring_workers = schemes["scan"].ring.owners(domain_ids)
        current["consistent"] = ring_workers
        current["uniform"] = registry.create("key", n_channels).route(domain)
        for name in ALGORITHMS:
            current[name] = schemes[name].table.apply(domain_ids, ring_workers)
        for i, method in enumerate(METHODS):
            out["b"][i, step] = relative_imbalance(frequency, current[method], n_channels)
            out["m"][i, step] = relative_migration(
                frequency, previous[method], current[method], n_channels
            )
        previous = current
    return out


def _figure(channels: np.ndarray, values: np.ndarray, ylabel: str, log: bool) -> plt.Figure:
    figure, axes = plt.subplots(figsize=(6, 4))
    for i, method in enumerate(METHODS):
        axes.plot(channels, values[i], marker="o", markersize=3, label=method)
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="ideal")
    if log:
        axes.set_yscale("log")
    axes.set_xlabel("number of channels N")
    axes.set_ylabel(ylabel)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def _table(channels: np.ndarray, values: np.ndarray, shown: tuple[int, ...]) -> str:
    header = "| N | " + " | ".join(METHODS) + " |\n|---|" + "---|" * len(METHODS) + "\n"
    rows = []
    for n in shown:
        if n not in channels:
            continue
        col = int(np.flatnonzero(channels == n)[0])
        rows.append(f"| {n} | " + " | ".join(f"{values[i, col]:.2f}" for i in range(len(METHODS))))
    return header + " |\n".join(rows) + " |\n"


def run(quick: bool = False) -> ExperimentResult:
    n_keys, records, max_channels, runs = (
        (20_000, 100_000, 8, 1) if quick else (1_000_000, 2_000_000, 32, 5)
    )
    began = time.perf_counter()
    results = [one_run(n_keys, records, max_channels, seed) for seed in range(runs)]
    elapsed = time.perf_counter() - began
    mean = {key: np.mean([r[key] for r in results], axis=0) for key in results[0]}
    channels = np.arange(2, max_channels + 1)
    shown = tuple(n for n in SHOWN_CHANNELS if n <= max_channels)
    b, m = mean["b"], mean["m"]
    row = {method: i for i, method in enumerate(METHODS)}

    def at(values: np.ndarray, method: str, n: int) -> float:
        return float(values[row[method], min(n, max_channels) - 2])

    upto20 = channels <= 20
    uniform_over_readj = float(np.max(b[row["uniform"], upto20] / b[row["readj"], upto20]))
    others = b[[row["scan"], row["redist"]]].min(axis=0)
    readj_lowest = int(np.sum(b[row["readj"], upto20] <= others[upto20] + 0.005))
    big = min(32, max_channels)
    top = float(Zipf(z=1.0, n_keys=n_keys).probabilities()[0])

    def bound(n: int) -> float:
        """Smallest possible b_n with N channels: the top key alone vs the rest spread evenly."""
        return max(1.0, top * (n - 1) / (1.0 - top)) / ALPHA

    # beyond this N even the top key alone on a channel, the rest spread evenly, breaks alpha
    infeasible_from = next(n for n in range(2, 10_000) if top * (n - 1) / (1 - top) > ALPHA)
    m_redist = m[row["redist"]]
    consistent_lowest = int(np.sum(m[row["consistent"]] <= m.min(axis=0)))
    consistent_worst = int(np.sum(b[row["consistent"]] >= b.max(axis=0)))
    readj_vs = at(b, "readj", big) / min(at(b, "redist", big), at(b, "scan", big)) - 1.0
    claims = [
        ("uniform hash migration ≈ 22× ideal at N = 32", f"{at(m, 'uniform', big):.1f}×"),
        (
            "consistent hash has the lowest migration",
            f"lowest at {consistent_lowest} of {channels.size} N; {at(m, 'consistent', big):.2f}",
        ),
        ("redist flat at ≈ 1.15× ideal", f"redist m {m_redist.min():.2f} to {m_redist.max():.2f}"),
        (
            "scan > 3× ideal at N = 32; scan and readj grow with N",
            f"scan {at(m, 'scan', big):.2f}, readj {at(m, 'readj', big):.2f}",
        ),
        (
            "consistent hash imbalance worst, > 2 at N = 32",
            f"worst at {consistent_worst} of {channels.size} N; {at(b, 'consistent', big):.2f}",
        ),
        ("N in [2, 20]: uniform up to 36% above readj", f"up to {uniform_over_readj - 1:.0%}"),
        (
            "N in [2, 20]: readj has the lowest imbalance",
            f"lowest (within 0.005) at {readj_lowest} of {int(upto20.sum())} N",
        ),
        (
            "N > 20: readj's imbalance exceeds redist's and scan's",
            f"readj {at(b, 'readj', big):.2f}, redist {at(b, 'redist', big):.2f}, "
            f"scan {at(b, 'scan', big):.2f}",
        ),
    ]
    comparison = f"| claim in the paper | ours (N = {big} unless said) |\n|---|---|\n" + "".join(
        f"| {claim} | {ours} |\n" for claim, ours in claims
    )
    markdown = (
        f"""Zipf z = 1 over {n_keys:,} keys, frequencies from {records:,} records through
lossy counting, alpha = {ALPHA}, sigma = {SIGMA}, LCL, U^APM, channels added one at a time from
1 to {max_channels}; mean of {runs} run(s); {elapsed:.0f} s on {platform.machine()}.

### Relative imbalance b (Eq. 11; <= 1 meets alpha)

{_table(channels, b, shown)}
### Relative migration m (Eq. 12; 1 = the new channel's fair share)

{_table(channels, m, shown)}
### Size and construction time (mean over the steps)

| algorithm | explicit map at N = {big} | lossy-counter entries | planning ms (mean / max) |
|---|---|---|---|
"""
        + "".join(
            f"| {name} | {mean['table'][a, -1]:.0f} | {mean['counter_entries'][0]:.0f} "
            f"| {1e3 * mean['seconds'][a].mean():.2f} / {1e3 * mean['seconds'][a].max():.2f} |\n"
            for a, name in enumerate(ALGORITHMS)
        )
        + f"""
### Against the paper (§5.3, Fig. 6; numbers from its text, the figure is not in our copy)

{comparison}
**Where we agree.** Uniform hashing migrates several times the ideal, more with every channel;
consistent hashing migrates about the ideal (below it when the hot keys happen to stay) and its
imbalance grows steadily with N, past b = 2 at 32 channels; scan, redist and readj keep
migration near the ideal while beating both hashes on balance from N = 4 on; readj balances
best and buys it with the most migration, as in the paper's Fig. 3 (LLL: readj 1.34× vs 1.23×
for redist and scan). One nuance: uniform hashing's imbalance jumps around the consistent
hash's level from one N to the next, so "consistent is worst" holds only at some N here.

**Where we differ, and why.**

- *Uniform hashing's migration* is about N (here {at(m, "uniform", big):.0f} at N = {big}), not
  22: ``|h| mod N`` keeps a key only when ``h mod N = h mod (N+1)``, i.e. with probability
  ``1/(N+1)``, so m is close to ``N^2/(N+1)``. The paper does not define its uniform hash; 22 at
  N = 32 means about 30% of the mass stayed, which no mod-N hash does.
- *Scan's migration* stays near the ideal instead of passing 3× at N = 32. Every heuristic
  minimises U = rho + gamma, and rho (Eq. 19) sees only the max - min of the tracked load. The
  hottest key ({top:.2%} of the traffic) holds that max on its own once a few channels exist,
  so placing another key anywhere but on the least loaded channel leaves rho unchanged and
  gamma keeps the key where it was. The paper's pseudo-code is the one we run; its tie
  handling or an unstated detail must differ, and the text does not let us recover it.
- *No approach reaches b <= 1 at large N*, as the paper says for z = 1: from N =
  {infeasible_from} on, even the top key alone on a channel with every other key spread evenly
  breaks alpha, and at N = {big} that ideal still has b_n = {bound(big):.2f}. The well balanced
  key counts (b_c < 1) pull the geometric mean b below b_n.
- *readj at many channels*: the paper has it fall behind redist and scan above 20 channels;
  here at N = {big} it is {readj_vs:+.1%} against the better of them (negative: ahead). The
  margins are a few percent in both.
- The paper does not give its stream length or epsilon; we feed lossy-counter estimates from
  {records:,} records with epsilon = delta({max_channels})/10 (hence
  {mean["counter_entries"][0]:.0f} counter entries, where the paper reports about 2,500 at its
  defaults) and average {runs} run(s) that vary the stream sample and the ring seed; the
  uniform hash is one fixed function.
"""
    )
    channels_list = channels.tolist()
    return ExperimentResult(
        name="gedik_channels",
        title="Gedik Fig. 6: imbalance and migration as channels are added one at a time",
        markdown=markdown,
        figures={
            "imbalance": _figure(channels, b, "relative imbalance b", log=False),
            "migration": _figure(channels, m, "relative migration m", log=True),
        },
        data={
            "channels": channels_list,
            "methods": list(METHODS),
            "b": b.tolist(),
            "m": m.tolist(),
            "table_entries": mean["table"].tolist(),
            "planning_seconds": mean["seconds"].tolist(),
            "counter_entries": float(mean["counter_entries"][0]),
        },
    )

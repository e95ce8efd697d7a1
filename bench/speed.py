"""Speed of the core: routing, simulation and planning, against their targets.

``skewer bench speed`` writes ``bench/results/speed.md``. Everything runs single-threaded
(no ``parallel=True`` anywhere in the core), so a rate is a per-core rate. Rates are computed
from the process's CPU time (``time.process_time``), which other jobs on a shared machine do
not inflate; wall-clock rates and the load average are recorded beside them.

- Routing: 10^7 keys (Zipf z = 1 over 10^6 keys, decimal text) routed in batches of 65,536 by
  one scheme object (one source), for every registered scheme whose module exists, at W = 10
  and W = 100. Each scheme gets a fresh :class:`KeyBatch` -- no hash memoized by an earlier
  scheme -- so hashing is part of every rate. Schemes side by side in one run, with the ratio
  to ``key``. ``greedy-offline`` includes its ``prepare`` pass over the stream.
- Simulator: :func:`operators.simulator.simulate` of ``pkg`` with S = 5, W = 100 on the same
  10^7 keys, the whole call (metrics included).
- Planning: ``plan(stats)`` of every routing-table scheme for 10^6 keys and N = 10 workers,
  from statistics holding every key with its expected count in 10^7 Zipf(1) records
  (frequency = cost = state size), and the worker loads of the scheme's base hash.
- Metrics: the grouping stage's metric updates for one batch, W = 8, for a batch of 20 and of
  20,000 records: O(W), the same for both, microseconds against a batch's tens of milliseconds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.experiment import ExperimentResult
from operators import registry
from operators.base import KeyStatistics, TableScheme
from operators.keys import KeyBatch
from producers.workloads import Zipf

ROUTING_TARGETS = {
    "key": 20e6,
    "shuffle": 20e6,
    "pkg": 20e6,
    "consistent": 20e6,
    "d-choices": 5e6,
    "w-choices": 5e6,
    "fish": 5e6,
}
SIMULATOR_TARGET = 5e6
PLANNING_TARGETS = {"scan": 1.0, "redist": 1.0, "mixed": 1.0}
#: CPU seconds of one batch's metric updates in the grouping stage (a 20,000-record batch takes
#: some 50 ms to route and write).
METRICS_BATCH_TARGET = 200e-6
BATCH_SIZE = 65536


def available_schemes() -> list[str]:
    """Registered schemes whose module imports (others are being written or are broken)."""
    names = []
    for name in registry.names():
        try:
            registry.scheme_class(name)
        except (ImportError, AttributeError):
            continue
        names.append(name)
    return names


def _fresh(keys: KeyBatch) -> KeyBatch:
    """The same keys without memoized hashes."""
    return KeyBatch(keys.data, keys.offsets)


class Clock:
    """CPU and wall seconds of a block: ``with Clock() as clock: ...; clock.cpu, clock.wall``."""

    def __enter__(self) -> Clock:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu = max(time.process_time() - self._cpu, 1e-9)
        self.wall = max(time.perf_counter() - self._wall, 1e-9)


def routing_rate(name: str, keys: KeyBatch, n_workers: int) -> dict[str, float]:
    """Keys per second (CPU and wall) of one scheme object routing ``keys`` in batches."""
    warm = registry.create(name, n_workers)
    sample = _fresh(keys.slice(0, min(len(keys), 10_000)))
    if hasattr(warm, "prepare"):
        warm.prepare(sample)
    warm.route(sample)  # compiles or loads the cached machine code outside the timing
    scheme = registry.create(name, n_workers)
    stream = _fresh(keys)
    with Clock() as clock:
        if hasattr(scheme, "prepare"):
            scheme.prepare(stream)
        for start in range(0, len(stream), BATCH_SIZE):
            scheme.route(stream.slice(start, min(len(stream), start + BATCH_SIZE)))
    return {"cpu": len(stream) / clock.cpu, "wall": len(stream) / clock.wall}


def simulator_rate(keys: KeyBatch, n_workers: int = 100, n_sources: int = 5) -> dict[str, float]:
    """Records per second of a whole :func:`simulate` call of ``pkg`` (metrics included)."""
    from operators.simulator import simulate

    simulate("pkg", _fresh(keys.slice(0, 10_000)), n_workers, n_sources)
    with Clock() as clock:
        result = simulate("pkg", _fresh(keys), n_workers, n_sources)
    return {
        "cpu": len(keys) / clock.cpu,
        "wall": len(keys) / clock.wall,
        "routing_rate_wall": result.routing_rate,
        "cpu_seconds": clock.cpu,
    }


def planning_statistics(scheme: TableScheme, n_keys: int, records: int) -> KeyStatistics:
    """Every key of a Zipf(1) domain with its expected count in ``records`` records."""
    workload = Zipf(z=1.0, n_keys=n_keys, n=records)
    domain = KeyBatch.from_ints(np.arange(1, n_keys + 1, dtype=np.int64))
    frequency = workload.probabilities() * records
    base = scheme.base_workers(domain)
    return KeyStatistics(
        key_ids=domain.key_ids(),
        frequency=frequency,
        cost=frequency.copy(),
        state_size=frequency.copy(),
        worker_loads=np.bincount(base, weights=frequency, minlength=scheme.n_workers),
        records=records,
    )


def planning_seconds(name: str, n_keys: int, records: int, n_workers: int = 10) -> float:
    """CPU seconds of one ``plan`` for ``n_keys`` keys (after a small warm-up plan)."""
    scheme = registry.create(name, n_workers)
    warm = registry.create(name, n_workers)
    warm.plan(planning_statistics(warm, 1000, 10_000))  # type: ignore[attr-defined]
    stats = planning_statistics(scheme, n_keys, records)  # type: ignore[arg-type]
    with Clock() as clock:
        scheme.plan(stats)  # type: ignore[attr-defined]
    return clock.cpu


def metrics_batch_seconds(records: int, batches: int = 2000, n_workers: int = 8) -> float:
    """CPU seconds of the grouping stage's metric updates for one batch of ``records`` records
    spread evenly over ``n_workers`` workers."""
    from pipeline.observe import grouping as grouping_metrics
    from pipeline.observe.series import RunLabels

    metrics = grouping_metrics.GroupingMetrics(RunLabels("bench-speed", "pkg"), 0, n_workers)
    routed = [records // n_workers] * n_workers
    dead = {"no-key": 0, "key-too-large": 0, "undecodable-value": 0, "wrong-kind": 0}
    metrics.batch(records, routed, dead, 0.05)
    with Clock() as clock:
        for _ in range(batches):
            metrics.batch(records, routed, dead, 0.05)
    return clock.cpu / batches


def _status(value: float, target: float | None, higher_is_better: bool = True) -> str:
    if target is None:
        return ""
    met = value >= target if higher_is_better else value < target
    return "yes" if met else "**no**"


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def run(quick: bool = False) -> ExperimentResult:
    n, n_keys = (10**6, 10**5) if quick else (10**7, 10**6)
    keys = Zipf(z=1.0, n_keys=n_keys, n=n, seed=1).keys()
    schemes = available_schemes()
    data: dict[str, Any] = {"records": n, "load_before": _load(), "routing": {}, "planning": {}}
    lines = [
        "Every rate is single-threaded (nothing in the core uses `parallel=True`), so it is a "
        "per-core rate, computed from the process's CPU time (`time.process_time`), which other "
        "jobs on a shared machine do not inflate; wall-clock rates and the load average are "
        "recorded beside them. Each scheme routes a fresh key batch (no hash memoized by an "
        "earlier scheme), so hashing the keys is part of every rate; `greedy-offline` includes "
        "its `prepare` pass over the stream.",
        "",
        f"Load average (1, 5, 15 min) when the run started: {data['load_before']}.",
        "",
        f"Routing {n:,} keys (Zipf z = 1 over {n_keys:,} keys) in batches of {BATCH_SIZE:,}, "
        "one source. Million keys per CPU-second; ratio = rate / rate of `key` in the same "
        "run; wall-clock rates in parentheses.",
        "",
        "| scheme | W = 10 | ratio | W = 100 | ratio | target | met (both W) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    rates = {name: {w: routing_rate(name, keys, w) for w in (10, 100)} for name in schemes}
    nan = {"cpu": float("nan"), "wall": float("nan")}
    base = rates.get("key", {10: nan, 100: nan})
    for name in schemes:
        r10, r100 = rates[name][10], rates[name][100]
        target = ROUTING_TARGETS.get(name)
        data["routing"][name] = {"w10": r10, "w100": r100, "target": target}
        lines.append(
            f"| {name} | {r10['cpu'] / 1e6:.1f} ({r10['wall'] / 1e6:.1f}) | "
            f"{r10['cpu'] / base[10]['cpu']:.2f} | "
            f"{r100['cpu'] / 1e6:.1f} ({r100['wall'] / 1e6:.1f}) | "
            f"{r100['cpu'] / base[100]['cpu']:.2f} | "
            f"{'' if target is None else f'{target / 1e6:.0f} M/s'} | "
            f"{_status(min(r10['cpu'], r100['cpu']), target)} |"
        )
    missing = [n for n in registry.names() if n not in schemes]
    if missing:
        lines += ["", f"Not measured (module missing or broken): {', '.join(missing)}."]

    sim = simulator_rate(keys)
    data["simulator"] = sim
    lines += [
        "",
        f"Simulator, `simulate('pkg', {n:,} keys, W=100, S=5)`, the whole call (routing, "
        f"checkpoints, replication, both queue models): {sim['cpu'] / 1e6:.1f} M records per "
        f"CPU-second ({sim['cpu_seconds']:.2f} s; wall {sim['wall'] / 1e6:.1f} M/s, of which "
        f"routing alone {sim['routing_rate_wall'] / 1e6:.1f} M/s); target "
        f"{SIMULATOR_TARGET / 1e6:.0f} M/s: {_status(sim['cpu'], SIMULATOR_TARGET)}.",
    ]

    table_schemes = [n for n in schemes if issubclass(registry.scheme_class(n), TableScheme)]
    plan_keys, plan_records = (10**5, 10**6) if quick else (10**6, 10**7)
    lines += [
        "",
        f"Planning a new table for {plan_keys:,} keys (expected Zipf(1) counts of "
        f"{plan_records:,} records), N = 10, from an empty table; CPU seconds:",
        "",
        "| scheme | seconds | target | met |",
        "|---|---:|---:|---|",
    ]
    for name in table_schemes:
        seconds = planning_seconds(name, plan_keys, plan_records)
        target = PLANNING_TARGETS.get(name)
        data["planning"][name] = {"seconds": seconds, "target": target}
        lines.append(
            f"| {name} | {seconds:.3f} | {'' if target is None else f'< {target:.0f} s'} | "
            f"{_status(seconds, target, higher_is_better=False)} |"
        )
    per_batch = {records: metrics_batch_seconds(records) for records in (20, 20_000)}
    data["metrics_batch"] = {"seconds": per_batch, "target": METRICS_BATCH_TARGET}
    lines += [
        "",
        "The grouping stage's metric updates for one batch (W = 8), CPU microseconds: "
        + ", ".join(f"{s * 1e6:.1f} for {r:,} records" for r, s in per_batch.items())
        + f"; target < {METRICS_BATCH_TARGET * 1e6:.0f} µs: "
        + _status(max(per_batch.values()), METRICS_BATCH_TARGET, higher_is_better=False)
        + ".",
    ]
    data["load_after"] = _load()
    lines += ["", f"Load average when the run ended: {data['load_after']}."]
    return ExperimentResult(
        name="speed",
        title="Speed: routing, simulation and planning",
        markdown="\n".join(lines),
        data=data,
    )

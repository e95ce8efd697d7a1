"""Routing-table schemes live: planning time, migrated state against the ideal and against the
simulator, and how long records of moved keys are held back.

What it measures and how: :data:`METHOD`, the prose of bench/results/migration.md (and of
migration_5s.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bench.experiment import ExperimentResult, method_markdown, or_dash

#: What the benchmark measures and how: the prose of bench/results/migration*.md.
METHOD = """\
``skewer bench migration`` does two things.

1. *Planning on the controller's path* for 10^6 tracked keys at N = 10 workers: the merge of
   two sources' statistics (:meth:`KeyStatistics.merge`), the tolerance check, the scheme's
   pure ``plan`` and the moves per old worker -- everything :meth:`pipeline.stages.controller.
   Controller.close_round` does between reading the reports and the one MULTI that publishes.
   Zipf z = 1.0 frequencies over 10^6 keys whose current assignment is the base hash.
2. *Live runs*, one per routing-table scheme, of the whole pipeline with the controller
   (``pipeline.runs.orchestrator``, as ``skewer demo`` runs it) on a drifting stream -- Fang
   et al.'s fluctuation, the hot keys change four times -- paced at ``RATE`` records/s with a
   controller round every ``INTERVAL`` s; and the simulator (:func:`operators.simulator.simulate`)
   on the same stream with a controller round every ``RATE x INTERVAL`` records, the live round's
   size.

Figures per scheme. *Migrated state*: live, the state entries the MIGRATE scripts moved over the
state entries that existed (open windows, all workers) when each migration moved -- measured in
Redis; *ideal*: the moved keys' share of all state, Σ M(F, F') / Σ Σ_k S(k) in the planner's
units (a key's state = its records in the window, Fang et al. Eq. 2), for the live plans and for
the simulator's (its ``migrated_fraction``). The live protocol moves exactly the moved keys'
entries of open windows, nothing else (tests/integration/test_migration_protocol.py), so
entries moved / entries is the ideal in entry units; the planner's units weigh a key by its
records, which is why the two columns differ for hot keys. *Held back*: records of moved keys
that reached their new worker before their state; the longest any of them waited (the first
held record's apply to the migration's completion) against the interval; and the longest
migration (publication to completion: how far behind the slowest old worker was).
"""

TABLE_SCHEMES = ("scan", "redist", "readj", "llfd", "mintable", "minmig", "mixed")
WORKLOAD = "drift:mode=fluctuate,z=1.0,keys=5000,intervals=4,workers=8,seed=3"
RECORDS = 80_000
RATE = 3_000.0
#: Seconds per controller round (``--interval``).
INTERVAL = 2.0
WORKERS = 8
SOURCES = 2
PLANNING_KEYS = 1_000_000
PLANNING_WORKERS = 10
RUN_TIMEOUT = 600.0


def planning_seconds(
    scheme: str, n_keys: int = PLANNING_KEYS, n_workers: int = PLANNING_WORKERS
) -> tuple[float, int]:
    """CPU seconds of the controller's pure work for one round with ``n_keys`` tracked keys
    (the statistics of ``skewer bench speed``'s planning row, split between two sources),
    after a warm-up round; and the number of keys the plan moves."""
    from bench.speed import Clock, planning_statistics
    from operators import registry
    from operators.base import KeyStatistics
    from pipeline.stages.controller import moves_by_old_worker

    def one_round(n: int) -> tuple[float, int]:
        planner = registry.create(scheme, n_workers)
        stats = planning_statistics(planner, n, 10 * n)  # type: ignore[arg-type]
        halves = [
            KeyStatistics(
                stats.key_ids[part],
                stats.frequency[part],
                stats.cost[part],
                stats.state_size[part],
                stats.worker_loads / 2,
                stats.records // 2,
            )
            for part in (slice(0, None, 2), slice(1, None, 2))
        ]
        names = dict.fromkeys(stats.key_ids.tolist(), b"k")
        with Clock() as clock:
            merged = KeyStatistics.merge(halves)
            planner.within_tolerance(merged.worker_loads)
            plan = planner.plan(merged)
            moved = np.asarray(plan.moved_keys, dtype=np.int64)
            old = planner.workers_of_ids(moved)
            new = plan.table.apply(moved, planner.base_workers_of_ids(moved))
            moves_by_old_worker(moved, old, new, names)
        return clock.cpu, int(moved.shape[0])

    one_round(1000)  # compile or load the kernels first, as a running controller has
    return one_round(n_keys)


def live_run(scheme: str, settings: Any, interval: float) -> dict[str, Any]:
    """One live run of ``scheme`` with its controller; its migrations and intervals."""
    from pipeline.io.control_store import ControlPlane
    from pipeline.runs.orchestrator import run_pipeline
    from pipeline.runs.plan import plan_run

    plan = plan_run(
        settings,
        run_prefix="bench-mig",
        scheme=scheme,
        records=RECORDS,
        workers=WORKERS,
        sources=SOURCES,
        workload=WORKLOAD,
        rate=RATE,
        control_interval=interval,
    )
    intervals: list[dict[str, Any]] = []

    def read_intervals(pipeline: Any, _summary: Any) -> None:
        intervals.extend(ControlPlane(pipeline.store.client, plan.run_id).intervals())

    summary = run_pipeline(plan, settings, timeout=RUN_TIMEOUT, on_end=read_intervals)
    return {"summary": summary, "migrations": summary.migrations, "intervals": intervals}


def simulated(scheme: str, interval: float) -> dict[str, Any]:
    from operators.simulator import simulate
    from producers.workloads import parse

    keys = parse(f"{WORKLOAD},n={RECORDS}").keys()
    result = simulate(
        scheme, keys, WORKERS, SOURCES, rebalance_interval=int(RATE * interval), checkpoints=10
    )
    moved = [m for m in result.migrations if m["moved_keys"] > 0]
    return {
        "migrated_fraction": result.migrated_fraction,
        "rebalances": len(moved),
        "imbalance_fraction": result.imbalance_final / RECORDS,
    }


def _sum(records: Sequence[dict[str, Any]], name: str) -> float:
    return float(sum(r.get(name, 0) or 0 for r in records))


def row(scheme: str, live: dict[str, Any], sim: dict[str, Any], planning: tuple) -> dict:
    migrations = live["migrations"]
    summary = live["summary"]
    entries_total = _sum(migrations, "state_entries_total")
    state_total = _sum(migrations, "total_state")
    return {
        "scheme": scheme,
        "planning_seconds": planning[0],
        "planning_moved_keys": planning[1],
        "migrations": len(migrations),
        "keys_moved": _sum(migrations, "keys_moved"),
        "entries_moved": _sum(migrations, "state_entries_moved"),
        "entries_fraction": _sum(migrations, "state_entries_moved") / entries_total
        if entries_total
        else None,
        "ideal_fraction": _sum(migrations, "migration_cost") / state_total if state_total else None,
        "sim_migrated_fraction": sim["migrated_fraction"],
        "sim_rebalances": sim["rebalances"],
        "held_records": _sum(migrations, "held_records"),
        "longest_hold_s": max((m["longest_hold_s"] for m in migrations), default=None),
        "longest_migration_s": max((m["duration_s"] for m in migrations), default=None),
        "max_avg_ratio": summary.max_avg_ratio,
        "exact": summary.exact,
        "outcomes": [i["outcome"] for i in live["intervals"]],
    }


def markdown(rows: Sequence[dict[str, Any]], interval: float) -> str:
    lines = [
        f"Planning: {PLANNING_KEYS:,} tracked keys, N = {PLANNING_WORKERS} (target < 1 s). "
        f"Live: {RECORDS:,} records of `{WORKLOAD}`, W = {WORKERS}, S = {SOURCES}, paced at "
        f"{RATE:,.0f} records/s, a controller round every {interval:g} s; simulator: the same "
        f"stream, a round every {int(RATE * interval):,} records.",
        "",
        "| scheme | planning (s) | live migrations | keys moved | state entries moved "
        "| entries moved / entries | ideal, live plans | ideal, simulator | simulator "
        "rebalances | records held back | longest hold (s) | longest migration (s) "
        "| max/avg | exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scheme']} | {r['planning_seconds']:.2f} | {r['migrations']} | "
            f"{r['keys_moved']:,.0f} | {r['entries_moved']:,.0f} | "
            f"{or_dash(r['entries_fraction'], '.4f')} | {or_dash(r['ideal_fraction'], '.4f')} | "
            f"{r['sim_migrated_fraction']:.4f} | {r['sim_rebalances']} | "
            f"{r['held_records']:,.0f} | {or_dash(r['longest_hold_s'], '.2f')} | "
            f"{or_dash(r['longest_migration_s'], '.2f')} | "
            f"{r['max_avg_ratio']:.3f} | {'yes' if r['exact'] else 'NO'} |"
        )
    slowest = max(r["planning_seconds"] for r in rows)
    holds = [r["longest_hold_s"] for r in rows if r["longest_hold_s"] is not None]
    lines += [
        "",
        f"- Planning under 1 s for 10^6 keys at N = 10: slowest {slowest:.2f} s -- "
        + ("met." if slowest < 1 else "missed."),
        f"- Records of moved keys held back at most one interval ({interval:g} s): longest "
        + (f"{max(holds):.2f} s -- " + ("met." if max(holds) <= interval else "missed."))
        if holds
        else "- no migration ran.",
    ]
    return "\n".join(lines) + "\n"


def run(
    *,
    schemes: Sequence[str] = TABLE_SCHEMES,
    interval: float = INTERVAL,
    log: Callable[[str], None] = lambda _l: None,
) -> ExperimentResult:
    """One live run and one simulation per scheme; ``migration.md`` at the default interval,
    ``migration_{interval}s.md`` at another."""
    from pipeline.io import config

    settings = config.load()
    load_average = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for scheme in schemes:
        planning = planning_seconds(scheme)
        sim = simulated(scheme, interval)
        live = live_run(scheme, settings, interval)
        rows.append(row(scheme, live, sim, planning))
        r = rows[-1]
        log(
            f"{scheme}: planning {planning[0]:.2f} s; {r['migrations']} live migration(s), "
            f"longest hold {r['longest_hold_s']} s; exact {r['exact']}"
        )
    body = f"Load average (1, 5, 15 min) when the run started: {load_average}.\n\n"
    body += markdown(rows, interval)
    return ExperimentResult(
        name="migration" if interval == INTERVAL else f"migration_{interval:g}s",
        title=f"Routing-table schemes live: planning, migrated state, hold-back ({interval:g} s)",
        markdown=method_markdown(METHOD) + "\n\n" + body,
        data={"interval": interval, "rows": [dict(r) for r in rows]},
    )

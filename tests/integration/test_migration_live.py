"""Routing-table schemes live: real Kafka, Redis and Spark, keys and state migrating.

A drifting workload -- the fluctuation of Fang et al., "Parallel Stream Processing Against
Workload Skewness and Variance" (2017): the hot keys change four times -- under ``mixed`` (that
paper's scheme) and ``readj`` (Gedik, "Partitioning Functions for Stateful Data Parallelism in
Stream Processing"; its rounds counted in records: ``--control-every``), with the controller
(``skewer control``) as a subprocess next to the other stages; the two runs share one Spark
application (the ``spark`` fixture), as test_end_to_end.py's exactness runs do. While a run
goes, a watcher snapshots the window state every 50 ms, and whenever no migration runs it
requires every key's state of every open window to live on one worker; after the run every final
count must equal the ground truth (both are docs/design.md#exactness-invariants). The controller
is also killed with SIGKILL in the middle of a migration and restarted. Finally the acceptance
command itself, ``skewer demo --scheme mixed --workload <drifting> --verify``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from live_runs import shared_spark_run

from operators import registry
from operators.base import KeyStatistics
from pipeline.io import config
from pipeline.io.control_store import ControlPlane
from pipeline.io.redis_client import connect_redis
from pipeline.runs.orchestrator import Pipeline
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.runs.summary import RunSummary

pytestmark = pytest.mark.integration

DRIFT = "drift:mode=fluctuate,z=1.0,keys=5000,intervals=4,workers=8,seed=3"
RECORDS = 60_000
RATE = 3_000
WORKERS = 8
SOURCES = 2
INTERVAL = 2.0
#: readj's rounds, counted in records: as many as INTERVAL's at RATE.
EVERY = int(RATE * INTERVAL)


class StateWatcher(threading.Thread):
    """Snapshots of the state every 50 ms: keys on several workers while no migration runs."""

    def __init__(self, settings: config.Settings, run_id: str) -> None:
        super().__init__(daemon=True, name=f"watch-{run_id}")
        self.plane = ControlPlane(connect_redis(settings.redis_url), run_id)
        self.stopping = threading.Event()
        self.snapshots = 0
        self.migrating_seen: set[int] = set()
        self.offenders: list[dict[tuple[int, bytes], list[int]]] = []

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            found = self.plane.keys_on_several_workers(WORKERS)
            if found is None:
                migrating = self.plane.current().migrating
                if migrating is not None:
                    self.migrating_seen.add(migrating)
                continue
            self.snapshots += 1
            if found:
                self.offenders.append(found)

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.join(10)
        self.plane.client.close()


@dataclass
class Outcome:
    plan: RunPlan
    summary: RunSummary
    rebalances: list[dict[str, Any]]
    intervals: list[dict[str, Any]]
    #: Merged statistics of each published version's planning round.
    planned_from: dict[int, KeyStatistics] = field(default_factory=dict)
    tables: dict[int, Any] = field(default_factory=dict)
    snapshots: int = 0
    offenders: list[dict[tuple[int, bytes], list[int]]] = field(default_factory=list)


#: Gedik's default alpha = 1.2 (max/min load) is out of READJ's reach on this stream over 8
#: workers (its plans reached max/min 1.10-2.67 in our runs); at 1.7 it often finds one.
PARAMS = {"readj": ("alpha=1.7",)}


def plan_of(scheme: str, tag: str) -> RunPlan:
    return RunPlan(
        params=PARAMS.get(scheme, ()),
        scheme=scheme,
        records=RECORDS,
        workers=WORKERS,
        sources=SOURCES,
        workload=DRIFT,
        rate=RATE,
        control_interval=INTERVAL,
        control_every=EVERY if scheme == "readj" else None,
        run_id=f"mig-{tag}-{new_run_id()[5:]}",
    )


def run_live(
    plan: RunPlan,
    settings: config.Settings,
    spark: Any,
    during: Callable[[Pipeline], None] | None = None,
) -> Outcome:
    """All stages of ``plan`` (workers as a query in ``spark``), watched; ``during(pipeline)``
    runs once the stages are started (the fault test's kill)."""
    watcher = StateWatcher(settings, plan.run_id)
    watcher.start()
    try:
        with shared_spark_run(plan, settings, spark, during=during) as pipeline:
            watcher.stop()
            plane = ControlPlane(pipeline.store.client, plan.run_id)
            outcome = Outcome(
                plan,
                pipeline.summary(),
                plane.rebalances(),
                plane.intervals(),
                snapshots=watcher.snapshots,
                offenders=watcher.offenders,
            )
            merged_sources = {
                int(r["round"]): set(r["sources"]) for r in outcome.intervals if "sources" in r
            }
            for record in outcome.rebalances:
                version = int(record["version"])
                round_ = int(record["round"])
                if round_ not in merged_sources:
                    # A controller killed between publishing the table and recording the
                    # interval left no record of what it merged (the kill test's, seen in CI).
                    continue
                # Only the reports the controller merged: one that came after its report_wait
                # is in Redis now but was not planned from.
                reports = [
                    r for r in plane.reports(round_, SOURCES) if r.source in merged_sources[round_]
                ]
                outcome.planned_from[version] = KeyStatistics.merge(
                    [r.statistics() for r in reports]
                )
                outcome.tables[version] = plane.table(version).table
    finally:
        watcher.stop()
    return outcome


@pytest.fixture(scope="module")
def migration_runs(settings: config.Settings, spark: Any) -> dict[str, Outcome]:
    """``mixed`` and ``readj`` on the drifting workload, side by side."""
    plans = [plan_of(scheme, scheme) for scheme in ("mixed", "readj")]
    began = time.monotonic()
    with ThreadPoolExecutor(len(plans)) as pool:
        outcomes = list(pool.map(lambda p: run_live(p, settings, spark), plans))
    print(f"\nmigration runs took {time.monotonic() - began:.1f} s")
    for outcome in outcomes:
        for record in outcome.rebalances:
            print(
                f"{outcome.plan.scheme} v{record['version']}: {record['keys_moved']} keys, "
                f"{record['state_entries_moved']} entries, {record['held_records']} held "
                f"at most {record['longest_hold_s']:.2f} s, migration "
                f"{record['duration_s']:.2f} s, planned imbalance "
                f"{record['imbalance_planned']:.3f} (feasible {record['feasible']})"
            )
    return {outcome.plan.scheme: outcome for outcome in outcomes}


def test_rounds_counted_in_records_cut_each_sources_statistics_at_its_share(
    migration_runs: dict[str, Outcome],
) -> None:
    """readj's rounds come every EVERY records: each source reports right after every
    EVERY / 2 of its records, so a round both sources reported holds exactly EVERY, and one
    planned without a late source (``report_wait``, on a loaded machine) exactly EVERY / 2."""
    intervals = migration_runs["readj"].intervals
    assert [i["round"] for i in intervals] == list(range(1, len(intervals) + 1))
    assert len(intervals) >= RECORDS // EVERY - 1, intervals
    assert [i["records"] for i in intervals] == [
        EVERY // 2 * len(i["sources"]) for i in intervals
    ], intervals
    assert any(i["sources"] == [0, 1] for i in intervals), intervals


@pytest.mark.parametrize("scheme", ["mixed", "readj"])
def test_counts_stay_exact_while_keys_and_state_migrate(
    migration_runs: dict[str, Outcome], scheme: str
) -> None:
    outcome = migration_runs[scheme]
    summary = outcome.summary
    assert summary.verification.exact, "\n".join(summary.verification.lines())
    assert summary.records_processed == summary.records_produced == RECORDS
    assert summary.verification.leftover_state == 0
    # The hot keys changed under the controller's eyes: it rebalanced, and migrations finished.
    assert outcome.rebalances, f"{scheme}: no migration in {outcome.intervals}"
    for record in outcome.rebalances:
        assert record["phase"] == "done"
        assert record["keys_moved"] == record["moved_keys"] > 0
        # Records held back at a new worker are released onto the moved state, except those
        # of a window that closed first: its close counts them (seen on a loaded machine: 151
        # held, 0 released, counts exact). Exactness above says every one was counted.
        assert 0 <= record["released_records"] <= record["held_records"]
        assert record["completed_ms"] >= record["published_ms"]
    outcomes = [i["outcome"] for i in outcome.intervals]
    assert outcomes.count("rebalanced") + outcomes.count("infeasible") == len(outcome.rebalances)


@pytest.mark.parametrize("scheme", ["mixed", "readj"])
def test_after_every_migration_each_keys_state_lives_on_one_worker(
    migration_runs: dict[str, Outcome], scheme: str
) -> None:
    outcome = migration_runs[scheme]
    assert outcome.snapshots >= 20, "too few snapshots outside migrations to mean anything"
    assert outcome.offenders == []


def test_a_feasible_table_balances_the_interval_it_was_planned_for(
    migration_runs: dict[str, Outcome],
) -> None:
    """Fang et al.: the published table, applied to the merged statistics of its planning
    round, keeps every worker within (1 + θ_max)·L̄ whenever MIXED said it found one. The
    loads are recomputed here from the stored reports and table, independently of the plan."""
    outcome = migration_runs["mixed"]
    planner = registry.create("mixed", WORKERS)
    feasible = [r for r in outcome.rebalances if r["feasible"]]
    assert feasible, "MIXED found no feasible table on a stream it can balance"
    for record in feasible:
        stats = outcome.planned_from[int(record["version"])]
        table = outcome.tables[int(record["version"])]
        workers = table.apply(stats.key_ids, planner.base_workers_of_ids(stats.key_ids))
        loads = np.bincount(workers, weights=stats.cost, minlength=WORKERS)
        assert planner.within_tolerance(loads), (record, loads.tolist())
        assert planner.measured_imbalance(loads) == pytest.approx(record["imbalance_planned"])
        assert record["imbalance_before"] > planner.tolerance  # why it planned at all


def test_readj_reports_a_feasible_table_only_within_alpha(
    migration_runs: dict[str, Outcome],
) -> None:
    """Whether READJ finds a table within alpha on a live interval varies from run to run
    (tests/integration/test_migration_protocol.py makes sure it does on a stream where it
    can); whenever it says so, the planned max/min is within alpha, and it plans only when the
    interval exceeded alpha."""
    rebalances = migration_runs["readj"].rebalances
    assert rebalances
    for record in rebalances:
        assert record["tolerance"] == 1.7
        assert record["imbalance_before"] > record["tolerance"]
        if record["feasible"]:
            assert record["imbalance_planned"] <= record["tolerance"]


def test_kill_9_of_the_controller_mid_migration_loses_nothing(
    settings: config.Settings, spark: Any
) -> None:
    killed: dict[str, Any] = {}

    def kill_mid_migration(pipeline: Pipeline) -> None:
        plane = ControlPlane(pipeline.store.client, pipeline.plan.run_id)
        deadline = time.monotonic() + 120
        while plane.current().migrating is None:
            assert time.monotonic() < deadline, "no migration started"
            time.sleep(0.02)
        pipeline.kill("control")
        killed["version"] = plane.current().migrating
        killed["phase"] = plane.migration(killed["version"]).get("phase")
        time.sleep(1.0)
        pipeline.start("control")

    outcome = run_live(plan_of("mixed", "kill"), settings, spark, during=kill_mid_migration)
    assert killed["version"] is not None and killed["phase"] == "running"
    summary = outcome.summary
    assert summary.restarts == {"control": 1}
    assert summary.verification.exact, "\n".join(summary.verification.lines())
    assert summary.records_processed == RECORDS
    versions = [int(r["version"]) for r in outcome.rebalances]
    assert killed["version"] in versions  # the restarted controller completed it
    assert versions == list(range(1, len(versions) + 1))
    assert outcome.offenders == [], (outcome.offenders[:2], outcome.rebalances, outcome.intervals)
    assert outcome.snapshots >= 20


def test_demo_with_mixed_on_a_drifting_workload_verifies(settings: config.Settings) -> None:
    """The acceptance command: ``skewer demo --scheme mixed --workload <drifting> --verify``."""
    command = [sys.executable, "-m", "pipeline.cli", "demo", "--scheme", "mixed"]
    command += ["--workload", DRIFT, "--records", "40000", "--rate", str(RATE)]
    command += ["--verify", "--json", "--quiet", "--no-start"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exact"] is True and result["records_processed"] == 40_000
    assert result["migrations"], "the controller never rebalanced the drifting stream"

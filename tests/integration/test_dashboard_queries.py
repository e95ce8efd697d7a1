"""Every PromQL query of every Grafana panel, run against a real Prometheus that scraped live runs.

Two short paced runs of the live pipeline go one after the other through the orchestrator API
(:func:`pipeline.runs.orchestrator.run_pipeline`, the code ``skewer demo`` runs): scheme ``pkg`` and
the routing-table scheme ``mixed`` (the orchestrator adds ``skewer control`` for it) on the same
drifting workload, paced to last ~20 s so that the recording rules' ``rate(...[1m])`` windows
get many samples. Every stage's exporter announces itself to the native Prometheus (the
``prometheus`` fixture) through a file_sd target file; Prometheus scrapes them every second and
evaluates the recording rules (deploy/prometheus/rules.yml).

Afterwards each panel's expression is executed through ``/api/v1/query_range`` over the runs'
time span (step 2 s), with Grafana's variables replaced the way Grafana would for the selection
"both runs, both schemes" (``$run`` -> ``id1|id2`` inside ``=~``, ``$__rate_interval`` -> 1m,
``$__interval`` -> the step, ``$__range`` -> the span). An expression passes when it parses and
returns, for every run it concerns, at least one series with a finite value, and every label
its legend shows is on its series. Queries of controller series (``skewer_controller_*``,
``skewer_migration*``, ``skewer_planning_*``) concern the ``mixed`` run only; all others both
runs. The variables' ``label_values`` queries must list the runs and schemes. One assertion per
dashboard names every failing panel, target and expression.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest
from grafana_dashboards import (
    Query,
    legend_labels,
    load_dashboards,
    metric_names,
    parse_label_values,
    queries,
    substitute,
    variable_query,
)
from live_runs import run_watched

from pipeline.io import config
from pipeline.runs.plan import RunPlan, new_run_id

pytestmark = [
    pytest.mark.integration,
    pytest.mark.native_only(
        "the native Prometheus finds the stages' exporters through file_sd; "
        "a container cannot reach them"
    ),
]

#: Fang et al.'s fluctuating hot set (4 intervals, drift relative to 8 workers) on Zipf z = 1.
WORKLOAD = "drift:mode=fluctuate,z=1.0,keys=5000,intervals=4,workers=8"
SCHEMES = ("pkg", "mixed")
RATE = 1000.0  # records per second: 20,000 records last 20 s
RECORDS = 20_000
WORKERS = 8
SOURCES = 2
STEP_SECONDS = 2
RATE_INTERVAL = "1m"
#: Series only the controller of a routing-table scheme exports.
CONTROLLER_PREFIXES = ("skewer_controller_", "skewer_migration", "skewer_planning_")


@dataclass(frozen=True)
class LiveRuns:
    """The runs Prometheus scraped and the time span the queries cover."""

    run_ids: dict[str, str]  # scheme -> run id
    start: float
    end: float

    @property
    def scheme_of(self) -> dict[str, str]:
        return {run: scheme for scheme, run in self.run_ids.items()}

    def variables(self) -> dict[str, str]:
        """Grafana's variables for the selection "every run, every scheme"."""
        span = max(1, math.ceil(self.end - self.start))
        return {
            "run": "|".join(self.run_ids.values()),
            "scheme": "|".join(self.run_ids),
            "__rate_interval": RATE_INTERVAL,
            "__interval": f"{STEP_SECONDS}s",
            "__range": f"{span}s",
            "__range_s": str(span),
        }


def prometheus_api(base: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus HTTP API answer (its JSON, also for 4xx answers that carry an error)."""
    url = f"{base}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as error:
        try:
            return dict(json.load(error))
        except ValueError:
            return {"status": "error", "error": f"HTTP {error.code}"}


@pytest.fixture(scope="module")
def live_runs(settings: config.Settings, prometheus: str) -> LiveRuns:
    """The pkg and mixed runs, one after the other, scraped by the ``prometheus`` server."""
    suffix = new_run_id()[5:]
    plans = {
        scheme: RunPlan(
            scheme=scheme,
            records=RECORDS,
            workers=WORKERS,
            sources=SOURCES,
            workload=WORKLOAD,
            rate=RATE,
            run_id=f"dash-{scheme}-{suffix}",
        )
        for scheme in SCHEMES
    }
    start = time.time()
    # One after the other: run side by side on two cores, the two took 94 s instead of ~50 and
    # no window became final while the exporters ran (no replication or watermark series).
    for plan in plans.values():
        run_watched(plan, settings)
    # The last scrapes and rule evaluations of the runs' final seconds.
    time.sleep(3)
    end = time.time()
    print(f"\ndashboard runs took {end - start:.1f} s")
    return LiveRuns({s: p.run_id for s, p in plans.items()}, start, end)


def concerned_runs(query: Query, runs: LiveRuns) -> set[str]:
    """The runs a query must show: controller series exist for the routing-table run only."""
    if any(name.startswith(CONTROLLER_PREFIXES) for name in metric_names(query.expr)):
        return {runs.run_ids["mixed"]}
    return set(runs.run_ids.values())


def check_query(query: Query, prometheus: str, runs: LiveRuns) -> str | None:
    """Why the query fails on the live runs' data, or None when it shows every run it should."""
    expr = substitute(query.expr, runs.variables())
    answer = prometheus_api(
        prometheus,
        "/api/v1/query_range",
        {"query": expr, "start": runs.start, "end": runs.end, "step": STEP_SECONDS},
    )
    if answer.get("status") != "success":
        return f"Prometheus refused it: {answer.get('error', answer)}"
    series = answer["data"]["result"]
    if not series:
        return "no series"
    shown: set[str] = set()
    for one in series:
        labels = one["metric"]
        missing = legend_labels(query.legend) - set(labels)
        if missing:
            return f"legend {query.legend!r} shows {sorted(missing)}, absent from {labels}"
        finite = any(math.isfinite(float(value)) for _, value in one["values"])
        run = labels.get("run") or runs.run_ids.get(labels.get("scheme", ""))
        if run is None:
            return f"a series without run or scheme label: {labels}"
        if finite:
            shown.add(run)
    absent = concerned_runs(query, runs) - shown
    if absent:
        schemes = sorted(runs.scheme_of[run] for run in absent)
        return f"no finite value for the {', '.join(schemes)} run ({len(series)} series)"
    return None


def test_prometheus_scraped_every_stage_of_both_runs(prometheus: str, live_runs: LiveRuns) -> None:
    """The premise of the panel checks: the exporters of both runs reached Prometheus."""
    answer = prometheus_api(
        prometheus,
        "/api/v1/series",
        {
            "match[]": [f'{{run="{run}"}}' for run in live_runs.run_ids.values()],
            "start": live_runs.start,
            "end": live_runs.end,
        },
    )
    assert answer.get("status") == "success", answer
    names_by_run: dict[str, set[str]] = {run: set() for run in live_runs.run_ids.values()}
    for labels in answer["data"]:
        names_by_run[labels["run"]].add(labels["__name__"])
    for run, names in names_by_run.items():
        stages = {
            "produce": "skewer_producer_records_total",
            "group": "skewer_grouping_routed_total",
            "work": "skewer_worker_records_total",
            "aggregate": "skewer_aggregator_windows_final_total",
        }
        missing = {stage for stage, name in stages.items() if name not in names}
        assert not missing, f"run {run}: Prometheus has nothing of {sorted(missing)}"
    assert "skewer_controller_intervals_total" in names_by_run[live_runs.run_ids["mixed"]], (
        "the mixed run's controller never reached Prometheus"
    )


@pytest.mark.parametrize("stem", ["overview", "schemes", "migrations"])
def test_every_panel_query_returns_data_for_every_run(
    stem: str, prometheus: str, live_runs: LiveRuns
) -> None:
    board = load_dashboards()[stem]
    checked = list(queries(board))
    failures = []
    for query in checked:
        reason = check_query(query, prometheus, live_runs)
        if reason is not None:
            failures.append(
                f"{query.where}: {reason}\n    {substitute(query.expr, live_runs.variables())}"
            )
    assert not failures, f"{len(failures)} of {len(checked)} queries of {stem} fail:\n" + "\n".join(
        failures
    )


@pytest.mark.parametrize("stem", ["overview", "schemes", "migrations"])
def test_the_variables_list_the_runs_and_their_schemes(
    stem: str, prometheus: str, live_runs: LiveRuns
) -> None:
    board = load_dashboards()[stem]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    # The migrations dashboard lists the runs that have a controller; the others every run.
    expected_runs = (
        {live_runs.run_ids["mixed"]} if stem == "migrations" else set(live_runs.run_ids.values())
    )
    values = live_runs.variables()
    for name, expected in (
        ("run", expected_runs),
        ("scheme", {live_runs.scheme_of[run] for run in expected_runs}),
    ):
        metric, matchers, label = parse_label_values(variable_query(variables[name]))
        answer = prometheus_api(
            prometheus,
            f"/api/v1/label/{label}/values",
            {
                "match[]": substitute(f"{metric}{matchers}", values),
                "start": live_runs.start,
                "end": live_runs.end,
            },
        )
        assert answer.get("status") == "success", answer
        assert expected <= set(answer["data"]), f"{stem}: ${name} lists {answer['data']}"

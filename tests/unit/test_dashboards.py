"""Grafana provisioning and dashboards, checked as files (no Grafana, no Prometheus).

What Grafana needs to show every panel: the dashboard JSON parses; uids are unique (Grafana
refuses a second dashboard with a uid); panel ids are unique within a dashboard; every panel
and target names a datasource the provisioning defines; every target has PromQL that reads
only series of the metrics contract (docs/metrics.md) and its recording rules, so a misspelt metric
name fails here instead of showing "No data"; the variables ``run`` and ``scheme`` are
``label_values`` queries on skewer series and are matched with ``=~`` (they are multi-value);
the provider points at where compose mounts the dashboards. Whether each query returns data
from a live run is tests/integration/test_dashboard_queries.py.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_dashboards import (
    CONTAINER_DASHBOARDS_PATH,
    DASHBOARDS_DIR,
    PROVISIONING_DIR,
    ROOT,
    dashboard_files,
    grouping_labels,
    legend_labels,
    load_dashboards,
    metric_names,
    panels,
    parse_label_values,
    queries,
    substitute,
    variable_names,
    variable_query,
)

from pipeline.observe.series import SERIES

#: The recording rules (deploy/prometheus/rules.yml) by name, with their expressions.
RECORDING_RULES = {
    rule["record"]: rule["expr"]
    for group in yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())[
        "groups"
    ]
    for rule in group["rules"]
    if "record" in rule
}


def _readable_names() -> dict[str, set[str]]:
    """Every name PromQL can read from skewer's exporters and rules -> the labels it carries.

    The series are the metrics contract as pipeline/observe/series.py defines it (:data:`SERIES`):
    counters end in ``_total``, a histogram is read as ``_bucket`` (with ``le``), ``_sum`` and
    ``_count``. A recording rule keeps the labels of its outermost ``by`` clause.
    """
    names: dict[str, set[str]] = {}
    for series in SERIES:
        labels = set(series.labelnames)
        if series.kind == "histogram":
            names[f"{series.name}_bucket"] = labels | {"le"}
            names[f"{series.name}_sum"] = names[f"{series.name}_count"] = labels
        else:
            names[series.name] = labels
    for record, expr in RECORDING_RULES.items():
        kept = grouping_labels(expr)
        assert kept is not None, f"rule {record} keeps no labels by name"
        names[record] = kept
    return names


READABLE = _readable_names()
KNOWN_NAMES = frozenset(READABLE)
#: Grafana's own variables a query may use.
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__interval", "__range", "__range_s"})
EXPECTED_UIDS = {
    "overview": "skewer-overview",
    "schemes": "skewer-schemes",
    "migrations": "skewer-migrations",
}

DASHBOARDS = load_dashboards()
ALL_QUERIES = [query for board in DASHBOARDS.values() for query in queries(board)]


def _provisioned_datasources() -> list[dict[str, Any]]:
    sources: list[dict[str, Any]] = []
    for path in sorted((PROVISIONING_DIR / "datasources").glob("*.y*ml")):
        sources.extend(yaml.safe_load(path.read_text())["datasources"])
    return sources


def _resolve_datasource(reference: Any, board: dict[str, Any]) -> tuple[str, str] | None:
    """(type, uid) a panel's or target's datasource resolves to; a ``${var}`` uid resolves
    through a datasource variable to the provisioned datasource of its type."""
    if not isinstance(reference, dict):
        return None
    uid = str(reference.get("uid", ""))
    if uid.startswith("$"):
        name = uid.strip("${}")
        variables = {v["name"]: v for v in board.get("templating", {}).get("list", [])}
        variable = variables.get(name)
        if variable is None or variable.get("type") != "datasource":
            return None
        matching = [s for s in _provisioned_datasources() if s["type"] == variable["query"]]
        return (matching[0]["type"], matching[0]["uid"]) if matching else None
    return (str(reference.get("type")), uid)


def test_the_three_dashboards_parse_with_their_uids() -> None:
    assert {path.name for path in dashboard_files()} == {
        "overview.json",
        "schemes.json",
        "migrations.json",
    }
    for path in dashboard_files():
        json.loads(path.read_text(encoding="utf-8"))  # raises for a bad file
    assert {stem: board["uid"] for stem, board in DASHBOARDS.items()} == EXPECTED_UIDS


def test_uids_and_titles_are_unique_across_dashboards() -> None:
    uids = [board["uid"] for board in DASHBOARDS.values()]
    titles = [board["title"] for board in DASHBOARDS.values()]
    assert len(set(uids)) == len(uids), uids
    assert len(set(titles)) == len(titles), titles


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_dashboard_settings(stem: str) -> None:
    board = DASHBOARDS[stem]
    assert board["schemaVersion"] == 39
    assert board["time"] == {"from": "now-15m", "to": "now"}
    assert board["refresh"] == "5s"
    assert board["title"] and board["description"]
    assert "id" not in board or board["id"] is None, "a provisioned dashboard must not pin an id"


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_panel_ids_are_unique_within_a_dashboard(stem: str) -> None:
    ids = [panel.get("id") for panel in panels(DASHBOARDS[stem])]
    assert all(isinstance(i, int) for i in ids), ids
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"{stem}: panel ids used twice: {duplicates}"


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_panels_fit_the_grid_without_overlapping(stem: str) -> None:
    boxes = []
    for panel in panels(DASHBOARDS[stem]):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert grid["y"] >= 0 and grid["h"] > 0, panel["title"]
        boxes.append((panel["title"], grid))
    for (first, a), (second, b) in itertools.combinations(boxes, 2):
        overlap = (
            a["x"] < b["x"] + b["w"]
            and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"]
            and b["y"] < a["y"] + a["h"]
        )
        assert not overlap, f"{stem}: panels {first!r} and {second!r} overlap"


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_every_panel_and_target_has_a_provisioned_datasource(stem: str) -> None:
    board = DASHBOARDS[stem]
    provisioned = {(s["type"], s["uid"]) for s in _provisioned_datasources()}
    assert provisioned == {("prometheus", "prometheus")}
    for panel in panels(board):
        if panel.get("type") == "row":
            continue
        title = panel.get("title")
        assert _resolve_datasource(panel.get("datasource"), board) in provisioned, title
        assert panel.get("targets"), f"{stem}: panel {title!r} has no query"
        for target in panel["targets"]:
            # A target without its own datasource uses the panel's, which is checked above.
            if "datasource" in target:
                assert _resolve_datasource(target["datasource"], board) in provisioned, title


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_every_panel_says_what_its_figure_means(stem: str) -> None:
    for panel in panels(DASHBOARDS[stem]):
        if panel.get("type") != "row":
            assert len(panel.get("description", "")) >= 40, f"{stem}: {panel.get('title')!r}"
            assert panel.get("title"), f"{stem}: panel {panel.get('id')} has no title"


def test_every_target_reads_only_series_of_the_metrics_contract() -> None:
    assert len(ALL_QUERIES) >= 40
    unknown: list[str] = []
    for query in ALL_QUERIES:
        assert query.expr.strip(), f"{query.where}: empty expr"
        names = metric_names(query.expr)
        assert names, f"{query.where}: no metric name in {query.expr!r}"
        unknown += [f"{query.where}: {name}" for name in sorted(names - KNOWN_NAMES)]
    assert not unknown, "names outside the metrics contract:\n" + "\n".join(unknown)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_every_expression_parses_as_promql(tmp_path: Path) -> None:
    """Prometheus' own parser (promtool checks recording rules' expressions): one rule per
    target, variables replaced as Grafana would for a two-run selection."""
    values = {"run": "r1|r2", "scheme": "pkg|mixed", "__rate_interval": "1m"}
    values |= {"__interval": "2s", "__range": "15m", "__range_s": "900"}
    rules = [
        {"record": f"dashboard:query_{n}", "expr": substitute(query.expr, values)}
        for n, query in enumerate(ALL_QUERIES)
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    errors = [
        f"{ALL_QUERIES[int(n)].where}: {line}"
        for line in checked.stderr.splitlines() + checked.stdout.splitlines()
        for n in re.findall(r'"dashboard:query_(\d+)"', line)
    ]
    assert checked.returncode == 0 and not errors, "\n".join(errors) or checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_the_name_check_catches_a_misspelt_metric() -> None:
    good = 'sum by (run) (rate(skewer_worker_records_total{run=~"$run"}[$__rate_interval]))'
    typo = good.replace("records_total", "record_total")
    assert metric_names(good) <= KNOWN_NAMES
    assert metric_names(typo) - KNOWN_NAMES == {"skewer_worker_record_total"}
    assert metric_names("skewer:imbalance_fraction:rate5m") - KNOWN_NAMES == {
        "skewer:imbalance_fraction:rate5m"
    }


def test_the_dashboards_show_the_documented_figures() -> None:
    """Every figure the dashboards are for (throughput, imbalance, latency, lag, dead letters,
    routing table, migrations) appears on the dashboard it belongs to."""
    used = {
        stem: set().union(*(metric_names(q.expr) for q in queries(board)))
        for stem, board in DASHBOARDS.items()
    }
    assert {
        "skewer:throughput:rate1m",
        "skewer_producer_records_total",
        "skewer:imbalance_fraction:rate1m",
        "skewer:load_max_over_avg:rate1m",
        "skewer_imbalance_fraction",
        "skewer_load_max_over_avg",
        "skewer:worker_load:rate1m",
        "skewer_worker_records_total",
        "skewer:latency_seconds:p50_1m",
        "skewer:latency_seconds:p99_1m",
        "skewer_worker_lag_records",
        "skewer_grouping_dead_letters_total",
        "skewer_routing_table_entries",
        "skewer_routing_table_version",
    } <= used["overview"]
    assert {
        "skewer:imbalance_fraction:rate1m",
        "skewer:load_max_over_avg:rate1m",
        "skewer:throughput:rate1m",
        "skewer:latency_seconds:p99_1m",
        "skewer_replication",
    } <= used["schemes"]
    assert {
        "skewer_migrations_total",
        "skewer_migration_in_progress",
        "skewer_migration_keys_moved_total",
        "skewer_migration_state_entries_moved_total",
        "skewer_migration_state_bytes_moved_total",
        "skewer_migration_duration_seconds_bucket",
        "skewer_migration_held_records_total",
        "skewer_controller_imbalance",
        "skewer_controller_tolerance",
        "skewer_planning_seconds_bucket",
        "skewer_controller_table_entries",
        "skewer_controller_table_version",
        "skewer_controller_intervals_total",
    } <= used["migrations"]


def test_the_scheme_comparison_groups_every_query_by_scheme() -> None:
    for query in queries(DASHBOARDS["schemes"]):
        assert grouping_labels(query.expr) == {"scheme"}, query.where
        assert "scheme" in legend_labels(query.legend), query.where


def test_the_known_names_are_the_contract_s_series_and_rules() -> None:
    assert len(SERIES) >= 35
    assert "skewer_worker_latency_seconds_bucket" in KNOWN_NAMES
    assert "skewer_worker_records_total" in KNOWN_NAMES
    assert READABLE["skewer:worker_load:rate1m"] == {"run", "scheme", "worker"}
    assert READABLE["skewer:latency_seconds:p99_1m"] == {"run", "scheme"}
    assert READABLE["skewer_grouping_dead_letters_total"] == {"run", "scheme", "source", "reason"}
    assert set(RECORDING_RULES) == {
        "skewer:worker_load:rate1m",
        "skewer:throughput:rate1m",
        "skewer:imbalance_records:rate1m",
        "skewer:imbalance_fraction:rate1m",
        "skewer:load_max_over_avg:rate1m",
        "skewer:latency_seconds:p50_1m",
        "skewer:latency_seconds:p99_1m",
    }


def test_legends_use_labels_the_query_keeps() -> None:
    """A legend label must survive the query: the outermost ``by`` clause's labels, or else
    the labels of the series the query reads (``le`` never: histogram_quantile drops it)."""
    for query in ALL_QUERIES:
        shown = legend_labels(query.legend)
        assert shown, f"{query.where}: legend {query.legend!r} names no label"
        kept = grouping_labels(query.expr)
        read = set().union(*(READABLE.get(name, set()) for name in metric_names(query.expr)))
        allowed = (read - {"le"}) if kept is None else kept
        assert shown <= allowed, f"{query.where}: legend {query.legend!r} but keeps {allowed}"


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_run_and_scheme_variables_are_label_values_of_skewer_series(stem: str) -> None:
    board = DASHBOARDS[stem]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"run", "scheme"}
    for name, variable in variables.items():
        assert variable["type"] == "query"
        assert _resolve_datasource(variable["datasource"], board) == ("prometheus", "prometheus")
        metric, _, label = parse_label_values(variable_query(variable))
        assert label == name
        assert metric in KNOWN_NAMES, f"{stem}: ${name} reads {metric}"
        assert variable["multi"] and variable["includeAll"]
        # A regex "all" value, so that =~"$run" matches every run when All is chosen.
        assert variable["allValue"] in (".*", ".+")
    # The scheme list follows the chosen runs.
    assert parse_label_values(variable_query(variables["scheme"]))[1] == '{run=~"$run"}'


def test_variables_are_defined_and_matched_as_regexes() -> None:
    """``run`` and ``scheme`` are multi-value: Grafana joins a selection with ``|``, which only
    a regex matcher (``=~``) reads as alternatives; ``="$run"`` would match no run at all."""
    for query in ALL_QUERIES:
        board = DASHBOARDS[next(s for s, b in DASHBOARDS.items() if b["uid"] == query.dashboard)]
        defined = {v["name"] for v in board["templating"]["list"]}
        assert variable_names(query.expr) <= defined | GRAFANA_BUILTINS, query.where
        for name in ("run", "scheme"):
            uses = re.findall(rf'(\w+)\s*(=~|!~|=|!=)\s*"\$\{{?{name}\}}?"', query.expr)
            assert uses, f"{query.where}: does not filter on ${name}: {query.expr}"
            assert all(label == name and op == "=~" for label, op in uses), (
                f'{query.where}: ${name} must be matched as {name}=~"${name}": {query.expr}'
            )


def test_the_datasource_is_the_compose_prometheus_with_uid_prometheus() -> None:
    [source] = _provisioned_datasources()
    assert source["uid"] == "prometheus"
    assert source["name"] == "Prometheus"
    assert (source["type"], source["url"], source["isDefault"]) == (
        "prometheus",
        "http://prometheus:9090",
        True,
    )


def test_the_dashboard_provider_points_at_the_mounted_dashboards() -> None:
    [path] = sorted((PROVISIONING_DIR / "dashboards").glob("*.y*ml"))
    provider_file = yaml.safe_load(path.read_text())
    assert provider_file["apiVersion"] == 1
    [provider] = provider_file["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == CONTAINER_DASHBOARDS_PATH


def test_compose_mounts_the_dashboards_where_the_provider_and_home_look() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {}
    for volume in grafana.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        mounts[target] = (ROOT / source).resolve()
    assert mounts.get(CONTAINER_DASHBOARDS_PATH) == DASHBOARDS_DIR.resolve()
    assert mounts.get("/etc/grafana/provisioning") == PROVISIONING_DIR.resolve()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{CONTAINER_DASHBOARDS_PATH}/overview.json"
    assert DASHBOARDS["overview"]["uid"] == "skewer-overview"

"""Grafana's dashboards (grafana/dashboards/*.json) as data, for the tests that check them.

tests/unit/test_dashboards.py (structure) and tests/integration/test_dashboard_queries.py (live
queries) read them the same way: panels flattened out of rows (:func:`panels`), PromQL targets
(:func:`queries`), the metric names an expression reads (:func:`metric_names`, from the text,
so a misspelt name is caught without a Prometheus), legend labels (:func:`legend_labels`),
Grafana's variables substituted as for a multi-value selection (:func:`substitute`), and a
template variable's ``label_values(...)`` (:func:`parse_label_values`). Examples:
    >>> expr = ('histogram_quantile(0.99, sum by (le, run) '
    ...         '(rate(skewer_worker_latency_seconds_bucket{run=~"$run"}[$__rate_interval])))')
    >>> sorted(metric_names(expr))
    ['skewer_worker_latency_seconds_bucket']
    >>> sorted(metric_names('sum by (run) (a_total{x="b c"}) or on (run) 0 * b:rule:rate1m'))
    ['a_total', 'b:rule:rate1m']
    >>> sorted(metric_names('time() - skewer_watermark_seconds offset 1m > bool 1e3'))
    ['skewer_watermark_seconds']
    >>> sorted(legend_labels('w{{worker}} {{ run }}'))
    ['run', 'worker']
    >>> substitute('rate(x{run=~"$run"}[$__rate_interval]) / ${scale}',
    ...            {"run": "r1|r2", "scale": "2", "__rate_interval": "1m"})
    'rate(x{run=~"r1|r2"}[1m]) / 2'
    >>> parse_label_values('label_values(skewer_worker_records_total{run=~"$run"}, scheme)')
    ('skewer_worker_records_total', '{run=~"$run"}', 'scheme')
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS_DIR = ROOT / "grafana" / "dashboards"
PROVISIONING_DIR = ROOT / "grafana" / "provisioning"
#: Where docker-compose.yml mounts DASHBOARDS_DIR in the Grafana container.
CONTAINER_DASHBOARDS_PATH = "/var/lib/grafana/dashboards"

#: PromQL words that look like identifiers but are not metric names.
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan"}
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_BY_CLAUSE = re.compile(r"\bby\s*\(([^)]*)\)", re.IGNORECASE)
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+", re.IGNORECASE)
_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")
#: An identifier that does not start inside a number (1e3) or another word.
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:([A-Za-z_:][\w:]*)\s*(\{.*\})?\s*,\s*)?(\w+)\s*\)\s*$"
)


@dataclass(frozen=True)
class Query:
    """One PromQL target of one panel."""

    dashboard: str  # the dashboard's uid
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    legend: str
    instant: bool

    @property
    def where(self) -> str:
        """How an assertion message names it."""
        return f"{self.dashboard} panel {self.panel_id} {self.panel_title!r} target {self.ref_id}"


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS_DIR.glob("*.json"))


def load_dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard file, parsed, by file name stem (json.JSONDecodeError for a bad one)."""
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in dashboard_files()}


def panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' nested panels (collapsed rows keep them inside) included."""
    out: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(dashboard: Mapping[str, Any]) -> Iterator[Query]:
    """Every target of every panel that is not a row."""
    for panel in panels(dashboard):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets", []):
            yield Query(
                dashboard=str(dashboard.get("uid")),
                panel_id=int(panel.get("id", -1)),
                panel_title=str(panel.get("title", "")),
                ref_id=str(target.get("refId", "?")),
                expr=str(target.get("expr", "")),
                legend=str(target.get("legendFormat", "")),
                instant=bool(target.get("instant", False)),
            )


def metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names a PromQL expression reads.

    String literals, label matchers ``{...}``, range selectors ``[...]``, grouping clauses
    (``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` with their labels),
    offsets and Grafana variables are cut out; what is left and is an identifier not followed
    by ``(`` (a function or an aggregation) and not a keyword is a metric name. Enough for the
    dashboards' PromQL (no ``@`` modifiers, no subqueries by name).
    """
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    for pattern in (_MATCHERS, _RANGES, _GROUPING, _OFFSET):
        text = pattern.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in PROMQL_KEYWORDS}


def grouping_labels(expr: str) -> set[str] | None:
    """The labels the outermost ``by (...)`` keeps (``le`` dropped: histogram_quantile eats
    it), or None when the expression has no ``by`` clause (then every label may survive)."""
    match = _BY_CLAUSE.search(_STRING.sub(" ", expr))
    if match is None:
        return None
    return {label.strip() for label in match.group(1).split(",") if label.strip()} - {"le"}


def legend_labels(legend: str) -> set[str]:
    """The labels a legend format like ``w{{worker}} {{run}}`` shows."""
    return set(_LEGEND_LABEL.findall(legend))


def variable_names(expr: str) -> set[str]:
    """Grafana variables an expression uses (``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``)."""
    return {next(g for g in groups if g) for groups in _VARIABLE.findall(expr)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every Grafana variable replaced by ``values[name]`` (KeyError names a
    variable without a value)."""

    def replace(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def parse_label_values(query: str) -> tuple[str | None, str, str]:
    """``label_values([metric[{matchers}],] label)`` -> (metric, matchers, label); ValueError
    for any other variable query."""
    match = _LABEL_VALUES.match(query)
    if match is None:
        raise ValueError(f"not a label_values(metric, label) query: {query!r}")
    metric, matchers, label = match.groups()
    return metric, matchers or "", label


def variable_query(variable: Mapping[str, Any]) -> str:
    """The query text of a template variable (Grafana 11 stores an object, older a string)."""
    query = variable.get("query", "")
    return str(query.get("query", "")) if isinstance(query, Mapping) else str(query)

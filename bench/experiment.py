"""What one paper experiment hands to ``skewer bench paper``.

Each module in :mod:`bench.experiments` defines ``run(quick: bool = False) -> ExperimentResult``.
The harness (:mod:`bench.harness`) writes ``bench/results/<name>.md`` headed by the command and
the machine, followed by ``markdown``, and saves every figure as ``<name>_<figure>.png`` next to
it. ``quick`` shrinks the experiment for tests (seconds, not minutes); the recorded results use
``quick=False``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ExperimentResult:
    #: File stem, e.g. ``"pkg_table2"``.
    name: str
    #: One-line title, e.g. ``"PKG Table II: average imbalance, WP-like and TW-like"``.
    title: str
    #: Tables (markdown) and the comparison with the paper: where ours agree, and why not.
    markdown: str
    #: matplotlib Figures by short name; the harness saves and closes them.
    figures: dict[str, Any] = field(default_factory=dict)
    #: The numbers behind the tables, for tests and for JSON export.
    data: dict[str, Any] = field(default_factory=dict)


def method_markdown(method: str) -> str:
    """A live benchmark's ``METHOD`` (what it measures, and how; reStructuredText literals) as
    the Markdown that explains its results.

    >>> method_markdown("Runs ``skewer demo``.\\n")
    'Runs `skewer demo`.'
    """
    return method.strip().replace("``", "`")


def or_dash(value: float | None, pattern: str) -> str:
    """``value`` in ``pattern`` (a format spec) for a results table, or "-" when there is none.

    >>> or_dash(1234.5, ",.0f"), or_dash(None, ",.0f")
    ('1,234', '-')
    """
    return "-" if value is None else format(value, pattern)


def ratio_or_none(value: float | None, base: float | None) -> float | None:
    """``value / base``, or None when either is missing or 0.

    >>> ratio_or_none(3.0, 2.0), ratio_or_none(None, 2.0), ratio_or_none(3.0, 0.0)
    (1.5, None, None)
    """
    return value / base if value and base else None


def ratio_or_dash(value: float | None, base: float | None) -> str:
    """``value / base`` to two places for a results table, or "-" when either is missing or 0.

    >>> ratio_or_dash(3.0, 2.0), ratio_or_dash(None, 2.0), ratio_or_dash(3.0, 0.0)
    ('1.50', '-', '-')
    """
    return or_dash(ratio_or_none(value, base), ".2f")


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the measured ``values`` (None ones left out), or None if there are none.

    >>> median_or_none([3.0, None, 1.0, 2.0]), median_or_none([None])
    (2.0, None)
    """
    measured = [value for value in values if value is not None]
    return statistics.median(measured) if measured else None

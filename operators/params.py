"""Scheme parameters from text: ``NAME=VALUE`` items, as ``--param`` and compose give them.

Every scheme's constructor takes keyword parameters (:mod:`operators.registry` checks the
names against the constructor's signature); on a command line or in an environment variable
they arrive as text, and this is the one place that turns text into typed values: the CLI
(``route``, ``sim``, ``group``, ``control``), the demo's run plan and the benchmarks all call it.
A malformed item is a :class:`~operators.base.SchemeError`, which the CLI prints as one line
with exit code 2.

Example:
    >>> parse_params(["epsilon=0.01", "probe=true", "speeds=1,2.5", "name=hot"])
    {'epsilon': 0.01, 'probe': True, 'speeds': [1, 2.5], 'name': 'hot'}
    >>> parse_params(["epsilon"])
    Traceback (most recent call last):
    ...
    operators.base.SchemeError: --param: expected NAME=VALUE, got 'epsilon'
    >>> split_assignments("z=1.2, keys=100".split(","))
    {'z': '1.2', 'keys': '100'}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from operators.base import SchemeError


def parse_value(text: str) -> Any:
    """One value: bool (true/false), int, float, a comma list of those, else the text."""
    if "," in text:
        return [parse_value(part) for part in text.split(",") if part != ""]
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def split_assignments(items: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{k: "v"}``, stripped; ValueError for a malformed or repeated name.

    The syntax every ``NAME=VALUE`` list shares: scheme parameters here, workload specs
    (:func:`producers.workloads.parse`) with values their own classes convert.
    """
    pairs: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals or not name:
            raise ValueError(f"expected NAME=VALUE, got {item.strip()!r}")
        if name in pairs:
            raise ValueError(f"parameter {name} given twice")
        pairs[name] = value.strip()
    return pairs


def parse_params(items: Iterable[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: parse_value(v)}``; SchemeError for a malformed item."""
    try:
        pairs = split_assignments(items)
    except ValueError as error:
        raise SchemeError(f"--param: {error}") from None
    return {name: parse_value(value) for name, value in pairs.items()}

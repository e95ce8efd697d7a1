"""Fixtures of tests/compose/: docker-compose.yml as written and as compose runs it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from compose_files import (
    COMPOSE_FILE,
    TEST_SECRETS,
    VariableUse,
    interpolate,
    strings,
    variable_uses,
)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """docker-compose.yml as written (YAML anchors and merge keys resolved, no interpolation)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    """The file as compose runs it with only the required secrets set: every default applies."""
    return interpolate(raw, TEST_SECRETS)


@pytest.fixture(scope="module")
def variables(raw: dict[str, Any]) -> dict[str, list[VariableUse]]:
    found: dict[str, list[VariableUse]] = {}
    for _, value in strings(raw):
        for use in variable_uses(value):
            found.setdefault(use.name, []).append(use)
    return found

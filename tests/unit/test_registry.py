"""The registry: every name constructs, unknown names and parameters fail with useful errors."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from operators import registry
from operators.base import Scheme, SchemeError
from operators.keys import KeyBatch

ALL_NAMES = [
    "key",
    "shuffle",
    "pkg",
    "pkg-global",
    "pkg-probing",
    "potc",
    "greedy-online",
    "greedy-offline",
    "d-choices",
    "w-choices",
    "fish",
    "consistent",
    "scan",
    "redist",
    "readj",
    "llfd",
    "mintable",
    "minmig",
    "mixed",
]


def test_names_are_the_nineteen_of_design_md() -> None:
    assert registry.names() == ALL_NAMES
    assert registry.SIMULATOR_ONLY.issubset(ALL_NAMES)


def test_unknown_scheme_lists_every_valid_name() -> None:
    with pytest.raises(SchemeError) as error:
        registry.create("pkgg", n_workers=4)
    message = str(error.value)
    assert message.startswith("unknown scheme 'pkgg'; valid schemes: ")
    assert message.split("valid schemes: ")[1].split(", ") == ALL_NAMES
    assert "\n" not in message
    with pytest.raises(SchemeError, match="unknown scheme"):
        registry.scheme_class("")


@pytest.mark.parametrize("n_workers", [0, -3])
def test_fewer_than_one_worker_is_an_error(n_workers: int) -> None:
    with pytest.raises(SchemeError, match=r"pkg: number of workers must be >= 1"):
        registry.create("pkg", n_workers=n_workers)


@pytest.mark.parametrize(("source", "n_sources"), [(2, 2), (-1, 3), (0, 0)])
def test_source_outside_the_sources_is_an_error(source: int, n_sources: int) -> None:
    with pytest.raises(SchemeError, match="source"):
        registry.create("key", 3, source=source, n_sources=n_sources)


def test_unknown_parameter_names_the_valid_ones() -> None:
    with pytest.raises(SchemeError) as error:
        registry.create("pkg-probing", 4, probe_intervall=3)
    assert str(error.value) == (
        "pkg-probing: unknown parameter(s) probe_intervall; valid: probe_interval"
    )
    with pytest.raises(SchemeError, match=r"key: unknown parameter\(s\) a, b; valid: none"):
        registry.create("key", 4, b=1, a=2)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_name_constructs_and_routes(name: str) -> None:
    cls = registry.scheme_class(name)
    assert issubclass(cls, Scheme)
    assert cls.name == name
    assert isinstance(cls.keeps_key_on_one_worker, bool)
    # Scheme-specific parameters are keyword-only with defaults, so `create` can list them.
    for parameter in registry.parameters(cls).values():
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default is not inspect.Parameter.empty, parameter.name
    scheme = registry.create(name, 5, source=1, n_sources=3, seed=7)
    assert (scheme.n_workers, scheme.source, scheme.n_sources, scheme.seed) == (5, 1, 3, 7)
    keys = KeyBatch.from_ints(np.arange(200) % 17)
    if hasattr(scheme, "prepare"):
        scheme.prepare(keys)
    workers = scheme.route(keys)
    assert workers.dtype == np.int32 and workers.shape == (200,)
    assert workers.min() >= 0 and workers.max() < 5
    params = scheme.params()
    assert params["n_workers"] == 5 and "name" not in params


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_name_is_deterministic_for_a_seed(name: str) -> None:
    keys = KeyBatch.from_ints((np.arange(3000) ** 2) % 101)
    runs = []
    for _ in range(2):
        scheme = registry.create(name, 7, seed=3)
        if hasattr(scheme, "prepare"):
            scheme.prepare(keys)
        runs.append(scheme.route(keys).tolist())
    assert runs[0] == runs[1]

"""Every scheme by name: the one place that maps a name to its class.

Example:
    >>> from operators import registry
    >>> "pkg" in registry.names()
    True
    >>> registry.create("nope", n_workers=2)
    Traceback (most recent call last):
    ...
    operators.base.SchemeError: unknown scheme 'nope'; valid schemes: ...
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from operators.base import Scheme, SchemeError

#: name -> "module:Class". Modules load lazily so that naming one scheme compiles only it.
_SCHEMES: dict[str, str] = {
    "key": "operators.schemes.hashing:KeyGrouping",
    "shuffle": "operators.schemes.hashing:ShuffleGrouping",
    "pkg": "operators.schemes.pkg:PartialKeyGrouping",
    "pkg-global": "operators.schemes.pkg:GlobalPartialKeyGrouping",
    "pkg-probing": "operators.schemes.pkg:ProbingPartialKeyGrouping",
    "potc": "operators.schemes.potc:StaticPowerOfTwoChoices",
    "greedy-online": "operators.schemes.greedy:OnlineGreedy",
    "greedy-offline": "operators.schemes.greedy:OfflineGreedy",
    "d-choices": "operators.schemes.choices:DChoices",
    "w-choices": "operators.schemes.choices:WChoices",
    "fish": "operators.schemes.fish:Fish",
    "consistent": "operators.schemes.consistent:ConsistentHashing",
    "scan": "operators.schemes.gedik:Scan",
    "redist": "operators.schemes.gedik:Redist",
    "readj": "operators.schemes.gedik:Readj",
    "llfd": "operators.schemes.fang:Llfd",
    "mintable": "operators.schemes.fang:MinTable",
    "minmig": "operators.schemes.fang:MinMig",
    "mixed": "operators.schemes.fang:Mixed",
}

#: Schemes that only make sense in the simulator (they read global state no source has).
SIMULATOR_ONLY = frozenset({"pkg-global", "pkg-probing", "greedy-offline"})


def names() -> list[str]:
    return list(_SCHEMES)


def scheme_class(name: str) -> type[Scheme]:
    try:
        target = _SCHEMES[name]
    except KeyError:
        raise SchemeError(
            f"unknown scheme {name!r}; valid schemes: {', '.join(_SCHEMES)}"
        ) from None
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def parameters(cls: type[Scheme]) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``cls(n_workers, **params)`` takes, by name.

    A constructor lists the keyword-only parameters it adds and forwards the rest as
    ``**base`` to its parent's, so the parameters are collected along the MRO through every
    constructor that forwards ``**kwargs``, down to :class:`~operators.base.Scheme`'s
    (``source``, ``n_sources``, ``seed``). A subclass that must not offer a parameter of its
    parent's (W-Choices and D-Choices' ``epsilon``) keeps it out of the parent they share.

    >>> sorted(parameters(scheme_class("mixed")))[:4]
    ['beta', 'max_table_size', 'max_trials', 'n_sources']
    >>> "epsilon" in parameters(scheme_class("w-choices"))
    False
    """
    found: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        signature = inspect.signature(init).parameters.values()
        for parameter in signature:
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
                found.setdefault(parameter.name, parameter)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature):
            break
    return found


def create(
    name: str,
    n_workers: int,
    *,
    source: int = 0,
    n_sources: int = 1,
    seed: int = 0,
    **params: Any,
) -> Scheme:
    """A scheme object for one source; unknown parameters are an error naming the valid ones."""
    cls = scheme_class(name)
    accepted = set(parameters(cls))
    unknown = sorted(set(params) - accepted)
    if unknown:
        valid = ", ".join(sorted(accepted - {"source", "n_sources", "seed"})) or "none"
        raise SchemeError(f"{name}: unknown parameter(s) {', '.join(unknown)}; valid: {valid}")
    return cls(n_workers, source=source, n_sources=n_sources, seed=seed, **params)

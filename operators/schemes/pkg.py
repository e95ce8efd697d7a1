"""Partial Key Grouping (PKG): two candidates per key, the least loaded by this source wins.

Layer: operators. Nasir et al., "The Power of Both Choices: Practical Load Balancing for
Distributed Stream Processing Engines", ICDE 2015, §III ("key splitting" + "local load
estimation"). Candidates are ``|h13(k)| mod W`` and ``|h17(k)| mod W`` (MurmurHash3 x64 128,
first 64 bits, as Storm's original ``PartialKeyGrouping``); ties go to the first; loads are the
records this source sent, never decayed. ``pkg-global`` (the paper's G) routes with the true
loads and ``pkg-probing`` (LP) resets the estimate from them every ``probe_interval`` records.
The hash definition, what a probe replaces and why: docs/schemes.md#pkg.

Example:
    >>> from operators.keys import KeyBatch
    >>> pkg = PartialKeyGrouping(6)
    >>> pkg.candidates(KeyBatch.from_strings(["key1"])).tolist()
    [[4, 1]]
    >>> pkg.route(KeyBatch.from_strings(["key1", "key1", "key1"])).tolist()
    [4, 1, 4]
    >>> pkg.load_estimate.tolist()
    [0.0, 1.0, 0.0, 0.0, 2.0, 0.0]
"""

from __future__ import annotations

from typing import Any, ClassVar

import numba
import numpy as np

from operators.base import Scheme, SchemeError
from operators.keys import KeyBatch, abs_mod, choice_from_hash, mod_constants
from operators.schemes.hashing import FIRST_SEED, SECOND_SEED

#: Records of the whole stream between probes for ``pkg-probing``: one minute of WP (see above).
DEFAULT_PROBE_INTERVAL = 15_000


@numba.njit(cache=True)
def route_two_choices(
    first_hashes: np.ndarray,
    second_hashes: np.ndarray,
    n_workers: int,
    loads: np.ndarray,
    increment: int,
) -> np.ndarray:
    """Per record, the less loaded of ``|h1| mod W`` and ``|h2| mod W`` (ties to the first);
    adds ``increment`` to the chosen worker's entry of ``loads`` (in place), in record order."""
    two32_mod, inverse = mod_constants(n_workers)
    out = np.empty(first_hashes.shape[0], dtype=np.int32)
    for i in range(first_hashes.shape[0]):
        chosen = abs_mod(first_hashes[i], n_workers, two32_mod, inverse)
        second = abs_mod(second_hashes[i], n_workers, two32_mod, inverse)
        if loads[second] < loads[chosen]:
            chosen = second
        loads[chosen] += increment
        out[i] = chosen
    return out


class PartialKeyGrouping(Scheme):
    """PKG with local load estimation (the paper's L; Storm's ``partialKeyGrouping``)."""

    name = "pkg"
    keeps_key_on_one_worker = False
    #: Set by ``pkg-probing``; the simulator probes only schemes that set it.
    probe_interval: int | None = None

    def __init__(self, n_workers: int, **base: Any) -> None:
        super().__init__(n_workers, **base)
        #: The load estimate, in units of ``1 / _increment`` records.
        self._estimate = np.zeros(self.n_workers, dtype=np.int64)
        self._increment = 1

    @property
    def load_estimate(self) -> np.ndarray:
        """This source's estimate of each worker's load, in records."""
        return self._estimate / self._increment

    def candidates(self, keys: KeyBatch) -> np.ndarray:
        """``(n, 2)`` int32: each key's first and second candidate worker (h13, h17)."""
        first, second = keys.hash64_pair(FIRST_SEED, SECOND_SEED)
        return np.column_stack(
            [choice_from_hash(first, self.n_workers), choice_from_hash(second, self.n_workers)]
        )

    def route(self, keys: KeyBatch) -> np.ndarray:
        first, second = keys.hash64_pair(FIRST_SEED, SECOND_SEED)
        return route_two_choices(first, second, self.n_workers, self._estimate, self._increment)


class GlobalPartialKeyGrouping(PartialKeyGrouping):
    """PKG with the true global loads (the paper's G); only meaningful in the simulator, which
    routes the whole interleaved stream through this one object."""

    name = "pkg-global"
    global_estimation: ClassVar[bool] = True


class ProbingPartialKeyGrouping(PartialKeyGrouping):
    """PKG with local estimation reset to this source's share of the true loads at every probe
    (the paper's LP; see the module docstring for exactly what a probe replaces).

    Args:
        probe_interval: records of the whole stream between probes (paper: T_p = 1 minute).
    """

    name = "pkg-probing"

    def __init__(
        self, n_workers: int, *, probe_interval: int = DEFAULT_PROBE_INTERVAL, **base: Any
    ) -> None:
        super().__init__(n_workers, **base)
        if int(probe_interval) < 1:
            raise SchemeError(f"{self.name}: probe_interval must be >= 1, got {probe_interval}")
        self.probe_interval = int(probe_interval)
        # Units of 1/S record, so that "true loads / S" is stored without rounding.
        self._increment = self.n_sources

    def observe_global_loads(self, loads: np.ndarray) -> None:
        loads = np.asarray(loads)
        if loads.shape != (self.n_workers,):
            raise ValueError(f"expected {self.n_workers} worker loads, got shape {loads.shape}")
        self._estimate = np.rint(loads).astype(np.int64)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "probe_interval": self.probe_interval}

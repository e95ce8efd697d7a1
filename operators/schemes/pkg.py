"""Partial Key Grouping (PKG): "The Power of Both Choices", Nasir et al., ICDE 2015, §III.

Every key has two candidate workers, and each record goes to whichever of the two this source
has loaded least so far ("key splitting" + "local load estimation", §III-A/B). Routing splits
in two as in Storm's ``PartialKeyGrouping``:

* *which candidates*: ``|h13(k)| mod W`` and ``|h17(k)| mod W``, with ``h_s`` the first 64 bits
  of MurmurHash3 x64 128 of the key bytes with seed ``s`` (Storm's original code and the
  authors' ``gdfm/partial-key-grouping``; the paper names no hash, pkg.md §8). When both
  hashes pick the same worker the key simply has one worker, as in that code.
* *which of them*: the candidate with the smaller load estimate, ties to the first candidate
  (Storm's ``BalancedTargetSelector``, :func:`operators.selection.least_loaded`); the estimate
  is the count of records this source sent to each worker, cumulative and never decayed.

The hot loop fuses both steps into one compiled pass over the two hash arrays (a 64-bit
division per candidate would cost more than everything else; see
:func:`operators.keys.abs_mod`). It makes exactly the decisions of
``least_loaded(column_stack([choice_from_hash(h13, W), choice_from_hash(h17, W)]), loads)``,
and a batch gives the decisions of one-record-at-a-time routing.

Variants (§III-B, §V-B Q2), all with the same candidates:

* ``pkg`` (paper: L, "local estimation"): each source counts only its own records.
* ``pkg-global`` (paper: G): the loads are the true global loads. In the simulator that is
  literally one object routing the whole interleaved stream (``global_estimation = True``).
* ``pkg-probing`` (paper: LP, "periodic probing of worker load every T_p minutes ... the local
  estimate vector is set to the actual load of the workers"): every ``probe_interval`` records
  of the whole stream the simulator hands every source the true loads. What the probe
  replaces, exactly: the source's whole estimate becomes ``true_loads / S`` -- its 1/S share
  of the true loads -- and each of its own records then adds 1 as before. At the probe instant
  this makes the same choice as the paper's "set to the actual load" (comparing two workers is
  unaffected by scaling), and it is what the authors' simulator does
  (``localworkload[j][i] = workload[i] / numSources`` in streamLoadBalancing's
  ``LBPoTCLocalProbing``). Without the 1/S every one of the S sources would fill a gap seen in
  the true loads by itself, overshooting it S times. We keep the share exact (no rounding) by
  counting in units of 1/S record: the probe stores ``true_loads`` and each own record adds
  ``S``. The paper probes every ``T_p = 1`` minute (L5P1); by default we probe every
  15,000 records, about one minute of the WP trace (22M messages in one day, Table I: 22e6 /
  1440 = 15,278 per minute).

``seed`` does not change PKG: its hash seeds are fixed (13 and 17) so that decisions compare
one to one with Storm's.

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

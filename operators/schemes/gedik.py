"""Gedik's partitioning functions: ``scan``, ``redist`` and ``readj`` (Gedik, VLDBJ 2014).

A partitioning function is a pair ``p = <H_p, H_c>`` (§4.1, Alg. 1): an explicit hash ``H_p``
for the keys of frequency ``>= delta`` (a :class:`~operators.base.RoutingTable`), looked up
first, and a consistent hash ``H_c`` (:class:`~operators.ring.HashRing`, 1000 replicas per
channel as in §5.5) for every other key. Each source tracks frequencies with lossy counting
(:mod:`operators.sketches.lossy_counting`); :meth:`plan` builds ``p^(t+1)`` from ``p^(t)`` and the
merged statistics with one of three greedy heuristics (§4.2) that minimise a utility ``U(rho,
gamma)`` of the balance penalty ``rho`` (Eqs. 19-20) and the migration penalty ``gamma``
(Eq. 18):

- ``scan`` (Alg. 2): keys by decreasing frequency, each on the channel of lowest ``U``;
- ``redist`` (Alg. 3): at every step the (unplaced key, channel) of lowest ``U / f``;
- ``readj`` (Alg. 4): keys start where ``p^(t)`` had them; then the move or swap that lowers
  ``rho`` with the best gain ``(U - U') / |f(d1) - f(d2)|`` is applied, until none lowers it.

**Changing the number of channels.** ``plan(stats, n_workers=N)`` plans for ``N`` channels
(default: the current number); ``resize(N, plan.table)`` then switches ring and table together,
so no key is ever routed to a channel that is gone. ``install(table)`` adopts a plan with the
same number of channels (what the simulator's controller does).

**What a Plan reports.** ``moved_keys``: every key the planner can name (the statistics' keys and
the old table's keys) whose channel differs between ``p^(t)`` and ``p^(t+1)``, including keys
only on the ring whose owner changed because of a resize. Migration counts *all* moved state,
as the paper's ``m`` does: the named keys exactly, plus the untracked keys on ring arcs whose
owner changes, estimated by spreading the untracked mass over a channel's arc as consistent
hashing spreads key counts (the live controller finds those keys by re-routing the state it
holds with :meth:`lookup`). ``migration_cost`` is that in measured state (``state_size``,
records for our statistics), the unit every TableScheme reports; ``details`` has it in the
paper's units: ``M`` (Eq. 9) and ``m`` (Eq. 12), plus ``rho``, ``gamma``, ``b`` (Eq. 11 over
the non-constant resources, estimated the same way), ``b_k``, ``delta``, ``theta``,
``tracked`` and ``n_workers``. ``feasible`` is ``r_k <= alpha`` for those resources.

Choices where the paper is ambiguous (see also ../shared/notes/gedik.md §5.4):

1. Loads (§3.1): a key adds ``beta_k(f)`` to resource ``k`` of its channel for every ``k``,
   i.e. ``L_k(i) = sum beta_k(f(d))``. Eq. 3's extra factor ``f`` is dropped: only this
   reading fits Eq. 17 (a constant resource's mean load is ``|D|/N``, a linear one's ``1/N``),
   §4.4 (constant resources "balance for free") and the toy example (loads 39/35 = sum f^2).
2. ``rho`` is the geometric mean over the *non-constant* resources only (§4.4), exponent 1/K;
   with the default LCL it is ``rho_n`` (``rho_s`` equals it). ``rho = 0`` for an empty map.
3. ``gamma`` follows Eq. 18 in all three algorithms: numerator over ``D_o`` (keys no longer
   tracked that the new ring moves) plus moved map entries, denominator over ``D_a``; the
   pseudo-code's ``D_p``/``D_n`` variants are read as typos (the §4.2.2 prose says ``D_a``).
4. ``delta`` (Eq. 17) = min over resources; ``D_p^(t+1)`` is what lossy counting returns for
   it, ``f >= delta - epsilon`` (§4.1.2). ``epsilon`` defaults to ``delta/10`` at the channel
   count the scheme is built with (Manku–Motwani's rule; the paper's "0.1" cannot be absolute):
   pass it explicitly when you will plan for more channels. Quadratic resources need
   ``domain_size`` (``|D|`` in Eq. 17) and use the §4.1.3 post-filter
   ``delta'_k = sqrt(sigma theta_k Lhat_k / N)`` with ``Lhat_k`` the paper's predicted total
   ``sum_I f^2 + (|D|-|I|) ((1 - sum_I f)/(|D|-|I|))^2``.
5. One channel: ``theta = 0`` (Eq. 15) and nothing can be imbalanced, so the map is empty.
   ``alpha`` must exceed 1 (``alpha = 1`` makes every imbalance infinitely bad).
6. Redist: the chosen key's own old channel decides its migration (the pseudo-code reuses the
   last candidate's ``h``). Readj, as Alg. 4 reads with ``g <- -inf`` and as §4.2.4 says ("only
   considers readjustments that reduce the imbalance, and only uses the utility function for
   picking the best among those"): every readjustment that strictly lowers ``rho`` competes,
   the best gain ``(U - U') / |f(d1) - f(d2)|`` wins even when negative, and the search stops
   when none lowers ``rho``. The gain's baseline is the current ``U`` (the pseudo-code's
   ``u <- 0`` is a typo). Requiring ``U' < U`` as well stalls on the flat ``max - min`` of
   Eq. 19 and loses the paper's "readj balances best" result (we measured both). A key moves at
   most ``move_limit`` times (``c = 5``, §4.2.4); keys on channels a shrink removed start on the
   new ring. Equal-frequency swaps never lower ``rho``, so the gain never divides by zero.
7. Keys the statistics no longer report but the old map held have ``f = 0``.
8. ``statistics(reset=True)`` clears the counter when ``window`` is None (the statistics cover
   one controller interval, like the other table schemes); with ``window=W`` the sliding
   emulation (3 counters) is the recency mechanism and is never cleared.
9. Utilities (§4.3): ``A``, ``APM`` (default), ``APLM``, ``ATM``, ``ATLM``; ``log`` is natural.
   Ties go to the lower channel and to the more frequent key (then the lower key id).

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> scheme = Redist(2, epsilon=0.001, replicas=100)
    >>> keys = KeyBatch.from_ints(np.array([1] * 50 + [2] * 30 + list(range(3, 23)), np.int64))
    >>> _ = scheme.route(keys)
    >>> plan = scheme.plan(scheme.statistics(), n_workers=3)
    >>> len(plan.table), plan.details["n_workers"], plan.feasible
    (22, 3, False)
    >>> scheme.resize(3, plan.table)
    >>> sorted(set(scheme.route(keys).tolist()))
    [0, 1, 2]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numba
import numpy as np

from operators.base import KeyStatistics, Plan, RoutingTable, SchemeError, TableScheme
from operators.keys import KeyBatch
from operators.ring import HashRing
from operators.sketches.lossy_counting import LossyCounter, SlidingLossyCounter

#: Utility functions of §4.3, in the order of their numba codes.
UTILITIES = ("A", "APM", "APLM", "ATM", "ATLM")
#: Resource functions beta: Constant (1), Linear (x), Quadratic (x^2).
RESOURCE_FUNCTIONS = "CLQ"
#: Ring positions sampled to estimate arc shares (untracked load, its migration on a resize).
_ARC_SAMPLES = 1 << 16


def imbalance_allowance(alpha: float, n_workers: int) -> float:
    """theta_k of Eq. 15: the allowed deviation from the mean load, as a fraction of it."""
    if n_workers <= 1:
        return 0.0
    return (alpha - 1.0) / (1.0 + alpha / (n_workers - 1))


def resource_load(frequency: np.ndarray, kind: str) -> np.ndarray:
    """beta(f) for a resource function ``"C"``, ``"L"`` or ``"Q"`` (§3.1)."""
    frequency = np.asarray(frequency, dtype=np.float64)
    if kind == "C":
        return np.ones_like(frequency)
    if kind == "L":
        return frequency.copy()
    return frequency * frequency


# --- compiled construction kernels -------------------------------------------------------------
# loads[k, i] is resource k's load on channel i from the keys already in the explicit map;
# top/bottom hold each resource's three largest/smallest loads (values, channels) so that the
# balance penalty after changing one or two channels costs O(1) instead of O(N).


@numba.njit(cache=True)
def _keep_three(
    values: np.ndarray, index: np.ndarray, k: int, v: float, i: int, sign: float
) -> None:
    """Insert channel ``i``'s load ``v`` into row ``k`` of the three most extreme loads, kept in
    order: the largest for ``sign`` 1, the smallest for -1 (ties keep the earlier channel)."""
    if sign * v > sign * values[k, 2]:
        if sign * v > sign * values[k, 1]:
            values[k, 2] = values[k, 1]
            index[k, 2] = index[k, 1]
            if sign * v > sign * values[k, 0]:
                values[k, 1] = values[k, 0]
                index[k, 1] = index[k, 0]
                values[k, 0] = v
                index[k, 0] = i
            else:
                values[k, 1] = v
                index[k, 1] = i
        else:
            values[k, 2] = v
            index[k, 2] = i


@numba.njit(cache=True)
def _extremes(
    loads: np.ndarray,
    top_val: np.ndarray,
    top_idx: np.ndarray,
    bot_val: np.ndarray,
    bot_idx: np.ndarray,
) -> None:
    n_resources, n_channels = loads.shape
    for k in range(n_resources):
        for r in range(3):
            top_val[k, r] = -np.inf
            top_idx[k, r] = -1
            bot_val[k, r] = np.inf
            bot_idx[k, r] = -1
        for i in range(n_channels):
            _keep_three(top_val, top_idx, k, loads[k, i], i, 1.0)
            _keep_three(bot_val, bot_idx, k, loads[k, i], i, -1.0)


@numba.njit(cache=True)
def _rho_after(
    loads: np.ndarray,
    totals: np.ndarray,
    theta: float,
    top_val: np.ndarray,
    top_idx: np.ndarray,
    bot_val: np.ndarray,
    bot_idx: np.ndarray,
    c1: int,
    delta1: np.ndarray,
    c2: int,
    delta2: np.ndarray,
) -> float:
    """rho (Eqs. 19-20) after adding ``delta1`` to channel ``c1`` and ``delta2`` to ``c2``.

    ``c2 = -1`` changes one channel only. Extremes must describe ``loads``.
    """
    n_resources, n_channels = loads.shape
    product = 1.0
    for k in range(n_resources):
        hi = -np.inf
        lo = np.inf
        for r in range(3):
            idx = top_idx[k, r]
            if idx >= 0 and idx != c1 and idx != c2:
                hi = top_val[k, r]
                break
        for r in range(3):
            idx = bot_idx[k, r]
            if idx >= 0 and idx != c1 and idx != c2:
                lo = bot_val[k, r]
                break
        v1 = loads[k, c1] + delta1[k]
        hi = max(hi, v1)
        lo = min(lo, v1)
        total = totals[k] + delta1[k]
        if c2 >= 0:
            v2 = loads[k, c2] + delta2[k]
            hi = max(hi, v2)
            lo = min(lo, v2)
            total = totals[k] + (delta1[k] + delta2[k])
        spread = hi - lo
        if total <= 0.0 or spread <= 0.0:
            return 0.0
        product *= spread / (theta * total / n_channels)
    if n_resources == 1:
        return product
    return product ** (1.0 / n_resources)


@numba.njit(cache=True)
def _utility(code: int, rho: float, gamma: float) -> float:
    if code == 0:
        return rho
    if code == 1:
        return rho + gamma
    if code == 2:
        return rho + math.log1p(gamma)
    if code == 3:
        return rho * (1.0 + gamma)
    return rho * (1.0 + math.log1p(gamma))


@numba.njit(cache=True)
def _workspace(
    n_resources: int, n_channels: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Zeroed per-channel ``loads`` and ``totals``, and the buffers :func:`_extremes` fills."""
    return (
        np.zeros((n_resources, n_channels)),
        np.zeros(n_resources),
        np.empty((n_resources, 3)),
        np.empty((n_resources, 3), dtype=np.int64),
        np.empty((n_resources, 3)),
        np.empty((n_resources, 3), dtype=np.int64),
    )


@numba.njit(cache=True)
def _place(loads: np.ndarray, totals: np.ndarray, row: np.ndarray, channel: int) -> None:
    """Add one item's resource vector ``row`` to ``channel``."""
    for k in range(row.shape[0]):
        loads[k, channel] += row[k]
        totals[k] += row[k]


@numba.njit(cache=True)
def _best_channel(
    loads: np.ndarray,
    totals: np.ndarray,
    theta: float,
    top_val: np.ndarray,
    top_idx: np.ndarray,
    bot_val: np.ndarray,
    bot_idx: np.ndarray,
    row: np.ndarray,
    home: int,
    cost: float,
    m: float,
    m_bar: float,
    n_channels: int,
    utility: int,
    unused: np.ndarray,
) -> tuple[float, int, float]:
    """(utility, channel, rho) of the best channel for one unplaced item (ties: lowest channel);
    leaving its ``home`` channel adds its ``cost`` to the migration."""
    best_u = np.inf
    best_l = 0
    best_rho = 0.0
    for channel in range(n_channels):
        a = _rho_after(
            loads, totals, theta, top_val, top_idx, bot_val, bot_idx, channel, row, -1, unused
        )
        moved = cost if channel != home else 0.0
        u = _utility(utility, a, (m + moved) / m_bar)
        if u < best_u:
            best_u, best_l, best_rho = u, channel, a
    return best_u, best_l, best_rho


@numba.njit(cache=True)
def _scan(
    ell: np.ndarray,
    theta: float,
    cost: np.ndarray,
    home: np.ndarray,
    m0: float,
    m_bar: float,
    n_channels: int,
    utility: int,
) -> tuple[np.ndarray, float, float]:
    n_items, n_resources = ell.shape
    loads, totals, top_val, top_idx, bot_val, bot_idx = _workspace(n_resources, n_channels)
    unused = np.zeros(n_resources)
    assign = np.empty(n_items, dtype=np.int32)
    m = m0
    rho = 0.0
    for d in range(n_items):
        _extremes(loads, top_val, top_idx, bot_val, bot_idx)
        _, best_l, rho = _best_channel(
            loads, totals, theta, top_val, top_idx, bot_val, bot_idx,
            ell[d], home[d], cost[d], m, m_bar, n_channels, utility, unused,
        )  # fmt: skip
        assign[d] = best_l
        if best_l != home[d]:
            m += cost[d]
        _place(loads, totals, ell[d], best_l)
    return assign, m, rho


@numba.njit(cache=True)
def _redist(
    ell: np.ndarray,
    theta: float,
    cost: np.ndarray,
    frequency: np.ndarray,
    home: np.ndarray,
    m0: float,
    m_bar: float,
    n_channels: int,
    utility: int,
) -> tuple[np.ndarray, float, float]:
    n_items, n_resources = ell.shape
    loads, totals, top_val, top_idx, bot_val, bot_idx = _workspace(n_resources, n_channels)
    unused = np.zeros(n_resources)
    assign = np.full(n_items, -1, dtype=np.int32)
    m = m0
    rho = 0.0
    for _step in range(n_items):
        _extremes(loads, top_val, top_idx, bot_val, bot_idx)
        best_u = np.inf
        best_d = -1
        best_l = 0
        best_rho = 0.0
        for c in range(n_items):
            if assign[c] >= 0:
                continue
            u, channel, a = _best_channel(
                loads, totals, theta, top_val, top_idx, bot_val, bot_idx,
                ell[c], home[c], cost[c], m, m_bar, n_channels, utility, unused,
            )  # fmt: skip
            # Dividing by the key's frequency ranks keys; a channel's rank among one key's
            # channels is the same as without it.
            u = u / frequency[c]
            if u < best_u:
                best_u, best_d, best_l, best_rho = u, c, channel, a
        assign[best_d] = best_l
        if best_l != home[best_d]:
            m += cost[best_d]
        _place(loads, totals, ell[best_d], best_l)
        rho = best_rho
    return assign, m, rho


@numba.njit(cache=True)
def _relocation_cost(cost: np.ndarray, home: np.ndarray, d: int, source: int, target: int) -> float:
    """Eq. 22 for one key: leaving its old channel costs its state, returning home refunds it."""
    leaves = 1.0 if home[d] == source else 0.0
    returns = 1.0 if home[d] == target else 0.0
    return cost[d] * (leaves - returns)


@numba.njit(cache=True)
def _readj(
    ell: np.ndarray,
    theta: float,
    cost: np.ndarray,
    frequency: np.ndarray,
    home: np.ndarray,
    start: np.ndarray,
    m0: float,
    m_bar: float,
    n_channels: int,
    utility: int,
    move_limit: int,
) -> tuple[np.ndarray, float, float]:
    n_items, n_resources = ell.shape
    assign = start.copy()
    loads, totals, top_val, top_idx, bot_val, bot_idx = _workspace(n_resources, n_channels)
    m = m0
    for d in range(n_items):
        _place(loads, totals, ell[d], assign[d])
        if assign[d] != home[d]:
            m += cost[d]
    delta1 = np.zeros(n_resources)
    delta2 = np.zeros(n_resources)
    still = np.zeros(n_resources)
    moves = np.zeros(n_items, dtype=np.int64)
    critical = np.zeros(n_channels, dtype=np.bool_)
    while True:
        _extremes(loads, top_val, top_idx, bot_val, bot_idx)
        rho_now = _rho_after(
            loads, totals, theta, top_val, top_idx, bot_val, bot_idx, 0, still, -1, still
        )
        # A readjustment that touches no channel holding some resource's max or min cannot
        # shrink any max - min, so it cannot lower rho: skipping it changes no decision.
        for c in range(n_channels):
            critical[c] = False
            for k in range(n_resources):
                if loads[k, c] == top_val[k, 0] or loads[k, c] == bot_val[k, 0]:
                    critical[c] = True
        u_now = _utility(utility, rho_now, m / m_bar)
        best_gain = -np.inf
        best_d1 = -1
        best_d2 = -1
        best_j = -1
        best_mig = 0.0
        for d1 in range(n_items):
            if moves[d1] >= move_limit:
                continue
            i = assign[d1]
            for k in range(n_resources):
                delta1[k] = -ell[d1, k]
                delta2[k] = ell[d1, k]
            for j in range(n_channels):
                if j == i or not (critical[i] or critical[j]):
                    continue
                a = _rho_after(
                    loads, totals, theta, top_val, top_idx, bot_val, bot_idx, i, delta1, j, delta2
                )
                if a >= rho_now:
                    continue
                mig = _relocation_cost(cost, home, d1, i, j)
                gain = (u_now - _utility(utility, a, (m + mig) / m_bar)) / frequency[d1]
                if gain > best_gain:
                    best_gain, best_d1, best_d2, best_j, best_mig = gain, d1, -1, j, mig
            for d2 in range(d1 + 1, n_items):
                j = assign[d2]
                if j == i or not (critical[i] or critical[j]):
                    continue
                if moves[d2] >= move_limit or frequency[d1] == frequency[d2]:
                    continue
                for k in range(n_resources):
                    delta1[k] = ell[d2, k] - ell[d1, k]
                    delta2[k] = ell[d1, k] - ell[d2, k]
                a = _rho_after(
                    loads, totals, theta, top_val, top_idx, bot_val, bot_idx, i, delta1, j, delta2
                )
                if a >= rho_now:
                    continue
                mig = _relocation_cost(cost, home, d1, i, j) + _relocation_cost(
                    cost, home, d2, j, i
                )
                gain = (u_now - _utility(utility, a, (m + mig) / m_bar)) / abs(
                    frequency[d1] - frequency[d2]
                )
                if gain > best_gain:
                    best_gain, best_d1, best_d2, best_j, best_mig = gain, d1, d2, j, mig
        if best_d1 < 0:
            return assign, m, rho_now
        i = assign[best_d1]
        for k in range(n_resources):
            loads[k, i] -= ell[best_d1, k]
            loads[k, best_j] += ell[best_d1, k]
        assign[best_d1] = best_j
        moves[best_d1] += 1
        if best_d2 >= 0:
            for k in range(n_resources):
                loads[k, best_j] -= ell[best_d2, k]
                loads[k, i] += ell[best_d2, k]
            assign[best_d2] = i
            moves[best_d2] += 1
        m += best_mig


# --- the schemes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Construction:
    """What a construction heuristic places: the tracked keys in placement order, each with its
    resource vector (a row of ``ell``), migration ``cost``, ``frequency``, old channel ``home``
    (>= ``n_workers`` when new to the table) and new ring owner, plus θ, M₀, M̄ and the utility's
    index in :data:`UTILITIES`."""

    ell: np.ndarray
    theta: float
    cost: np.ndarray
    frequency: np.ndarray
    home: np.ndarray
    ring_owner: np.ndarray
    m0: float
    m_bar: float
    n_workers: int
    utility: int


class GedikScheme(TableScheme):
    """Consistent hash + explicit map, re-planned by one of Gedik's heuristics (see module doc).

    Args:
        alpha: tolerated max/min load ratio, the same for every resource (§3.1; > 1).
        sigma: share of the allowed imbalance left to untracked keys (§4.1.4; in (0, 1]).
        epsilon: lossy-counting error; default ``delta/10`` at this channel count.
        resources: beta_s, beta_c, beta_n as three letters of ``C``/``L``/``Q``; beta_n is ``L``.
        utility: ``A``, ``APM``, ``APLM``, ``ATM`` or ``ATLM`` (§4.3).
        replicas: ring points per channel (§5.5: 1000).
        window: ``W`` for the 3-counter sliding window, or None for one counter per interval.
        domain_size: ``|D|``, required when a resource is quadratic (Eq. 17).
    """

    keeps_key_on_one_worker = True
    #: Which construction heuristic :meth:`plan` runs.
    algorithm: ClassVar[str]

    def __init__(
        self,
        n_workers: int,
        *,
        alpha: float = 1.2,
        sigma: float = 0.1,
        epsilon: float | None = None,
        resources: str = "LCL",
        utility: str = "APM",
        replicas: int = 1000,
        window: int | None = None,
        domain_size: int | None = None,
        **base: Any,
    ) -> None:
        super().__init__(n_workers, **base)
        self.alpha = float(alpha)
        self.sigma = float(sigma)
        self.resources = str(resources).upper()
        self.utility = str(utility).upper()
        self.replicas = int(replicas)
        self.window = None if window is None else int(window)
        self.domain_size = None if domain_size is None else int(domain_size)
        if not self.alpha > 1.0:
            raise SchemeError(f"{self.name}: alpha must be > 1, got {alpha}")
        if not 0.0 < self.sigma <= 1.0:
            raise SchemeError(f"{self.name}: sigma must be in (0, 1], got {sigma}")
        if (
            len(self.resources) != 3
            or any(r not in RESOURCE_FUNCTIONS for r in self.resources)
            or self.resources[2] != "L"
        ):
            raise SchemeError(
                f"{self.name}: resources must be three of C/L/Q ending in L, got {resources!r}"
            )
        if self.utility not in UTILITIES:
            raise SchemeError(
                f"{self.name}: utility must be one of {', '.join(UTILITIES)}, got {utility!r}"
            )
        if self.replicas < 1:
            raise SchemeError(f"{self.name}: replicas must be >= 1, got {replicas}")
        if self.window is not None and self.window < 2:
            raise SchemeError(f"{self.name}: window must be >= 2 records, got {window}")
        if "Q" in self.resources and (self.domain_size is None or self.domain_size < 1):
            raise SchemeError(f"{self.name}: quadratic resources need domain_size (|D|)")
        if epsilon is None:
            epsilon = self._eq17_delta(max(self.n_workers, 2)) / 10.0
        self.epsilon = float(epsilon)
        if not 0.0 < self.epsilon < 1.0:
            raise SchemeError(f"{self.name}: epsilon must be in (0, 1), got {epsilon}")
        self._rings: dict[int, HashRing] = {}
        self.ring = self._ring_for(self.n_workers)
        self._sketch: LossyCounter | SlidingLossyCounter = (
            LossyCounter(self.epsilon)
            if self.window is None
            else SlidingLossyCounter(self.window, self.epsilon)
        )

    # -- routing ---------------------------------------------------------------------------------

    def _ring_for(self, n_workers: int) -> HashRing:
        ring = self._rings.get(n_workers)
        if ring is None:
            ring = HashRing(range(n_workers), replicas=self.replicas, seed=self.seed)
            if len(self._rings) >= 4:  # keep the current ring and a few planned ones
                for stale in [n for n in self._rings if n != self.n_workers][:1]:
                    del self._rings[stale]
            self._rings[n_workers] = ring
        return ring

    def lookup(self, key_ids: np.ndarray) -> np.ndarray:
        """Algorithm 1: the explicit map's channel if it has the key, else the ring's."""
        return self.workers_of_ids(key_ids)

    def base_workers_of_ids(self, key_ids: np.ndarray) -> np.ndarray:
        return self.ring.owners(np.asarray(key_ids, dtype=np.int64))

    @property
    def tolerance(self) -> float:
        return self.alpha

    def measured_imbalance(self, worker_loads: np.ndarray) -> float:
        """max/min load of the records (the linear resource's ratio of §3.1; inf when a worker
        is idle while another is not, 1 for an idle system)."""
        loads = np.asarray(worker_loads, dtype=np.float64)
        if loads.size == 0 or float(loads.max()) <= 0:
            return 1.0
        high, low = float(loads.max()), float(loads.min())
        return high / low if low > 0 else math.inf

    def route(self, keys: KeyBatch) -> np.ndarray:
        key_ids = keys.key_ids()
        workers = self.lookup(key_ids)
        self._sketch.update(key_ids, workers)
        return workers

    # -- statistics, planning, adoption ----------------------------------------------------------

    @property
    def counter(self) -> LossyCounter:
        """The lossy counter whose counts :meth:`statistics` reports."""
        return self._sketch if isinstance(self._sketch, LossyCounter) else self._sketch.active

    def statistics(self, reset: bool = True) -> KeyStatistics:
        counter = self.counter
        key_ids, counts, _ = counter.entries()
        loads = np.zeros(self.n_workers, dtype=np.int64)
        seen = counter.label_counts[: self.n_workers]
        loads[: seen.shape[0]] = seen
        frequency = counts.astype(np.float64)
        stats = KeyStatistics(
            key_ids=key_ids,
            frequency=frequency,
            cost=frequency.copy(),
            state_size=frequency.copy(),
            worker_loads=loads,
            records=int(counter.records),
        )
        if reset and isinstance(self._sketch, LossyCounter):
            self._sketch.clear()
        return stats

    def install(self, table: RoutingTable) -> None:
        self._check_table(table, self.n_workers)
        self.table = table

    def resize(self, n_workers: int, table: RoutingTable) -> None:
        """Switch to ``n_workers`` channels and the ``table`` planned for them, at once."""
        n_workers = int(n_workers)
        if n_workers < 1:
            raise SchemeError(f"{self.name}: number of workers must be >= 1, got {n_workers}")
        self._check_table(table, n_workers)
        self.ring = self._ring_for(n_workers)
        self.n_workers = n_workers
        self.table = table

    def _check_table(self, table: RoutingTable, n_workers: int) -> None:
        if len(table) and (table.workers.min() < 0 or table.workers.max() >= n_workers):
            raise SchemeError(f"{self.name}: table names a worker outside 0..{n_workers - 1}")

    def _eq17_delta(self, n_workers: int) -> float:
        """delta of Eq. 17 (before the quadratic post-filter)."""
        theta = imbalance_allowance(self.alpha, n_workers)
        deltas = [1.0]
        for kind in self.resources:
            if kind == "L":
                deltas.append(self.sigma * theta / n_workers)
            elif kind == "Q":
                deltas.append(math.sqrt(self.sigma * theta / (self.domain_size * n_workers)))
        return min(deltas)

    def frequency_threshold(self, n_workers: int, frequency: np.ndarray) -> float:
        """delta for ``n_workers`` channels given the tracked relative frequencies (§4.1.3)."""
        delta = self._eq17_delta(n_workers)
        if "Q" not in self.resources:
            return delta
        theta = imbalance_allowance(self.alpha, n_workers)
        tracked = frequency[frequency >= delta - self.epsilon]
        untracked_keys = max(self.domain_size - tracked.shape[0], 0)
        rest = max(1.0 - float(tracked.sum()), 0.0)
        predicted = float(np.sum(tracked * tracked))
        if untracked_keys:
            predicted += untracked_keys * (rest / untracked_keys) ** 2
        deltas = [1.0, self.sigma * theta / n_workers]  # beta_n is linear
        for kind in self.resources[:2]:
            if kind == "L":
                deltas.append(self.sigma * theta / n_workers)
            elif kind == "Q":
                deltas.append(math.sqrt(self.sigma * theta * predicted / n_workers))
        return min(deltas)

    def plan(self, stats: KeyStatistics, *, n_workers: int | None = None) -> Plan:
        """``p^(t+1)`` for ``n_workers`` channels (default: current) from merged ``stats``; pure."""
        started = time.perf_counter()
        n_new = self.n_workers if n_workers is None else int(n_workers)
        if n_new < 1:
            raise SchemeError(f"{self.name}: number of workers must be >= 1, got {n_new}")
        ring_new = self._ring_for(n_new)
        theta = imbalance_allowance(self.alpha, n_new)

        records = float(stats.records)
        measured = np.stack(
            [np.asarray(stats.frequency, np.float64), np.asarray(stats.state_size, np.float64)],
            axis=1,
        )
        named, measured, in_old = _name_keys(
            np.asarray(stats.key_ids, dtype=np.int64), measured, self.table.key_ids
        )
        f = measured[:, 0] / records if records > 0 else np.zeros(named.shape[0])
        old_workers = self.lookup(named)
        new_ring_workers = ring_new.owners(named)

        delta = self.frequency_threshold(n_new, f) if n_new > 1 else math.inf
        tracked = (f >= delta - self.epsilon) & (f > 0)
        state = resource_load(f, self.resources[0])
        dropped = in_old & ~tracked
        m0 = float(np.sum(state[dropped & (old_workers != new_ring_workers)]))
        m_bar = float(np.sum(state[in_old | tracked])) / n_new

        items = np.flatnonzero(tracked)
        items = items[np.lexsort((named[items], -f[items]))]
        active = [kind for kind in self.resources if kind != "C"]
        ell = np.ascontiguousarray(
            np.stack([resource_load(f[items], kind) for kind in active], axis=1)
        )
        home = old_workers[items].astype(np.int32)
        problem = Construction(
            ell, theta, state[items], f[items], home, new_ring_workers[items], m0, m_bar, n_new,
            UTILITIES.index(self.utility),
        )  # fmt: skip
        if ell.shape[0] == 0:
            assign, m_final, rho = np.empty(0, np.int32), m0, 0.0
        else:
            assign, m_final, rho = self._construct(problem)
        table = RoutingTable(named[items], assign, version=self.table.version + 1)

        new_workers = table.apply(named, new_ring_workers)
        moved = new_workers != old_workers
        positions = _arc_positions()
        arc_old = self.ring.owners(positions)
        arc_new = ring_new.owners(positions)
        arc_moved = float(np.mean(arc_old != arc_new))
        arc_share = np.bincount(arc_new, minlength=n_new) / _ARC_SAMPLES
        untracked = {kind: self._untracked_total(kind, f) for kind in RESOURCE_FUNCTIONS}
        # Eq. 9 in the paper's units (beta_s of relative frequencies) for m and gamma ...
        moved_beta = float(np.sum(state[moved])) + untracked[self.resources[0]] * arc_moved
        total_beta = float(np.sum(state)) + untracked[self.resources[0]]
        # ... and in measured state (records) for migration_cost, as every TableScheme reports
        untracked_records = max(records - float(np.sum(measured[:, 0])), 0.0)
        migration = float(np.sum(measured[moved, 1])) + untracked_records * arc_moved
        b_k: dict[str, float] = {}
        loads_after = np.zeros(n_new)
        for label, kind in zip("scn", self.resources, strict=True):
            if kind == "C":
                continue
            loads = np.bincount(new_workers, weights=resource_load(f, kind), minlength=n_new)
            loads = loads + untracked[kind] * arc_share
            low = float(loads.min())
            ratio = float(loads.max()) / low if low > 0 else math.inf
            b_k[label] = ratio / self.alpha
            if label == "n":  # beta_n is the records' (linear) load: the live balance measure
                loads_after = loads * records
        b = float(np.prod(list(b_k.values())) ** (1.0 / len(b_k)))
        return Plan(
            table=table,
            moved_keys=named[moved],
            migration_cost=migration,
            feasible=all(v <= 1.0 for v in b_k.values()),
            planning_seconds=time.perf_counter() - started,
            details={
                "algorithm": self.name,
                "n_workers": n_new,
                "delta": delta,
                "theta": theta,
                "tracked": int(items.shape[0]),
                "rho": float(rho),
                "gamma": m_final / m_bar if m_bar > 0 else 0.0,
                "M": moved_beta,
                "m": moved_beta / (total_beta / n_new) if total_beta > 0 else 0.0,
                "b": b,
                "b_k": b_k,
                "loads_after": loads_after,
            },
        )

    def _untracked_total(self, kind: str, f: np.ndarray) -> float:
        """Estimated total beta(f) of the keys the statistics do not name (§4.1.3's spread)."""
        rest = max(1.0 - float(f.sum()), 0.0)
        if kind == "L":
            return rest
        unnamed = max((self.domain_size or f.shape[0]) - f.shape[0], 0)
        if kind == "C":
            return float(unnamed)
        return unnamed * (rest / unnamed) ** 2 if unnamed else 0.0

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        """The placement of ``problem``'s keys (one or more): (channel per key, M, rho)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "alpha": self.alpha,
            "sigma": self.sigma,
            "epsilon": self.epsilon,
            "resources": self.resources,
            "utility": self.utility,
            "replicas": self.replicas,
            "window": self.window,
            "domain_size": self.domain_size,
        }


def _name_keys(
    stat_ids: np.ndarray, columns: np.ndarray, old_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys a plan can name (statistics' and old table's), ascending, with their ``columns``
    (zero for keys only in the old table) and whether the old table holds them.

    ``old_ids`` is sorted (a RoutingTable's). Avoids ``np.union1d``, whose hash-based unique is
    the slowest step for 10^6 keys; merged statistics usually arrive sorted already.
    """
    in_old_stats = np.zeros(stat_ids.shape[0], dtype=bool)
    extra = old_ids
    if old_ids.shape[0]:
        position = np.minimum(np.searchsorted(old_ids, stat_ids), old_ids.shape[0] - 1)
        in_old_stats = old_ids[position] == stat_ids
        extra = np.setdiff1d(old_ids, stat_ids[in_old_stats], assume_unique=True)
    named = np.concatenate([stat_ids, extra])
    columns = np.concatenate([columns, np.zeros((extra.shape[0], columns.shape[1]))])
    in_old = np.concatenate([in_old_stats, np.ones(extra.shape[0], dtype=bool)])
    if named.shape[0] > 1 and not np.all(named[1:] > named[:-1]):
        order = np.argsort(named, kind="stable")
        named, columns, in_old = named[order], columns[order], in_old[order]
    return named, columns, in_old


def _arc_positions() -> np.ndarray:
    """Evenly spaced positions around the 64-bit ring."""
    step = np.uint64((1 << 64) // _ARC_SAMPLES)
    return (np.arange(_ARC_SAMPLES, dtype=np.uint64) * step).view(np.int64)


class Scan(GedikScheme):
    """Algorithm 2: keys by decreasing frequency, each on its channel of lowest utility."""

    name = "scan"
    algorithm = "scan"

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        p = problem
        return _scan(p.ell, p.theta, p.cost, p.home, p.m0, p.m_bar, p.n_workers, p.utility)


class Redist(GedikScheme):
    """Algorithm 3: the (key, channel) of lowest utility per unit of frequency, step by step."""

    name = "redist"
    algorithm = "redist"

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        p = problem
        return _redist(
            p.ell, p.theta, p.cost, p.frequency, p.home, p.m0, p.m_bar, p.n_workers, p.utility
        )


class Readj(GedikScheme):
    """Algorithm 4: keep the old placement, then apply balance-improving moves and swaps.

    Args:
        move_limit: how many times one key may move (``c`` of §4.2.4).
    """

    name = "readj"
    algorithm = "readj"

    def __init__(self, n_workers: int, *, move_limit: int = 5, **base: Any) -> None:
        super().__init__(n_workers, **base)
        self.move_limit = int(move_limit)
        if self.move_limit < 0:
            raise SchemeError(f"readj: move_limit must be >= 0, got {move_limit}")

    def _construct(self, problem: Construction) -> tuple[np.ndarray, float, float]:
        p = problem
        # Keys new to the table start on their ring owner (their home is past the channels).
        start = np.where(p.home < p.n_workers, p.home, p.ring_owner).astype(np.int32)
        return _readj(
            p.ell, p.theta, p.cost, p.frequency, p.home, start, p.m0, p.m_bar, p.n_workers,
            p.utility, self.move_limit,
        )  # fmt: skip

    def params(self) -> dict[str, Any]:
        return {**super().params(), "move_limit": self.move_limit}

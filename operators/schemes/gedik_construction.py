"""Gedik's construction heuristics as compiled kernels: Scan, Redist and Readj (Alg. 2-4).

Layer: operators. Gedik, "Partitioning Functions for Stateful Data Parallelism in Stream
Processing", VLDB Journal 2014, §4.2; the choices we made where the paper is ambiguous are in
docs/schemes.md#gedik. :class:`Construction` is the one input every kernel takes;
:mod:`operators.schemes.gedik` builds it from a source's statistics.

Example:
    >>> import numpy as np
    >>> ell = np.array([[0.5], [0.3], [0.2]])
    >>> home = np.array([2, 2, 2], dtype=np.int32)
    >>> problem = Construction(ell, 0.2, ell[:, 0].copy(), ell[:, 0].copy(), home, home,
    ...                        0.0, 0.5, 2, UTILITIES.index("APM"))
    >>> scan(problem)[0].tolist()
    [0, 1, 1]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

#: Utility functions of §4.3, in the order of their numba codes.
UTILITIES = ("A", "APM", "APLM", "ATM", "ATLM")


class Construction(NamedTuple):
    """What a construction heuristic places: the tracked keys in placement order, each with its
    resource vector (a row of ``ell``), migration ``cost``, ``frequency``, old channel ``home``
    (>= ``n_workers`` when new to the table) and new ring owner, plus θ, M₀, M̄ and the utility's
    index in :data:`UTILITIES`. A NamedTuple, so the compiled kernels take it whole."""

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


#: What the kernels update while they place keys: ``loads[k, i]`` (resource ``k`` on channel
#: ``i``), ``totals[k]``, and each resource's three largest and smallest loads (values,
#: channels), so that rho after changing one or two channels costs O(1) instead of O(N).
Workspace = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


# --- compiled construction kernels -------------------------------------------------------------


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
def _extremes(ws: Workspace) -> None:
    """Refill the three largest and smallest loads of every resource from ``loads``."""
    loads, _, top_val, top_idx, bot_val, bot_idx = ws
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
    ws: Workspace, theta: float, c1: int, delta1: np.ndarray, c2: int, delta2: np.ndarray
) -> float:
    """rho (Eqs. 19-20) after adding ``delta1`` to channel ``c1`` and ``delta2`` to ``c2``.

    ``c2 = -1`` changes one channel only. Extremes must describe ``loads``.
    """
    loads, totals, top_val, top_idx, bot_val, bot_idx = ws
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
def _workspace(problem: Construction) -> tuple[Workspace, np.ndarray]:
    """A zeroed :data:`Workspace` for ``problem`` and a zero resource vector (the "no change"
    argument of :func:`_rho_after`)."""
    n_resources = problem.ell.shape[1]
    ws = (
        np.zeros((n_resources, problem.n_workers)),
        np.zeros(n_resources),
        np.empty((n_resources, 3)),
        np.empty((n_resources, 3), dtype=np.int64),
        np.empty((n_resources, 3)),
        np.empty((n_resources, 3), dtype=np.int64),
    )
    return ws, np.zeros(n_resources)


@numba.njit(cache=True)
def _place(loads: np.ndarray, totals: np.ndarray, row: np.ndarray, channel: int) -> None:
    """Add one item's resource vector ``row`` to ``channel``."""
    for k in range(row.shape[0]):
        loads[k, channel] += row[k]
        totals[k] += row[k]


@numba.njit(cache=True)
def _assign(
    problem: Construction, assign: np.ndarray, ws: Workspace, d: int, channel: int, m: float
) -> float:
    """Place item ``d`` on ``channel``; returns ``m`` plus its migration if it left home."""
    assign[d] = channel
    _place(ws[0], ws[1], problem.ell[d], channel)
    return m + problem.cost[d] if channel != problem.home[d] else m


@numba.njit(cache=True)
def _best_channel(
    ws: Workspace,
    theta: float,
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
        a = _rho_after(ws, theta, channel, row, -1, unused)
        moved = cost if channel != home else 0.0
        u = _utility(utility, a, (m + moved) / m_bar)
        if u < best_u:
            best_u, best_l, best_rho = u, channel, a
    return best_u, best_l, best_rho


@numba.njit(cache=True)
def scan(problem: Construction) -> tuple[np.ndarray, float, float]:
    """Algorithm 2: keys in order, each on its channel of lowest utility; (channels, M, rho)."""
    ell, theta, cost, _, home, _, m, m_bar, n_channels, utility = problem
    ws, unused = _workspace(problem)
    assign = np.empty(ell.shape[0], dtype=np.int32)
    rho = 0.0
    for d in range(ell.shape[0]):
        _extremes(ws)
        _, best_l, rho = _best_channel(
            ws, theta, ell[d], home[d], cost[d], m, m_bar, n_channels, utility, unused
        )
        m = _assign(problem, assign, ws, d, best_l, m)
    return assign, m, rho


@numba.njit(cache=True)
def redist(problem: Construction) -> tuple[np.ndarray, float, float]:
    """Algorithm 3: at every step the (unplaced key, channel) of lowest ``U / f``."""
    ell, theta, cost, frequency, home, _, m, m_bar, n_channels, utility = problem
    n_items = ell.shape[0]
    ws, unused = _workspace(problem)
    assign = np.full(n_items, -1, dtype=np.int32)
    rho = 0.0
    for _step in range(n_items):
        _extremes(ws)
        best_u = np.inf
        best_d = -1
        best_l = 0
        best_rho = 0.0
        for c in range(n_items):
            if assign[c] >= 0:
                continue
            u, channel, a = _best_channel(
                ws, theta, ell[c], home[c], cost[c], m, m_bar, n_channels, utility, unused
            )
            # Dividing by the key's frequency ranks keys; a channel's rank among one key's
            # channels is the same as without it.
            u = u / frequency[c]
            if u < best_u:
                best_u, best_d, best_l, best_rho = u, c, channel, a
        m = _assign(problem, assign, ws, best_d, best_l, m)
        rho = best_rho
    return assign, m, rho


@numba.njit(cache=True)
def _relocation_cost(cost: np.ndarray, home: np.ndarray, d: int, source: int, target: int) -> float:
    """Eq. 22 for one key: leaving its old channel costs its state, returning home refunds it."""
    leaves = 1.0 if home[d] == source else 0.0
    returns = 1.0 if home[d] == target else 0.0
    return cost[d] * (leaves - returns)


@numba.njit(cache=True)
def readj(
    problem: Construction, start: np.ndarray, move_limit: int
) -> tuple[np.ndarray, float, float]:
    """Algorithm 4: keys start on ``start``; then the best rho-lowering move or swap, until none
    lowers rho; a key moves at most ``move_limit`` times."""
    ell, theta, cost, frequency, home, _, m, m_bar, n_channels, utility = problem
    n_items, n_resources = ell.shape
    assign = start.copy()
    ws, still = _workspace(problem)
    loads, _, top_val, _, bot_val, _ = ws
    for d in range(n_items):
        m = _assign(problem, assign, ws, d, assign[d], m)
    delta1 = np.zeros(n_resources)
    delta2 = np.zeros(n_resources)
    moves = np.zeros(n_items, dtype=np.int64)
    critical = np.zeros(n_channels, dtype=np.bool_)
    while True:
        _extremes(ws)
        rho_now = _rho_after(ws, theta, 0, still, -1, still)
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
                a = _rho_after(ws, theta, i, delta1, j, delta2)
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
                a = _rho_after(ws, theta, i, delta1, j, delta2)
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

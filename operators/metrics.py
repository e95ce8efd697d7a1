"""The papers' load-balance, memory and time metrics, as pure functions of loads and routings.

Layer: operators. Load ``L_i(t)`` and imbalance ``I(t) = max_i L_i(t) − avg_i L_i(t)`` (Nasir
et al., "The Power of Both Choices", ICDE 2015, §II); ``λ = max/avg``, Fang et al.'s "workload
skewness" ("Parallel Stream Processing Against Workload Skewness and Variance", §5.1);
replication, the (key, worker) pairs per key; and execution time, the makespan of a FIFO
queue per worker (FISH, "Efficient Time-Evolving Stream Processing at Scale", §6.1, whose
cost model was lost: ours is in docs/schemes.md#metrics).

Example:
    >>> import numpy as np
    >>> loads = np.array([6, 2, 1, 3])
    >>> float(imbalance(loads)), float(max_avg_ratio(loads))
    (3.0, 2.0)
    >>> execution_time(np.array([0, 0, 0, 0]), n_workers=2)  # arrivals 0, .5, 1, 1.5
    4.0
    >>> execution_time(np.array([0, 1, 0, 1]), n_workers=2)
    2.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numba
import numpy as np


def imbalance(loads: np.ndarray) -> np.ndarray | float:
    """``I = max_i L_i − avg_i L_i`` over the last axis (one value per row of a 2-D array)."""
    loads = np.asarray(loads, dtype=np.float64)
    return loads.max(axis=-1) - loads.mean(axis=-1)


def max_avg_ratio(loads: np.ndarray) -> np.ndarray | float:
    """``λ = max_i L_i / avg_i L_i`` over the last axis; 1.0 where no worker has load yet."""
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean(axis=-1)
    safe = np.where(mean > 0, mean, 1.0)
    return np.where(mean > 0, loads.max(axis=-1) / safe, 1.0)


def load_figures(loads: Sequence[int]) -> tuple[float, float, float]:
    """``(I, I / Σ L, λ)`` of one vector of loads, as the live pipeline reports them: all 0.0
    before any load (a dashboard shows no imbalance rather than a perfect λ = 1 of nothing).

    >>> load_figures([30, 10, 10, 10]), load_figures([0, 0])
    ((15.0, 0.25, 2.0), (0.0, 0.0, 0.0))
    """
    array = np.asarray(loads, dtype=np.int64)
    total = int(array.sum())
    if not total:
        return 0.0, 0.0, 0.0
    value = float(imbalance(array))
    return value, value / total, float(max_avg_ratio(array))


#: Latency histogram buckets per decade: bucket b > 0 holds (10^((b-1)/20), 10^(b/20)] ms, the
#: live workers' histogram (pipeline/io/state_store.py) and the model's reading of it.
BUCKETS_PER_DECADE = 20


def latency_buckets(latency_ms: np.ndarray) -> np.ndarray:
    """Histogram bucket of each latency: 0 for <= 1 ms, else ``ceil(20 log10(ms))``.

    >>> latency_buckets(np.array([0.5, 1.0, 1.2, 10.0, 11.0])).tolist()
    [0, 0, 2, 20, 21]
    """
    latency = np.maximum(np.asarray(latency_ms, dtype=np.float64), 1.0)
    # The small epsilon keeps exact powers (10 ms -> 20) in their own bucket despite rounding.
    return np.ceil(BUCKETS_PER_DECADE * np.log10(latency) - 1e-9).astype(np.int64)


def bucket_upper_ms(bucket: int) -> float:
    """Upper edge of a latency bucket, in milliseconds."""
    return float(10.0 ** (bucket / BUCKETS_PER_DECADE))


def latency_quantile(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a bucket histogram: the upper edge of the first
    bucket whose cumulative count reaches ``q`` of the total (None when empty).

    >>> latency_quantile({0: 50, 20: 49, 40: 1}, 0.99)
    10.0
    """
    if not 0 < q <= 1:
        raise ValueError("q must be in (0, 1]")
    total = sum(histogram.values())
    if total == 0:
        return None
    needed = math.ceil(q * total)
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= needed:
            return round(bucket_upper_ms(bucket), 3)
    raise AssertionError("unreachable: the cumulative count reaches the total")


#: A run's steady state begins once its workers applied this share of its records (start-up,
#: the first batches and JIT warm-up behind): the live summary's cut and the model's.
STEADY_FROM = 0.2


def steady_rate(applied_ms: np.ndarray) -> float | None:
    """Records/s applied from the steady cut to the last record: with the records' applied
    times sorted, a_k the one at which :data:`STEADY_FROM` of them are applied, the records
    after it over a_last − a_k (None if no time lies between).

    >>> steady_rate(np.array([0.0, 1000.0, 2000.0, 3000.0, 4000.0]))
    1.0
    """
    applied = np.sort(np.asarray(applied_ms, dtype=np.float64))
    n = applied.shape[0]
    cut = max(1, math.ceil(STEADY_FROM * n))
    span_ms = float(applied[-1] - applied[cut - 1]) if n else 0.0
    return (n - cut) * 1000.0 / span_ms if span_ms > 0 else None


def checkpoint_positions(records: int, count: int) -> np.ndarray:
    """``count`` evenly spaced stream positions ``ceil(j·m/count)``, j = 1..count, ending at m.

    A checkpoint at position ``t`` sees the loads after the first ``t`` records. Duplicates
    (when ``m < count``) are dropped, so every position is distinct and >= 1.
    """
    if records < 1 or count < 1:
        raise ValueError("checkpoint_positions needs records >= 1 and count >= 1")
    j = np.arange(1, count + 1, dtype=np.int64)
    return np.unique(-((-j * records) // count))


@numba.njit(inline="always")
def _slot(value: np.uint64, mask: np.uint64) -> np.int64:
    # fmix64's first half: spreads values whose low bits repeat (e.g. key * W + worker).
    value ^= value >> np.uint64(33)
    value *= np.uint64(0xFF51AFD7ED558CCD)
    value ^= value >> np.uint64(33)
    return np.int64(value & mask)


@numba.njit(cache=True)
def _count_distinct(values: np.ndarray) -> int:
    # Open addressing in one array, 0 marking an empty slot (the value 0 is counted aside):
    # one cache miss per lookup instead of two.
    capacity = 1 << 16
    mask = np.uint64(capacity - 1)
    table = np.zeros(capacity, dtype=np.uint64)
    count = 0
    seen_zero = False
    for i in range(values.shape[0]):
        value = values[i]
        if value == 0:
            seen_zero = True
            continue
        slot = _slot(value, mask)
        while table[slot] != 0 and table[slot] != value:
            slot = (slot + 1) & np.int64(mask)
        if table[slot] == value:
            continue
        table[slot] = value
        count += 1
        if 2 * count > capacity:
            # Double and reinsert: keeps the load factor below one half.
            old_table = table
            capacity *= 2
            mask = np.uint64(capacity - 1)
            table = np.zeros(capacity, dtype=np.uint64)
            for j in range(old_table.shape[0]):
                if old_table[j] != 0:
                    s = _slot(old_table[j], mask)
                    while table[s] != 0:
                        s = (s + 1) & np.int64(mask)
                    table[s] = old_table[j]
    return count + (1 if seen_zero else 0)


def distinct_count(values: np.ndarray) -> int:
    """How many distinct 64-bit values (e.g. :meth:`KeyBatch.key_ids`): a compiled hash set,
    several times faster than ``np.unique`` on 10^7 records because it never sorts."""
    values = np.ascontiguousarray(values)
    if values.dtype.itemsize != 8:
        values = values.astype(np.int64)
    return int(_count_distinct(values.view(np.uint64)))


@numba.njit(cache=True)
def _key_worker_counts(key_ids: np.ndarray, workers: np.ndarray, n_workers: int) -> tuple:
    # One hash-table row per distinct key: the key, then a bitmask of the workers it reached,
    # side by side so that a lookup costs one cache miss. One pass gives both counts. Key 0
    # marks an empty row, so key 0 itself keeps its mask aside.
    words = (n_workers + 63) // 64
    capacity = 1 << 16
    mask = np.uint64(capacity - 1)
    table = np.zeros((capacity, words + 1), dtype=np.uint64)
    zero_reached = np.zeros(words, dtype=np.uint64)
    zero_seen = False
    count = 0
    for i in range(key_ids.shape[0]):
        key = key_ids[i]
        w = workers[i]
        bit = np.uint64(1) << np.uint64(w % 64)
        if key == 0:
            zero_seen = True
            zero_reached[w // 64] |= bit
            continue
        slot = _slot(key, mask)
        while table[slot, 0] != 0 and table[slot, 0] != key:
            slot = (slot + 1) & np.int64(mask)
        table[slot, 1 + w // 64] |= bit
        if table[slot, 0] == 0:
            table[slot, 0] = key
            count += 1
            if 2 * count > capacity:
                old = table
                capacity *= 2
                mask = np.uint64(capacity - 1)
                table = np.zeros((capacity, words + 1), dtype=np.uint64)
                for j in range(old.shape[0]):
                    if old[j, 0] != 0:
                        s = _slot(old[j, 0], mask)
                        while table[s, 0] != 0:
                            s = (s + 1) & np.int64(mask)
                        table[s, :] = old[j, :]
    pairs = 0
    for j in range(capacity):
        for k in range(words):
            value = table[j, 1 + k]
            while value:
                value &= value - np.uint64(1)
                pairs += 1
    if zero_seen:
        count += 1
        for k in range(words):
            value = zero_reached[k]
            while value:
                value &= value - np.uint64(1)
                pairs += 1
    return count, pairs


def key_worker_counts(key_ids: np.ndarray, workers: np.ndarray, n_workers: int) -> tuple[int, int]:
    """``(distinct keys, distinct (key, worker) pairs)`` in one compiled pass over the records
    (a hash table of keys, each with a bitmask of the workers it reached)."""
    key_ids = np.ascontiguousarray(key_ids, dtype=np.int64).view(np.uint64)
    workers = np.ascontiguousarray(workers, dtype=np.int64)
    if key_ids.shape != workers.shape:
        raise ValueError("key_ids and workers differ in length")
    if workers.size and (workers.min() < 0 or workers.max() >= n_workers):
        raise ValueError(f"workers must lie in 0..{n_workers - 1}")
    keys, pairs = _key_worker_counts(key_ids, workers, int(n_workers))
    return int(keys), int(pairs)


def replication(key_ids: np.ndarray, workers: np.ndarray, n_workers: int) -> float:
    """Distinct (key, worker) pairs / distinct keys: 1 for key grouping, <= 2 for PKG, <= W."""
    keys, pairs = key_worker_counts(key_ids, workers, n_workers)
    return pairs / keys if keys else 0.0


@numba.njit(cache=True)
def _makespan(workers: np.ndarray, service: np.ndarray, interarrival: float) -> float:
    finish = np.zeros(service.shape[0], dtype=np.float64)
    for t in range(workers.shape[0]):
        w = workers[t]
        arrival = t * interarrival
        start = finish[w] if finish[w] > arrival else arrival
        finish[w] = start + service[w]
    return finish.max()


def execution_time(
    workers: np.ndarray,
    worker_speeds: np.ndarray | None = None,
    *,
    n_workers: int | None = None,
) -> float:
    """Makespan of the per-worker FIFO queue model (module docstring), in units of one record's
    service time on a speed-1 worker. ``worker_speeds`` default to 1 for ``n_workers``."""
    if worker_speeds is None:
        if n_workers is None:
            raise ValueError("execution_time needs worker_speeds or n_workers")
        worker_speeds = np.ones(n_workers, dtype=np.float64)
    speeds = np.asarray(worker_speeds, dtype=np.float64)
    if (
        speeds.ndim != 1
        or speeds.size == 0
        or np.any(~(speeds > 0))
        or not np.all(np.isfinite(speeds))
    ):
        raise ValueError("worker speeds must be positive and finite, one per worker")
    workers = np.ascontiguousarray(workers, dtype=np.int32)
    return float(_makespan(workers, 1.0 / speeds, 1.0 / speeds.sum()))

"""FISH: recent hot keys spread over ring successors, chosen by estimated waiting time.

Layer: operators. Huang et al., "Efficient Time-Evolving Stream Processing at Scale": per
source, a decaying SpaceSaving finds recent hot keys (§4.1, Alg. 1), CHK gives each ``d``
workers (Alg. 2), and a record goes to the ring successor of least estimated completion time,
from what the source sent and ``worker_speeds`` (§4.2, Alg. 3, §5). The paper lost every
formula and default; ours: docs/schemes.md#fish.

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> fish = Fish(8, epoch=100)
    >>> stream = np.zeros(1000, dtype=np.int64)
    >>> stream[1::2] = np.arange(1, 501)  # key 0 is half the stream, keys 1..500 appear once
    >>> keys = KeyBatch.from_ints(stream)
    >>> workers = fish.route(keys)
    >>> len(set(workers[0:100:2].tolist()))  # first epoch: nothing is hot yet, one worker
    1
    >>> len(set(workers[100::2].tolist()))  # then key 0 is hot and spreads over all 8
    8
    >>> bool(np.all(workers[1::2] == fish.ring.owners(keys.key_ids()[1::2])))  # cold: ring owner
    True
    >>> np.bincount(workers).tolist()  # the hot key's records fill around the cold ones
    [127, 121, 121, 131, 125, 124, 125, 126]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import types
from numba.typed import Dict

from operators.base import Scheme, SchemeError
from operators.keys import KeyBatch
from operators.ring import HashRing
from operators.sketches.spacesaving import SpaceSaving, SummaryState, decay_counters, offer

#: The default capacity is 2/θ = n·T counters, but never below the D-C/W-C reference's 100.
MIN_CAPACITY = 100
DEFAULT_EPOCH = 1000
DEFAULT_DECAY = 0.5
DEFAULT_THRESHOLD_T = 10.0
DEFAULT_VIRTUAL_NODES = 1000

#: ``_progress`` fields (int64): records into the current epoch, epochs completed, d_min.
_EPOCH_POSITION = 0
_EPOCHS_DONE = 1
_D_MIN = 2


@numba.njit(cache=True)
def _classify(
    state: SummaryState,
    progress: np.ndarray,
    f_max_count: np.ndarray,
    key_ids: np.ndarray,
    theta: float,
    n_workers: int,
    epoch: int,
    decay: float,
    hot_keys: Dict,
    rows: np.ndarray,
    new_keys: np.ndarray,
) -> tuple[np.ndarray, int]:
    """Alg. 1 and 2 per record: 0 for a cold key, else the hot key's worker count M_k.

    ``hot_keys`` maps every key ever hot to (its row in the successor table, M_k); ``rows``
    receives each hot record's row, ``new_keys`` the keys hot for the first time (returned
    count), whose rows the caller appends in order.
    """
    out = np.zeros(key_ids.shape[0], dtype=np.int32)
    keys, counts, errors, heap, heap_position, index, meta, total = state
    n_new = 0
    for i in range(key_ids.shape[0]):
        key = key_ids[i]
        slot = offer(keys, counts, errors, heap, heap_position, index, meta, total, key, 1.0)
        guaranteed = counts[slot] - errors[slot]
        if guaranteed > f_max_count[0]:
            f_max_count[0] = guaranteed
        if progress[_EPOCHS_DONE] > 0 and guaranteed > theta * total[0]:
            d = math.ceil(n_workers * guaranteed / f_max_count[0])
            d = min(max(d, progress[_D_MIN]), n_workers)
            if key in hot_keys:
                row, before = hot_keys[key]
                if d > before:
                    hot_keys[key] = (row, d)
                else:
                    d = before
            else:
                row = len(hot_keys)
                hot_keys[key] = (row, d)
                new_keys[n_new] = key
                n_new += 1
            rows[i] = row
            out[i] = d
        progress[_EPOCH_POSITION] += 1
        if progress[_EPOCH_POSITION] == epoch:
            progress[_EPOCH_POSITION] = 0
            progress[_EPOCHS_DONE] += 1
            decay_counters(counts, errors, meta, total, decay)
            _sweep(counts, errors, meta[0], theta, total[0], n_workers, progress, f_max_count)
    return out, n_new


@numba.njit(inline="always")
def _sweep(
    counts: np.ndarray,
    errors: np.ndarray,
    size: int,
    theta: float,
    total: float,
    n_workers: int,
    progress: np.ndarray,
    f_max_count: np.ndarray,
) -> None:
    """Epoch-end refresh of f_max and d_min = max(2, ⌈n·F_H/h⌉) from the decayed counters."""
    largest = 0.0
    hot_mass = 0.0
    n_hot = 0
    for s in range(size):
        guaranteed = counts[s] - errors[s]
        largest = max(largest, guaranteed)
        if guaranteed > theta * total:
            hot_mass += guaranteed
            n_hot += 1
    f_max_count[0] = largest
    d_min = 2
    if n_hot > 0:
        d_min = max(2, math.ceil(n_workers * (hot_mass / total) / n_hot))
    progress[_D_MIN] = d_min


@numba.njit(cache=True)
def _assign(
    n_candidates: np.ndarray,
    owners: np.ndarray,
    rows: np.ndarray,
    successors: np.ndarray,
    rates: np.ndarray,
    time_per_tuple: np.ndarray,
    backlog: np.ndarray,
    last_update: np.ndarray,
    clock: np.ndarray,
) -> np.ndarray:
    """Alg. 3: cold records to their owner, hot ones to the earliest estimated completion."""
    out = np.empty(n_candidates.shape[0], dtype=np.int32)
    for i in range(n_candidates.shape[0]):
        now = clock[0]
        clock[0] += 1.0
        d = n_candidates[i]
        chosen = owners[i]
        if d > 0:
            best_finish = np.inf
            row = rows[i]
            for j in range(d):
                w = successors[row, j]
                pending = max(backlog[w] - rates[w] * (now - last_update[w]), 0.0)
                finish = (pending + 1.0) * time_per_tuple[w]
                if finish < best_finish:
                    best_finish = finish
                    chosen = w
        pending = max(backlog[chosen] - rates[chosen] * (now - last_update[chosen]), 0.0)
        backlog[chosen] = pending + 1.0
        last_update[chosen] = now
        out[i] = chosen
    return out


class Fish(Scheme):
    """FISH for one source; see the module docstring for every choice and its section.

    Args:
        capacity: counters of the recent-frequency summary (K_max); default max(100, n·T).
        epoch: records per epoch (N).
        decay: factor α applied to all counters at every epoch end, in [0, 1].
        threshold_t: T of θ = 2/(n·T).
        virtual_nodes: ring points per worker.
        worker_speeds: relative service rate per worker (default all equal), for the
            waiting-time estimate; a sequence or a comma-separated string.
    """

    name = "fish"
    keeps_key_on_one_worker = False

    def __init__(
        self,
        n_workers: int,
        *,
        capacity: int | None = None,
        epoch: int = DEFAULT_EPOCH,
        decay: float = DEFAULT_DECAY,
        threshold_t: float = DEFAULT_THRESHOLD_T,
        virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
        worker_speeds: Sequence[float] | np.ndarray | str | None = None,
        **base: Any,
    ) -> None:
        super().__init__(n_workers, **base)
        if capacity is not None and int(capacity) < 1:
            raise SchemeError(f"fish: capacity must be >= 1, got {capacity}")
        if int(epoch) < 1:
            raise SchemeError(f"fish: epoch must be >= 1, got {epoch}")
        if not 0.0 <= float(decay) <= 1.0:
            raise SchemeError(f"fish: decay must be in [0, 1], got {decay}")
        if not float(threshold_t) > 0:
            raise SchemeError(f"fish: threshold_t must be > 0, got {threshold_t}")
        if int(virtual_nodes) < 1:
            raise SchemeError(f"fish: virtual_nodes must be >= 1, got {virtual_nodes}")
        self.epoch = int(epoch)
        self.decay = float(decay)
        self.threshold_t = float(threshold_t)
        self.theta = 2.0 / (self.n_workers * self.threshold_t)
        self.capacity = (
            int(capacity)
            if capacity is not None
            else max(MIN_CAPACITY, math.ceil(2.0 / self.theta - 1e-9))
        )
        self.virtual_nodes = int(virtual_nodes)
        self.worker_speeds = self._speeds(worker_speeds)
        self.ring = HashRing(range(self.n_workers), replicas=self.virtual_nodes, seed=self.seed)
        self.summary = SpaceSaving(self.capacity)
        self._progress = np.array([0, 0, 2], dtype=np.int64)
        self._f_max_count = np.zeros(1, dtype=np.float64)
        #: key id -> (row of ``self._successors``, M_k) for every key that has been hot.
        self.hot_keys = Dict.empty(key_type=types.int64, value_type=types.UniTuple(types.int64, 2))
        #: Row r: all workers in ring order from the r-th hot key (walked once per key); rows
        #: beyond ``len(self.hot_keys)`` are spare room, so the table grows by doubling.
        self._successors = np.empty((16, self.n_workers), dtype=np.int32)
        self._rates = self.worker_speeds / self.worker_speeds.sum()
        self._time_per_tuple = 1.0 / self._rates
        self._backlog = np.zeros(self.n_workers, dtype=np.float64)
        self._last_update = np.zeros(self.n_workers, dtype=np.float64)
        self._clock = np.zeros(1, dtype=np.float64)

    def _speeds(self, speeds: Sequence[float] | np.ndarray | str | None) -> np.ndarray:
        if speeds is None:
            return np.ones(self.n_workers, dtype=np.float64)
        if isinstance(speeds, str):
            try:
                speeds = [float(part) for part in speeds.split(",")]
            except ValueError:
                raise SchemeError(f"fish: worker_speeds must be numbers, got {speeds!r}") from None
        values = np.asarray(speeds, dtype=np.float64).ravel()
        if values.shape[0] != self.n_workers or not np.all(np.isfinite(values) & (values > 0)):
            raise SchemeError(
                f"fish: worker_speeds needs {self.n_workers} positive numbers, got {values.size}"
            )
        return values

    def route(self, keys: KeyBatch) -> np.ndarray:
        key_ids = keys.key_ids()
        rows = np.zeros(key_ids.shape[0], dtype=np.int64)
        new_keys = np.empty(key_ids.shape[0], dtype=np.int64)
        n_candidates, n_new = _classify(
            self.summary.state,
            self._progress,
            self._f_max_count,
            key_ids,
            self.theta,
            self.n_workers,
            self.epoch,
            self.decay,
            self.hot_keys,
            rows,
            new_keys,
        )
        if n_new:
            used = len(self.hot_keys)
            if used > self._successors.shape[0]:
                grown = np.empty((2 * used, self.n_workers), dtype=np.int32)
                grown[: used - n_new] = self._successors[: used - n_new]
                self._successors = grown
            walked = self.ring.successors(new_keys[:n_new], self.n_workers)
            self._successors[used - n_new : used] = walked
        return _assign(
            n_candidates,
            self.ring.owners(key_ids),
            rows,
            self._successors,
            self._rates,
            self._time_per_tuple,
            self._backlog,
            self._last_update,
            self._clock,
        )

    def workers_of(self, key_ids: np.ndarray) -> np.ndarray:
        """M_k per key id: the workers a key may use when hot (1 for keys never hot)."""
        return np.array([self.hot_keys[k][1] if k in self.hot_keys else 1 for k in key_ids])

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "capacity": self.capacity,
            "epoch": self.epoch,
            "decay": self.decay,
            "threshold_t": self.threshold_t,
            "theta": self.theta,
            "virtual_nodes": self.virtual_nodes,
            "worker_speeds": self.worker_speeds.tolist(),
        }

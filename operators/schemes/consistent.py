"""Consistent hashing: every key to its owner on a ring with virtual nodes (Karger et al. 1997).

The baseline of Gedik (VLDBJ 2014, §4.1 and §5: "a consistent hash … 1000 replicas", notes/
gedik.md) and the base hash of Fang et al.'s routing tables, and the mapping FISH builds on
(§5). A key's position is its :meth:`KeyBatch.key_ids` fingerprint; its worker is the owner of
the first ring point clockwise (:class:`operators.ring.HashRing`, an O(1) bucketed lookup).
Adding a worker moves only the keys the newcomer takes over, about 1/N of them, and balance
improves with ``replicas`` (1000 by default, Gedik's setting). Every source that uses the same
``seed`` builds the same ring, so a key lands on one worker whichever source routes it.

Example:
    >>> from operators.keys import KeyBatch
    >>> scheme = ConsistentHashing(4)
    >>> workers = scheme.route(KeyBatch.from_strings(["a", "b", "a", "c", "b"]))
    >>> bool(workers[0] == workers[2] and workers[1] == workers[4])
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.base import Scheme, SchemeError
from operators.keys import KeyBatch
from operators.ring import HashRing

#: Virtual nodes per worker (Gedik §5.5 uses 1000 replicas).
DEFAULT_REPLICAS = 1000


class ConsistentHashing(Scheme):
    """Routes each key to its consistent-hash ring owner; keeps a key on one worker.

    Args:
        replicas: ring points (virtual nodes) per worker.
    """

    name = "consistent"
    keeps_key_on_one_worker = True

    def __init__(self, n_workers: int, *, replicas: int = DEFAULT_REPLICAS, **base: Any) -> None:
        super().__init__(n_workers, **base)
        if int(replicas) < 1:
            raise SchemeError(f"consistent: replicas must be >= 1, got {replicas}")
        self.replicas = int(replicas)
        self.ring = HashRing(range(self.n_workers), replicas=self.replicas, seed=self.seed)

    def route(self, keys: KeyBatch) -> np.ndarray:
        return self.ring.owners(keys.key_ids())

    def params(self) -> dict[str, Any]:
        return {**super().params(), "replicas": self.replicas}

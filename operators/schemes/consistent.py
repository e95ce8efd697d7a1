"""Consistent hashing: every key to its owner on a ring with virtual nodes (Karger et al. 1997).

Layer: operators. The baseline of Gedik, "Partitioning Functions for Stateful Data Parallelism
in Stream Processing" (VLDB Journal 2014, §4.1 and §5: "a consistent hash … 1000 replicas"),
the base hash of Fang et al.'s routing tables, and the mapping FISH builds on (§5). A key's
worker is the owner of the first ring point clockwise from its fingerprint
(:class:`operators.ring.HashRing`); adding a worker moves only the keys it takes over. Every
source with the same ``seed`` builds the same ring. More: docs/schemes.md#consistent-hashing.

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

"""The two baselines of every paper: key grouping (hashing) and shuffle grouping.

Layer: operators. Key grouping sends key ``k`` to ``|h13(k)| mod W``, the first of PKG's two
candidates (docs/schemes.md#pkg), so KG and PKG agree on a key's first worker and their
comparison isolates the second choice. Shuffle grouping is round-robin per source (Nasir et
al., "The Power of Both Choices", ICDE 2015, §II, "SG").

Example:
    >>> from operators.keys import KeyBatch
    >>> KeyGrouping(4).route(KeyBatch.from_strings(["a", "a", "a"])).tolist()
    [2, 2, 2]
    >>> ShuffleGrouping(3).route(KeyBatch.from_strings(["a", "a", "a", "a"])).tolist()
    [0, 1, 2, 0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from operators.base import Scheme
from operators.keys import KeyBatch, choice_from_hash

#: Seeds of PKG's two hash functions (Storm's original PartialKeyGrouping; docs/schemes.md#pkg).
FIRST_SEED = 13
SECOND_SEED = 17


class KeyGrouping(Scheme):
    """Hashing ("KG", "H"): every record of a key goes to ``|h13(key)| mod W``."""

    name = "key"
    keeps_key_on_one_worker = True

    def route(self, keys: KeyBatch) -> np.ndarray:
        return choice_from_hash(keys.hash64(FIRST_SEED), self.n_workers)


class ShuffleGrouping(Scheme):
    """Round-robin ("SG"): this source's i-th record goes to worker ``(source + i) mod W``.

    Starting each source at its own offset spreads the sources' partial rounds, so the
    global imbalance is at most one record per source whatever the stream.
    """

    name = "shuffle"
    keeps_key_on_one_worker = False

    def __init__(self, n_workers: int, **base: Any) -> None:
        super().__init__(n_workers, **base)
        self._next = self.source % self.n_workers

    def route(self, keys: KeyBatch) -> np.ndarray:
        n = len(keys)
        workers = (self._next + np.arange(n, dtype=np.int64)) % self.n_workers
        self._next = int((self._next + n) % self.n_workers)
        return workers.astype(np.int32)

"""A worker's micro-batch for tests of the Redis window state, written as counts per
(window, key) -- what a Spark task hands :meth:`pipeline.io.state_store.StateStore.apply`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from operators.aggregates import StateField
from operators.keys import KeyBatch
from pipeline.io.state_store import WorkerBatch

#: The one state field of a run with ``--sum``.
SUMS = StateField("sums", "sum", None)


def batch(
    worker: int,
    batch_id: int,
    counts: Mapping[tuple[int, bytes], int],
    marks: Mapping[int, int] | None = None,
    latency: Mapping[int, int] | None = None,
    switches: Mapping[int, int] | None = None,
    fields: Sequence[tuple[StateField, Mapping[tuple[int, bytes], int]]] = (),
) -> WorkerBatch:
    """Batch ``batch_id`` of ``worker``: ``counts`` per (window, key), each source's highest
    watermark (``marks``) and table switch (``switches``), a latency histogram, and each state
    field's value per (window, key) of ``counts`` (``fields``; a pair it lacks has none)."""
    pairs = sorted(counts)
    return WorkerBatch(
        worker=worker,
        batch_id=batch_id,
        windows=np.array([w for w, _ in pairs], dtype=np.int64),
        keys=KeyBatch.from_bytes([k for _, k in pairs]),
        counts=np.array([counts[p] for p in pairs], dtype=np.int64),
        source_watermarks=dict(marks or {}),
        records=sum(counts.values()),
        latency=dict(latency or {}),
        source_versions=dict(switches or {}),
        fields=tuple(declared for declared, _ in fields),
        values=tuple(
            np.array([values.get(p, 0) for p in pairs], dtype=np.int64) for _, values in fields
        ),
        present=tuple(np.array([p in values for p in pairs], dtype=bool) for _, values in fields),
    )

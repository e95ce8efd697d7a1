"""The control plane of routing-table schemes: what a grouping source reports each round.

Layer: stages.

Routing-table schemes (docs/schemes.md) rebalance by moving keys, and their window state,
between workers. The controller (:mod:`pipeline.stages.controller`) opens a round every
interval; each grouping source (:mod:`pipeline.stages.grouping`) reports what its scheme
measured since its previous report, bounded to the heaviest keys with their bytes
(:func:`compact_report`). The Redis operations of the protocol -- reports, versioned tables,
the migration's publish, move and completion -- are :mod:`pipeline.io.control_store`'s; why a
migration is exact: docs/design.md#migration-protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from operators.base import KeyStatistics
from operators.keys import KeyBatch
from pipeline.io.control_store import StatisticsReport

#: Keys per source report: the heaviest ones (bounded, like the papers' sketches).
DEFAULT_REPORT_KEYS = 20_000
#: Records of the latest batches a source keeps to name the keys it reports (bytes by
#: fingerprint): about a megabyte of keys.
RECENT_RECORDS = 100_000


def compact_report(
    stats: KeyStatistics,
    recent: Sequence[KeyBatch],
    known: Mapping[int, bytes],
    *,
    source: int,
    round_: int,
    table_version: int,
    max_keys: int = DEFAULT_REPORT_KEYS,
) -> StatisticsReport:
    """The report of ``stats``: its ``max_keys`` most frequent keys with their bytes.

    Bytes come from ``known`` (fingerprint -> bytes: the keys of the current table and of the
    last report) or from the ``recent`` batches the source routed (its last
    :data:`RECENT_RECORDS` records or more) -- a heavy key is in almost every batch. Keys named
    by neither are left out of the report; their records still count in ``worker_loads`` and
    in ``unnamed``.
    """
    key_ids = np.asarray(stats.key_ids, dtype=np.int64)
    frequency = np.asarray(stats.frequency, dtype=np.float64)
    if key_ids.shape[0] > max_keys:
        keep = np.sort(np.argpartition(-frequency, max_keys - 1)[:max_keys])
    else:
        keep = np.arange(key_ids.shape[0])
    ids = key_ids[keep]
    names: list[bytes | None] = [known.get(k) for k in ids.tolist()]
    missing = np.flatnonzero(np.fromiter((n is None for n in names), bool, len(names)))
    if missing.shape[0] and recent:
        # One search over every recent batch: the first occurrence of each fingerprint.
        recent_ids = np.concatenate([batch.key_ids() for batch in recent])
        unique, first = np.unique(recent_ids, return_index=True)
        if unique.shape[0]:
            position = np.minimum(np.searchsorted(unique, ids[missing]), unique.shape[0] - 1)
            hit = unique[position] == ids[missing]
            starts = np.cumsum([0] + [len(batch) for batch in recent])
            for slot, at in zip(missing[hit].tolist(), first[position[hit]].tolist(), strict=True):
                which = int(np.searchsorted(starts, at, side="right")) - 1
                names[slot] = recent[which][at - int(starts[which])]
    named = np.fromiter((n is not None for n in names), bool, len(names))
    chosen = keep[named]
    return StatisticsReport(
        source=source,
        round=round_,
        table_version=table_version,
        key_ids=key_ids[chosen],
        frequency=frequency[chosen],
        cost=np.asarray(stats.cost, dtype=np.float64)[chosen],
        state_size=np.asarray(stats.state_size, dtype=np.float64)[chosen],
        worker_loads=np.asarray(stats.worker_loads, dtype=np.int64),
        records=int(stats.records),
        names=[n for n in names if n is not None],
        unnamed=round(float(frequency.sum() - frequency[chosen].sum())),
    )

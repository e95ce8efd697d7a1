"""A grouping source's side of the control plane (routing-table schemes): it routes by the
newest published table and reports its key statistics when the controller opens a round, or,
with rounds counted in records, right after each ``report_every``-th record it routes.

Layer: stages.

Design: docs/design.md#migration-protocol.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import numpy as np

from operators.base import TableScheme
from operators.keys import KeyBatch
from pipeline.io.control_store import ControlPlane
from pipeline.stages import control_plane


@dataclass
class TableFollower:
    """Follows the control plane for source ``source``'s ``scheme``, looking at most every
    ``poll_seconds`` (one HMGET); a report names at most ``report_keys`` keys. With
    ``report_every``, round r's report follows the source's (r · report_every)-th record
    (:meth:`route` splits a batch there), not the controller's opening of a round."""

    control: ControlPlane
    scheme: TableScheme
    source: int
    poll_seconds: float
    report_keys: int
    report_every: int | None = None
    #: Records this source has routed (counted rounds): set by :meth:`start`.
    routed: int = field(default=0, init=False)
    _checked: float = field(default=0.0, init=False)
    _reported_round: int = field(default=0, init=False)
    _known_names: dict[int, bytes] = field(default_factory=dict, init=False)
    _table_names: dict[int, bytes] = field(default_factory=dict, init=False)
    # The latest batches, RECENT_RECORDS records or a little more, to name reported keys.
    _recent: collections.deque[KeyBatch] = field(default_factory=collections.deque, init=False)
    _recent_records: int = field(default=0, init=False)

    def start(self, version: int, routed: int = 0) -> None:
        """Route by table ``version`` (the committed one), then catch up with the newest;
        ``routed``: the records the source routed before (its committed count)."""
        self._install(version)
        self.routed = int(routed)
        self._reported_round = self.control.current().round
        self.poll(force=True)

    def route(self, keys: KeyBatch) -> np.ndarray:
        """The scheme's workers for ``keys`` (remembered, to name reported keys); with
        ``report_every``, a batch is routed in pieces, each report made right after its
        record (the model's cut: :func:`operators.simulator.source_round`)."""
        every = self.report_every
        out = np.empty(len(keys), dtype=np.int32)
        start = 0
        while start < len(keys):
            stop = len(keys) if not every else min(len(keys), start + every - self.routed % every)
            piece = keys.slice(start, stop)
            out[start:stop] = self.scheme.route(piece)
            self._remember(piece)
            self.routed += stop - start
            if every and self.routed % every == 0:
                self._report(self.routed // every)
            start = stop
        return out

    def _install(self, version: int) -> None:
        """Route by published table ``version`` from the next batch on."""
        published = self.control.table(version)
        self.scheme.install(published.table)
        self._table_names = dict(
            zip(published.table.key_ids.tolist(), published.names, strict=True)
        )
        self._known_names = {**self._known_names, **self._table_names}

    def poll(self, *, force: bool = False) -> None:
        """Adopt a newly published table; report statistics when the controller opened a new
        round."""
        now = time.monotonic()
        if not force and now - self._checked < self.poll_seconds:
            return
        self._checked = now
        current = self.control.current()
        if current.version > self.scheme.table.version:
            self._install(current.version)
        if not self.report_every and current.round > self._reported_round:
            self._report(current.round)

    def _remember(self, batch: KeyBatch) -> None:
        """Keep a routed batch's keys, to name the keys of the next report."""
        recent = self._recent
        recent.append(batch)
        self._recent_records += len(batch)
        while self._recent_records - len(recent[0]) >= control_plane.RECENT_RECORDS:
            self._recent_records -= len(recent.popleft())

    def _report(self, round_: int) -> None:
        scheme = self.scheme
        report = control_plane.compact_report(
            scheme.statistics(reset=True),
            list(self._recent),
            self._known_names,
            source=self.source,
            round_=round_,
            table_version=scheme.table.version,
            max_keys=self.report_keys,
        )
        self.control.report(report)
        self._reported_round = round_
        # Next time, name the keys of the current table and of this report without a search
        # (and forget older ones: the map stays as small as one report plus one table).
        self._known_names = {
            **dict(zip(report.key_ids.tolist(), report.names, strict=True)),
            **self._table_names,
        }

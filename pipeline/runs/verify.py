"""Is a run exact? Every final (key, window) count against the producers' ground truth.

Layer: runs.

Nothing lost, nothing doubled (docs/design.md#exactness-invariants), checked on one run's Redis
state after its aggregator finished: every (key, window) of ``truth:*`` or ``windows:final``
equal on both sides (:meth:`pipeline.io.state_store.StateStore.verify`); every window of the
truth final; no partial state left; the truth's records equal what the producers acknowledged
and what the results hold. ``exact`` is all four; late records are reported too.

Example (the report of a run with one wrong count):
    >>> report = RunVerification(
    ...     windows=2, keys=3, truth_records=10, result_records=9, produced_records=10,
    ...     missing_windows=[], leftover_state=0, late_records=0,
    ...     mismatches=[(20_000, b"hot", 5, 4)], mismatch_count=1)
    >>> report.exact
    False
    >>> print("\\n".join(report.lines()))
    NOT exact: 1 (key, window) count(s) differ from the ground truth (2 windows, 3 keys)
      window 20000 key 'hot': truth 5, result 4
      records: truth 10, results 9, producers sent 10
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.io.state_store import StateStore

#: Mismatches kept for the report (the count covers all of them).
MAX_REPORTED = 20


@dataclass(frozen=True)
class RunVerification:
    """The outcome of :func:`verify_run`."""

    windows: int
    keys: int
    truth_records: int
    result_records: int
    produced_records: int
    #: Windows of the truth that are not final.
    missing_windows: list[int]
    #: Partial-state hashes still in Redis.
    leftover_state: int
    late_records: int
    #: The first few ``(window, key, truth, result)`` that differ.
    mismatches: list[tuple[int, bytes, int, int]] = field(default_factory=list)
    mismatch_count: int = 0

    @property
    def exact(self) -> bool:
        return (
            self.windows > 0
            and self.mismatch_count == 0
            and not self.missing_windows
            and self.leftover_state == 0
            and self.truth_records == self.result_records == self.produced_records
        )

    def lines(self) -> list[str]:
        """A human report: one line when exact, the reasons (and first mismatches) otherwise."""
        scope = f"{self.windows} windows, {self.keys} keys"
        if self.exact:
            return [
                f"exact: every (key, window) count equals the ground truth ({scope}, "
                f"{self.result_records} records)"
            ]
        out = [
            f"NOT exact: {self.mismatch_count} (key, window) count(s) differ from the ground "
            f"truth ({scope})"
        ]
        for window, key, expected, got in self.mismatches:
            text = key.decode("utf-8", "replace")
            shown = repr(text if len(text) <= 60 else text[:57] + "...")
            out.append(f"  window {window} key {shown}: truth {expected}, result {got}")
        if self.mismatch_count > len(self.mismatches):
            out.append(f"  ... and {self.mismatch_count - len(self.mismatches)} more")
        if self.missing_windows:
            shown = ", ".join(map(str, self.missing_windows[:5]))
            out.append(f"  {len(self.missing_windows)} window(s) never final: {shown}")
        if self.leftover_state:
            out.append(f"  {self.leftover_state} partial-state hash(es) left in Redis")
        if self.late_records:
            out.append(f"  {self.late_records} record(s) arrived after their window closed")
        out.append(
            f"  records: truth {self.truth_records}, results {self.result_records}, "
            f"producers sent {self.produced_records}"
        )
        return out

    def as_dict(self) -> dict[str, object]:
        from pipeline.io.state_store import mismatch_rows

        return {
            "exact": self.exact,
            "windows": self.windows,
            "keys": self.keys,
            "mismatch_count": self.mismatch_count,
            "mismatches": mismatch_rows(self.mismatches, "truth"),
            "missing_windows": self.missing_windows,
            "leftover_state": self.leftover_state,
            "late_records": self.late_records,
            "truth_records": self.truth_records,
            "result_records": self.result_records,
            "produced_records": self.produced_records,
        }


def produced_records(store: StateStore) -> int:
    """Records the producers of the run acknowledged (sum of ``producer:{p}:sent``)."""
    return store.produced_records()


def verify_run(store: StateStore, max_reported: int = MAX_REPORTED) -> RunVerification:
    """Check the run of ``store`` (see the module docstring); reads Redis only. The windows
    the aggregator checked before their results expired (``--keep-results``) count with the
    totals it recorded; the others are compared here."""
    checked = store.checked_windows()
    compared = store.verify(max_mismatches=max_reported, skip=checked.windows)
    truth_windows = [w for w in store.truth_windows() if w not in checked.windows]
    final = set(store.final_windows())
    truth_records = sum(sum(store.truth(w).values()) for w in truth_windows)
    result_records = sum(sum(store.result(w).values()) for w in sorted(final - checked.windows))
    return RunVerification(
        windows=len(checked.windows) + compared.windows,
        keys=checked.keys + compared.keys,
        truth_records=checked.truth_records + truth_records,
        result_records=checked.result_records + result_records,
        produced_records=produced_records(store),
        missing_windows=[w for w in truth_windows if w not in final],
        leftover_state=len(store.state_keys()),
        late_records=int(store.per_worker_total("late")),
        mismatches=(checked.mismatches + compared.mismatches)[:max_reported],
        mismatch_count=checked.mismatch_count + compared.mismatch_count,
    )

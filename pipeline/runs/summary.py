"""What one run measured: throughput, latency, imbalance, exactness; as lines or as JSON.

Layer: runs.

:meth:`pipeline.runs.orchestrator.Pipeline.summary` reads the figures from Redis and Kafka
after a run; :class:`RunSummary` holds them and prints them (``skewer demo``'s closing lines,
or one JSON object with ``--json``). The definitions are in the orchestrator's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.io.state_store import StateStore
    from pipeline.runs.recount import RecountVerification
    from pipeline.runs.verify import RunVerification


@dataclass
class RunSummary:
    """What a run did; :meth:`as_json` has the demo's ``--json`` contract fields."""

    scheme: str
    run_id: str
    workload: str
    workers: int
    sources: int
    window_ms: int
    cpu_cost_us: float
    records_requested: int
    records_produced: int
    records_grouped: int
    records_processed: int
    per_worker: list[int]
    latency_p50_per_worker: list[float | None]
    latency_p99_per_worker: list[float | None]
    windows: int
    verification: RunVerification | RecountVerification
    seconds: float | None
    throughput: float | None
    #: Records per second from the first produce to the grouping stage's last write to work.
    offered_rate: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    imbalance_final: float
    max_avg_ratio: float
    replication: float | None
    dead_letters: int
    dead_letter_reasons: dict[str, int]
    stages: dict[str, dict[str, Any] | None]
    restarts: dict[str, int]
    wall_seconds: float
    #: Completed migrations of a routing-table scheme (``ctl:rebalances``), oldest first.
    migrations: list[dict[str, Any]] = field(default_factory=list)
    #: Records of a user's topic that came after their window closed (topic ``late``).
    late_records: int = 0
    #: Records of a user's topic that the query's WHERE left out.
    filtered_records: int = 0
    #: A query's run: the last final window's top keys, one row each, named as the query names
    #: its columns (:func:`pipeline.io.query.job.output_row`).
    top_rows: list[dict[str, Any]] = field(default_factory=list)
    #: The state fields the workers kept per (key, window) besides the count, an int64 each.
    state_fields: list[str] = field(default_factory=list)
    #: p50/p99 of the records applied after the first 20 % of the run's records were
    #: (:func:`pipeline.runs.latency.steady_histogram`): the pipeline once warm.
    latency_steady_p50_ms: float | None = None
    latency_steady_p99_ms: float | None = None
    #: Seconds from the command to the first record a worker applied.
    first_applied_seconds: float | None = None
    #: Per 5 s of wall time: {"start_s", "records", "p50_ms", "p99_ms"}
    #: (:func:`pipeline.runs.latency.latency_windows`).
    latency_windows: list[dict[str, Any]] = field(default_factory=list)
    #: The start-up timeline: {"event", "seconds"} in time order (:mod:`pipeline.runs.run_clock`).
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.verification.exact

    def as_json(self) -> dict[str, Any]:
        def rounded(value: float | None, digits: int = 3) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "scheme": self.scheme,
            "run_id": self.run_id,
            "workload": self.workload,
            "workers": self.workers,
            "sources": self.sources,
            "window_ms": self.window_ms,
            "cpu_cost_us": self.cpu_cost_us,
            "records_requested": self.records_requested,
            "records_produced": self.records_produced,
            "records_grouped": self.records_grouped,
            "records_processed": self.records_processed,
            "exact": self.exact,
            "windows": self.windows,
            "seconds": rounded(self.seconds),
            "throughput": rounded(self.throughput, 1),
            "offered_rate": rounded(self.offered_rate, 1),
            "latency_p50_ms": self.latency_p50_ms,
            "latency_p99_ms": self.latency_p99_ms,
            "latency_steady_p50_ms": self.latency_steady_p50_ms,
            "latency_steady_p99_ms": self.latency_steady_p99_ms,
            "first_applied_seconds": self.first_applied_seconds,
            "imbalance_final": rounded(self.imbalance_final),
            "imbalance_fraction": rounded(
                self.imbalance_final / self.records_processed if self.records_processed else 0.0,
                6,
            ),
            "max_avg_ratio": rounded(self.max_avg_ratio, 4),
            "replication": rounded(self.replication, 4),
            "dead_letters": self.dead_letters,
            "dead_letter_reasons": self.dead_letter_reasons,
            "late_records": self.late_records,
            "filtered_records": self.filtered_records,
            "top_rows": self.top_rows,
            "state_fields": self.state_fields,
            "per_worker": self.per_worker,
            "latency_p50_ms_per_worker": self.latency_p50_per_worker,
            "latency_p99_ms_per_worker": self.latency_p99_per_worker,
            "verification": self.verification.as_dict(),
            "restarts": self.restarts,
            "wall_seconds": round(self.wall_seconds, 3),
            "migrations": self.migrations,
            "latency_windows": self.latency_windows,
            "timeline": self.timeline,
        }

    def lines(self) -> list[str]:
        """The readable summary: one line per worker, then the overall figures."""
        total = self.records_processed or 1
        out = [f"{'worker':>6} {'records':>10} {'share':>7} {'p50 ms':>9} {'p99 ms':>9}"]
        for worker, records in enumerate(self.per_worker):
            p50 = self.latency_p50_per_worker[worker]
            p99 = self.latency_p99_per_worker[worker]
            out.append(
                f"{worker:>6} {records:>10,} {100 * records / total:>6.1f}% "
                f"{_ms(p50):>9} {_ms(p99):>9}"
            )
        throughput = (
            f"{self.throughput:,.0f} records/s over {self.seconds:.1f} s "
            "(first produce to last window final)"
            if self.throughput
            else "n/a"
        )
        replication = f"{self.replication:.3f}" if self.replication is not None else "n/a"
        out += [
            f"records: {self.records_produced:,} produced, {self.records_grouped:,} grouped, "
            f"{self.records_processed:,} processed; {self.windows} window(s) final; "
            f"{self.dead_letters:,} dead letter(s), {self.late_records:,} late"
            + (f", {self.filtered_records:,} left out by WHERE" if self.filtered_records else ""),
            f"throughput: {throughput}",
            f"latency (grouping stage to worker): p50 {_ms(self.latency_p50_ms)} ms, "
            f"p99 {_ms(self.latency_p99_ms)} ms over the whole run; steady state (after 20 % "
            f"of the records): p50 {_ms(self.latency_steady_p50_ms)} ms, "
            f"p99 {_ms(self.latency_steady_p99_ms)} ms",
            "first record applied: "
            + (
                f"{self.first_applied_seconds:.1f} s after the command"
                if self.first_applied_seconds is not None
                else "n/a"
            ),
            f"balance: imbalance max-avg {self.imbalance_final:,.1f} records, "
            f"max/avg {self.max_avg_ratio:.3f}; replication {replication}",
        ]
        if self.migrations:
            moved = sum(m.get("keys_moved", 0) for m in self.migrations)
            entries = sum(m.get("state_entries_moved", 0) for m in self.migrations)
            held = sum(m.get("held_records", 0) for m in self.migrations)
            hold = max(m.get("longest_hold_s", 0.0) for m in self.migrations)
            longest = max(m.get("duration_s", 0.0) for m in self.migrations)
            out.append(
                f"migrations: {len(self.migrations)}; {moved:,} key(s) and {entries:,} state "
                f"entries moved, {held:,} record(s) held back for at most {hold:.2f} s; "
                f"longest migration {longest:.2f} s"
            )
        if self.state_fields:
            out.append(
                f"state per (key, window) on each worker that holds the key: the count and "
                f"{', '.join(self.state_fields)}, {8 * (1 + len(self.state_fields))} bytes of "
                "int64 values (Prometheus: skewer_worker_field_entries)"
            )
        out += top_row_lines(self.top_rows)
        return out


def top_rows(store: StateStore, query: str | None, k: int = 5) -> list[dict[str, Any]]:
    """A query's run: its last final window's ``k`` top keys as the query's rows (none for a
    run without a query or a final window)."""
    from pipeline.io.query.job import output_row
    from pipeline.io.query.parse import parse_query
    from pipeline.io.state_store import key_text

    final = store.final_windows()
    if not query or not final:
        return []
    job, window = parse_query(query), max(final)
    merged = store.result_fields(window)
    return [
        output_row(job, window, key_text(key), count, merged)
        for key, count in store.topk(window)[:k]
    ]


def top_row_lines(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`top_rows` under a heading, for a terminal (none without rows)."""
    if not rows:
        return []
    return ["top keys of the last window, as the query names its columns:", _row_table(rows)]


def _row_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` as an aligned text table, one line per row under its column names."""
    names = list(rows[0])
    cells = [[str(row[name]) for name in names] for row in rows]
    widths = [max(len(name), *(len(line[i]) for line in cells)) for i, name in enumerate(names)]
    lines = [names, *cells]
    return "\n".join(
        "  " + "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True))
        for line in lines
    )


def window_lines(windows: list[dict[str, Any]]) -> list[str]:
    """The latency windows as a table: start (seconds since the command), records, p50, p99.

    >>> print("\\n".join(window_lines([{"start_s": 30.0, "records": 41_000, "p50_ms": 631.0,
    ...     "p99_ms": 1122.0}])))
     window s    records    p50 ms    p99 ms
         30.0     41,000     631.0   1,122.0
    """
    out = [f"{'window s':>9} {'records':>10} {'p50 ms':>9} {'p99 ms':>9}"]
    for w in windows:
        out.append(
            f"{w['start_s']:>9.1f} {w['records']:>10,} {_ms(w['p50_ms']):>9} {_ms(w['p99_ms']):>9}"
        )
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"

"""The workers' two Spark triggers side by side: micro-batches and Real-Time Mode.

What it measures and how: :data:`METHOD`, the prose of bench/results/triggers.md.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.end_to_end import SOURCES, WORKERS, WORKLOAD, Trace, batch_limit, row, traced_run
from bench.experiment import ExperimentResult, method_markdown, or_dash
from operators.metrics import STEADY_FROM, bucket_upper_ms, latency_buckets, latency_quantile
from pipeline.io.config import MICRO_BATCH, REAL_TIME

#: What the benchmark measures and how: the prose of bench/results/triggers.md.
METHOD = """\
``skewer bench triggers`` runs the whole live pipeline -- ``skewer produce``, ``group``,
``work`` (its own Spark application) and ``aggregate`` as subprocesses, as ``skewer demo``
does -- once per trigger, scheme, cost and load, on the end-to-end benchmark's stream (Zipf
z = 1.2, W = 8 workers, S = 2 sources), every run of both triggers in one command, one after
the other, the two triggers back to back at each point, 5 s apart. ``micro-batch`` is Spark's
default trigger, the Python tasks of ``pipeline/stages/worker_task.py``; ``real-time`` is
Spark's Real-Time Mode with the JVM writer of ``jvm/realtime-writer``
(docs/design.md#real-time-mode).

Capacity: pkg under a saturating offer (the producers and the grouping stage as fast as they
go), the workers' steady rate (records per second while a backlog existed, from 20 % to 90 %
of the records), or the run's throughput when the counters gave none; at zero cost and at the
CPU-cost knob's C = 500 µs per record (each worker a server of at most 2,000 records/s).
Latency: pkg and key paced at 25 %, 50 % and 80 % of that trigger's pkg capacity at that cost,
for 20 s each; p50/p99 over the records applied in the steady state.

Three latencies. The workers' histogram runs from the grouping stage's write to ``work`` to
the apply in Redis (``apply``). After each paced run the bench reads ``keys`` and ``work``
back and takes each record's time from its producer's Kafka timestamp to the grouping stage's
(``produce -> group``), over the records produced after the first 20 %, the workers'
steady-state cut. From production to the apply (``produce -> applied``), per record:

- Real-time: a real-time writer sets ``applied:{worker}`` to the last Kafka offset of
  ``work`` it applied, in the apply's own atomic step. While the run goes, the bench reads all
  workers' offsets every millisecond (one MGET) and notes when each changed; a record is
  applied at the first read that shows its partition's offset at or past its own. Each
  record's time from its producer's Kafka timestamp to that read is measured, never less than
  the truth and at most one read (about a millisecond) more; its p50/p99 are over the records
  themselves, not binned.
- Micro-batch: ``applied:{worker}`` is a batch id, so no record's apply time is known; the
  table gives a bound instead, whatever the two parts' dependence: P(X + Y > a + b) <= P(X > a)
  + P(Y > b), so the p99 of X + Y is at most the least a + b with P(X > a) + P(Y > b) <= 1 % (a
  over the histogram's bucket edges, b over the records' own times), e.g. p99.5(X) + p99.5(Y);
  the p50 likewise with 50 %. A bound is marked ``<=``.
"""

TRIGGERS = (MICRO_BATCH, REAL_TIME)
#: Costs per record (µs) of the runs: the pipeline's own capacity, and the PKG paper's range.
COSTS = (0.0, 500.0)
SCHEMES = ("pkg", "key")
LOADS = (0.25, 0.5, 0.8)
#: Seconds of offered load per paced run (records = rate x this).
SECONDS = 20.0
#: Records of a saturating run, per cost.
SATURATING_RECORDS = {0.0: 400_000, 500.0: 200_000}
#: Seconds between two runs, for the broker to delete the last run's topics before the next.
SETTLE_SECONDS = 5.0
#: The grouping stage's transaction cadence per trigger: the default 100 ms is within a
#: micro-batch's cycle, and would be most of a real-time path's latency.
COMMIT_INTERVAL_MS = {MICRO_BATCH: 100, REAL_TIME: 20}


#: Seconds between two reads of the real-time workers' applied offsets.
APPLIED_POLL_SECONDS = 0.001


@dataclass(frozen=True)
class RecordDelays:
    """Each DATA record's time from its producer's Kafka timestamp to a later moment of its
    way (ms), joined on the header's (producer, seq), in the order they were produced."""

    delays_ms: np.ndarray

    def steady(self) -> RecordDelays:
        """The records after the first :data:`STEADY_FROM` of them (the workers' cut)."""
        return RecordDelays(self.delays_ms[int(STEADY_FROM * self.delays_ms.size) :])

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile as the workers' histogram bins it (upper bucket edge)."""
        if not self.delays_ms.size:
            return None
        buckets, counts = np.unique(latency_buckets(self.delays_ms), return_counts=True)
        return latency_quantile(dict(zip(buckets.tolist(), counts.tolist(), strict=True)), q)

    def exact_quantile(self, q: float) -> float | None:
        """The ``q`` quantile of the records' own times (the higher one at a tie), not binned."""
        if not self.delays_ms.size:
            return None
        return round(float(np.quantile(self.delays_ms, q, method="higher")), 3)


@dataclass(frozen=True)
class AppliedOffsets:
    """When each worker's applied offset was first seen at each value: per worker, the
    offsets (increasing) and the wall-clock times (ms) of the reads that showed them."""

    offsets: dict[int, np.ndarray]
    times_ms: dict[int, np.ndarray]

    def applied_ms(self, partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """When each ``work`` record (its partition = its worker, its offset) was first seen
        applied; NaN for one never seen.

        >>> seen = AppliedOffsets({0: np.array([4, 9])}, {0: np.array([100.0, 130.0])})
        >>> seen.applied_ms(np.array([0, 0, 0, 0, 1]), np.array([2, 4, 5, 10, 0])).tolist()
        [100.0, 100.0, 130.0, nan, nan]
        """
        out = np.full(offsets.shape, np.nan)
        for worker, applied in self.offsets.items():
            rows = np.flatnonzero(partitions == worker)
            at = np.searchsorted(applied, offsets[rows], side="left")
            seen = at < applied.size
            out[rows[seen]] = self.times_ms[worker][at[seen]]
        return out


class AppliedOffsetPoller:
    """Reads the real-time workers' applied offsets (``applied:{worker}``) every
    :data:`APPLIED_POLL_SECONDS` in a thread, keeping each change and when it was seen."""

    def __init__(self, client: Any, keys: Sequence[str]) -> None:
        self._client, self._keys = client, list(keys)
        #: Per worker, (when, offset) of each new applied offset seen, in the order seen.
        self._seen: list[list[tuple[float, int]]] = [[] for _ in self._keys]
        #: Why the reads stopped before :meth:`stop`, if they did.
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="applied-offsets", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        from redis.exceptions import RedisError

        while not self._stop.wait(APPLIED_POLL_SECONDS):
            try:
                values = self._client.mget(self._keys)
            except RedisError as error:  # the later applies would go unseen: no figure at all
                self.failure = str(error)
                return
            now_ms = time.time() * 1000.0
            for seen, value in zip(self._seen, values, strict=True):
                if value is not None and (not seen or seen[-1][1] != int(value)):
                    seen.append((now_ms, int(value)))

    def stop(self) -> AppliedOffsets | None:
        """What was seen; None if the reads stopped early (a record applied after that would
        be missing, and the figures biased)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if self.failure is not None:
            return None
        offsets: dict[int, np.ndarray] = {}
        times: dict[int, np.ndarray] = {}
        for worker, seen in enumerate(self._seen):
            offsets[worker] = np.array([offset for _, offset in seen], dtype=np.int64)
            times[worker] = np.array([when for when, _ in seen], dtype=np.float64)
        return AppliedOffsets(offsets, times)


@dataclass(frozen=True)
class PathDelays:
    """Each record's time from its producer to the grouping stage and, when the workers'
    applies were watched, to its apply."""

    to_group: RecordDelays
    to_applied: RecordDelays | None


def path_delays(
    bootstrap: str, keys_topic: str, work_topic: str, applied: AppliedOffsets | None
) -> PathDelays:
    """Read ``keys`` and ``work`` back and join their DATA records on (producer, seq)."""
    from pipeline.io import records
    from pipeline.io.kafka_io import read_topic

    def data_records(topic: str, decode: Callable[[Any], Any]) -> dict[str, np.ndarray]:
        """The topic's DATA records: id, Kafka timestamp, partition and offset of each."""
        stored = read_topic(bootstrap, topic)
        decoded, ok = decode([r.value for r in stored])
        ok &= decoded["kind"] == records.Kind.DATA
        columns = {
            "id": (decoded["producer"].astype(np.uint64) << np.uint64(40)) | decoded["seq"],
            "ms": np.array([r.timestamp_ms for r in stored], dtype=np.float64),
            "partition": np.array([r.partition for r in stored], dtype=np.int64),
            "offset": np.array([r.offset for r in stored], dtype=np.int64),
        }
        return {name: column[ok] for name, column in columns.items()}

    produced = data_records(keys_topic, records.decode_input)
    grouped = data_records(work_topic, records.decode_work)
    to_group = join_delays(produced["id"], produced["ms"], grouped["id"], grouped["ms"])
    if applied is None:
        return PathDelays(to_group, None)
    applied_ms = applied.applied_ms(grouped["partition"], grouped["offset"])
    seen = ~np.isnan(applied_ms)
    to_applied = join_delays(produced["id"], produced["ms"], grouped["id"][seen], applied_ms[seen])
    return PathDelays(to_group, to_applied)


def join_delays(
    produced_ids: np.ndarray,
    produced_ms: np.ndarray,
    grouped_ids: np.ndarray,
    grouped_ms: np.ndarray,
) -> RecordDelays:
    """Each grouped record's time since its production (the record of the same id), in the
    order they were produced; a grouped id without a produced record is left out.

    >>> join_delays(np.array([7, 3, 5]), np.array([100, 90, 95]),
    ...             np.array([5, 3, 9, 7]), np.array([101, 99, 0, 130])).delays_ms.tolist()
    [9.0, 6.0, 30.0]
    """
    if not produced_ids.size:
        return RecordDelays(np.zeros(0))
    order = np.argsort(produced_ids)
    ids, stamps = produced_ids[order], produced_ms[order]
    at = np.minimum(np.searchsorted(ids, grouped_ids), ids.size - 1)
    found = ids[at] == grouped_ids
    produced, delays = stamps[at[found]], grouped_ms[found] - stamps[at[found]]
    return RecordDelays(delays[np.argsort(produced, kind="stable")].astype(np.float64))


class DelayTrace(Trace):
    """:class:`bench.end_to_end.Trace` that also watches a real-time run's applied offsets
    while it goes, and reads each record's way back when the run ends (before the run's
    topics are deleted)."""

    delays: RecordDelays | None = None
    to_applied: RecordDelays | None = None
    #: Why the applied offsets were not read to the run's end (then ``to_applied`` is None).
    watch_failure: str | None = None
    _poller: AppliedOffsetPoller | None = None

    def start(self, pipeline: Any) -> None:
        super().start(pipeline)
        plan = pipeline.plan
        if plan.trigger == REAL_TIME:
            keys = [pipeline.store.keys.applied(w) for w in range(plan.workers)]
            self._poller = AppliedOffsetPoller(pipeline.store.client, keys)

    def end(self, pipeline: Any, summary: Any) -> None:
        super().end(pipeline, summary)
        applied = self._poller.stop() if self._poller is not None else None
        self.watch_failure = self._poller.failure if self._poller is not None else None
        self._poller = None
        names = pipeline.plan.names
        delays = path_delays(
            pipeline.settings.kafka_bootstrap, names.keys_topic, names.work_topic, applied
        )
        self.delays = delays.to_group.steady()
        self.to_applied = delays.to_applied.steady() if delays.to_applied is not None else None


def bound(apply: dict[int, int], delays: RecordDelays | None, q: float) -> float | None:
    """The tightest union bound on the ``q`` quantile of produce -> applied, X + Y with X the
    workers' histogram (``apply``) and Y each record's way to the grouping stage (``delays``).

    For any split, P(X + Y > a + b) <= P(X > a) + P(Y > b), whatever the two parts' dependence;
    the bound is the least a + b with P(X > a) + P(Y > b) <= 1 - q, a over the histogram's
    bucket edges (every record of a bucket is at most its edge) and b over Y's own values.

    >>> way = RecordDelays(np.array([1.0] * 98 + [50.0] * 2))
    >>> bound({0: 995, 20: 5}, way, 0.99), bound({0: 980, 20: 20}, way, 0.99)
    (51.0, 60.0)
    """
    total = sum(apply.values())
    if not total or delays is None or not delays.delays_ms.size:
        return None
    ys = np.sort(delays.delays_ms)
    best: float | None = None
    seen = 0
    for bucket in sorted(apply):
        seen += apply[bucket]
        allowed = (1 - q) - (total - seen) / total  # what P(Y > b) may still be
        if allowed < -1e-12:
            continue
        # the least b with at most ``allowed`` of Y above it
        index = min(max(math.ceil(ys.size * (1 - allowed) - 1e-9) - 1, 0), ys.size - 1)
        candidate = bucket_upper_ms(bucket) + float(ys[index])
        best = candidate if best is None else min(best, candidate)
    return None if best is None else round(best, 3)


def run(
    *,
    triggers: Sequence[str] = TRIGGERS,
    costs: Sequence[float] = COSTS,
    schemes: Sequence[str] = SCHEMES,
    loads: Sequence[float] = LOADS,
    seconds: float = SECONDS,
    spark_master: str | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> ExperimentResult:
    """Every trigger's pkg capacity per cost, then each scheme paced at each load of it; the
    services must answer."""
    from pipeline.io import config
    from pipeline.runs.plan import plan_run

    settings = config.load()
    load_average = " ".join(f"{x:.2f}" for x in os.getloadavg())

    def measured(label: str, trigger: str, cost: float, **fields: Any) -> dict[str, Any]:
        real_time = trigger == REAL_TIME
        plan = plan_run(
            settings,
            run_prefix="bench",
            workers=WORKERS,
            sources=SOURCES,
            workload=WORKLOAD,
            cpu_cost_us=cost,
            spark_master=spark_master,
            trigger=trigger,
            max_records_per_batch=None if real_time else batch_limit(cost),
            commit_interval_ms=COMMIT_INTERVAL_MS[trigger],
            **fields,
        )
        # The previous run's topics are deleted in the broker's background: let it settle.
        time.sleep(SETTLE_SECONDS)
        began = time.monotonic()
        trace = DelayTrace()
        summary, _ = traced_run(plan, settings, trace=trace)
        figures = row(summary, trace)
        apply = trace.steady_latency()
        figures.update(
            trigger=trigger,
            cost=cost,
            group_p50_ms=trace.delays.quantile(0.5) if trace.delays else None,
            group_p99_ms=trace.delays.quantile(0.99) if trace.delays else None,
            e2e_p50_bound_ms=bound(apply, trace.delays, 0.5),
            e2e_p99_bound_ms=bound(apply, trace.delays, 0.99),
            e2e_p50_ms=trace.to_applied.exact_quantile(0.5) if trace.to_applied else None,
            e2e_p99_ms=trace.to_applied.exact_quantile(0.99) if trace.to_applied else None,
            e2e_records=int(trace.to_applied.delays_ms.size) if trace.to_applied else None,
        )
        if trace.watch_failure:
            log(f"{label}: the applied offsets were not read to the end ({trace.watch_failure})")
        log(
            f"{label}: {summary.throughput or 0:,.0f} records/s, steady "
            f"{figures['steady_rate'] or 0:,.0f}/s, apply p50/p99 {figures['steady_p50_ms']}/"
            f"{figures['steady_p99_ms']} ms, produce->applied {end_to_end(figures)} ms, "
            f"exact {summary.exact} ({time.monotonic() - began:.0f} s)"
        )
        return figures

    capacities: list[dict[str, Any]] = []
    paced: list[dict[str, Any]] = []
    for cost in costs:
        capacity: dict[str, float] = {}
        for trigger in triggers:
            saturated = measured(
                f"{trigger}, C = {cost:g} µs, pkg saturating",
                trigger,
                cost,
                scheme="pkg",
                records=SATURATING_RECORDS.get(cost, 200_000),
            )
            capacity[trigger] = saturated["steady_rate"] or saturated["throughput"]
            capacities.append({**saturated, "capacity": capacity[trigger]})
        # The triggers back to back at each point, so that a drift of the machine's speed
        # between points does not fall between the two triggers of one point.
        for scheme in schemes:
            for load in loads:
                for trigger in triggers:
                    rate = load * capacity[trigger]
                    figures = measured(
                        f"{trigger}, C = {cost:g} µs, {scheme} at {load:.0%}",
                        trigger,
                        cost,
                        scheme=scheme,
                        rate=rate,
                        records=int(rate * seconds),
                    )
                    paced.append({**figures, "load": load, "rate": rate})
    data = {"capacities": capacities, "paced": paced, "seconds": seconds}
    return ExperimentResult(
        name="triggers",
        title="Micro-batches and Real-Time Mode: capacity and latency side by side",
        markdown=results_markdown(data, load_average),
        data=data,
    )


def end_to_end(figures: dict[str, Any]) -> str:
    """Produce -> applied, ``p50 / p99`` in ms: measured when the run's applies were
    watched, else the bound on the sum of its parts, marked ``<=``.

    >>> end_to_end({"e2e_p50_ms": 41.0, "e2e_p99_ms": 180.5})
    '41.0 / 180.5'
    >>> end_to_end({"e2e_p50_bound_ms": 536.1, "e2e_p99_bound_ms": None})
    '<= 536.1 / -'
    """
    if figures.get("e2e_p50_ms") is not None:
        return f"{figures['e2e_p50_ms']:,.1f} / {or_dash(figures.get('e2e_p99_ms'), ',.1f')}"
    parts = [figures.get("e2e_p50_bound_ms"), figures.get("e2e_p99_bound_ms")]
    return " / ".join("-" if x is None else f"<= {x:,.1f}" for x in parts)


def results_markdown(data: dict[str, Any], load_average: str) -> str:
    """``triggers.md`` below its header, from the figures of a run (``triggers.json``)."""
    lines = [
        method_markdown(METHOD),
        "",
        f"Load average (1, 5, 15 min) when the run started: {load_average}.",
        "",
        "Grouping stage's transaction cadence: "
        + ", ".join(f"{t} {ms} ms" for t, ms in COMMIT_INTERVAL_MS.items())
        + " (`--commit-interval-ms`).",
        "",
        "## Capacity (pkg, saturating offer)",
        "",
        "| trigger | C (µs) | capacity (records/s) | throughput (records/s) | x micro-batch "
        "| exact |",
        "|---|---:|---:|---:|---:|---|",
    ]
    base = {c["cost"]: c["capacity"] for c in data["capacities"] if c["trigger"] == MICRO_BATCH}
    for c in data["capacities"]:
        ratio = c["capacity"] / base[c["cost"]] if base.get(c["cost"]) else None
        lines.append(
            f"| {c['trigger']} | {c['cost']:g} | {or_dash(c['capacity'], ',.0f')} | "
            f"{or_dash(c['throughput'], ',.0f')} | {or_dash(ratio, '.2f')} | "
            f"{'yes' if c['exact'] else 'NO'} |"
        )
    lines += [
        "",
        f"## Latency at {', '.join(f'{x:.0%}' for x in sorted({p['load'] for p in data['paced']}))}"
        " of each trigger's capacity",
        "",
        f"Steady state: the records applied after {STEADY_FROM:.0%} of them. `apply`: the "
        "grouping stage's write to the apply (the workers' histogram); `produce -> group`: the "
        "producer's Kafka timestamp to the grouping stage's; `produce -> applied`: measured "
        "per record in real-time mode, a bound (`<=`) in micro-batch mode.",
        "",
        "| trigger | C (µs) | scheme | load | records/s offered | apply p50 / p99 (ms) | "
        "produce -> group p50 / p99 (ms) | produce -> applied p50 / p99 (ms) | max/avg | exact |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in sorted(data["paced"], key=lambda p: TRIGGERS.index(p["trigger"])):
        lines.append(
            f"| {p['trigger']} | {p['cost']:g} | {p['scheme']} | {p['load']:.0%} | "
            f"{p['rate']:,.0f} | {or_dash(p['steady_p50_ms'], ',.1f')} / "
            f"{or_dash(p['steady_p99_ms'], ',.1f')} | {or_dash(p['group_p50_ms'], ',.1f')} / "
            f"{or_dash(p['group_p99_ms'], ',.1f')} | {end_to_end(p)} | "
            f"{p['max_avg_ratio']:.3f} | {'yes' if p['exact'] else 'NO'} |"
        )
    lines += ["", *verdicts(data)]
    return "\n".join(lines) + "\n"


def verdicts(data: dict[str, Any]) -> list[str]:
    """The figures the real-time path is held to, each with its target."""
    paced = {(p["trigger"], p["cost"], p["scheme"], p["load"]): p for p in data["paced"]}
    capacity = {(c["trigger"], c["cost"]): c["capacity"] for c in data["capacities"]}
    out = []
    quarter = paced.get((REAL_TIME, 0.0, "pkg", 0.25))
    if quarter:
        p50, p99 = end_to_end(quarter).split(" / ")
        out.append(
            f"- Real-time, zero cost, pkg at 25 %: produce -> applied p50 {p50} ms "
            f"(target <= 50), p99 {p99} ms (target <= 200), over "
            f"{or_dash(quarter.get('e2e_records'), ',')} records."
        )
    real, micro = capacity.get((REAL_TIME, 0.0)), capacity.get((MICRO_BATCH, 0.0))
    if real and micro:
        out.append(
            f"- Zero-cost capacity: real-time {real:,.0f} records/s, micro-batch {micro:,.0f}: "
            f"{real / micro:.2f}x (target >= 0.5x)."
        )
    for trigger in TRIGGERS:
        pkg, key = paced.get((trigger, 500.0, "pkg", 0.8)), paced.get((trigger, 500.0, "key", 0.8))
        if pkg and key and pkg["steady_p99_ms"] and key["steady_p99_ms"]:
            out.append(
                f"- {trigger}, C = 500 µs, 80 %: pkg's p99 {pkg['steady_p99_ms']:,.0f} ms, key's "
                f"{key['steady_p99_ms']:,.0f} ms: "
                f"{pkg['steady_p99_ms'] / key['steady_p99_ms']:.3f}x (target <= 0.1x)."
            )
    return out

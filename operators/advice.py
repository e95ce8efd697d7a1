"""Which grouping scheme for a given stream: every registered scheme replayed on a sample of it.

Layer: operators (pure). :func:`advise` routes a :class:`Sample` (records from S sources with
arrival times) through every scheme of the registry, its defaults plus a small sweep of its
main parameter (:data:`SWEEPS`, table schemes' rebalance interval), and predicts for each the
throughput bound at a per-record CPU cost C, the p50/p99 latency of per-worker FIFO servers fed
in micro-batches of D ms at an offered rate R, the state it keeps and what it migrates; then
ranks them for a goal. The model and what it leaves out: docs/advise.md.

Long because the model's figures and their check against a live run are one contract: each
figure a candidate predicts is checked live under the same name, so they change together.

Example:
    >>> import numpy as np
    >>> from operators.keys import KeyBatch
    >>> fifo_latencies(np.array([0, 0, 1]), np.array([0.0, 1.0, 1.0]), 2.0, 2).tolist()
    [2.0, 3.0, 2.0]
    >>> keys = KeyBatch.from_strings(["a"] * 60 + ["b", "c"] * 20)  # 100 records, 2 sources
    >>> sample = Sample(keys, np.arange(100) % 2, np.arange(100) * 10.0, n_sources=2)
    >>> advice = advise(sample, n_workers=4, cpu_cost_us=1000, rate=100,
    ...                 schemes=["key", "shuffle"])
    >>> [c.label for c in advice.ranking], advice.top_keys[0]
    (['shuffle', 'key'], b'a')
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np

from operators import metrics, registry
from operators.base import SchemeError, TableScheme
from operators.keys import KeyBatch
from operators.simulator import simulate

GOALS = ("throughput", "latency", "memory")
#: Keys whose spread over workers the advice reports ("hot keys").
TOP_KEYS = 10
#: Sweep of each scheme's main parameter beyond its default: name -> (parameter, values).
#: D-/W-Choices and FISH split the keys above θ = 2/(W·T) of a source's records: T decides
#: how many keys count as hot, the one knob the ICDE 2016 paper and FISH both turn.
SWEEPS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "d-choices": ("threshold_t", (5.0, 20.0)),
    "w-choices": ("threshold_t", (5.0, 20.0)),
    "fish": ("threshold_t", (5.0, 20.0)),
}
#: Routing-table schemes: the live controller's default round (``skewer demo
#: --control-interval``), as records at the offered rate, and rounds over the sample.
CONTROL_SECONDS = 2.0
ROUNDS_PER_SAMPLE = (10, 40)
#: At most this many controller rounds over a sample: keeps planning's cost bounded.
MAX_ROUNDS = 100
#: The first part of the sample left out of the worst max/avg (a few records are never even).
WARM_UP_FRACTION = 0.1
#: Schemes whose routing depends only on each source's own records in order: run live on the
#: same records, they put exactly the model's loads on every worker (FISH too: its epochs and
#: estimates count records; potc and greedy-online too: the model gives each source its own
#: object, as live, so their loads and key tables are that source's). The others read a
#: controller's table (live: rounds in seconds) or run only in the simulator.
SOURCE_ORDER_SCHEMES = frozenset(
    {
        "key",
        "shuffle",
        "pkg",
        "d-choices",
        "w-choices",
        "consistent",
        "fish",
        "potc",
        "greedy-online",
    }
)
#: Tolerances of a live check (docs/advise.md#checking-the-prediction-live): max/avg within 5 %
#: of live, throughput within 15 % of the live steady rate, p99 within a factor 2 of live.
MAX_AVG_TOLERANCE = 0.05
THROUGHPUT_TOLERANCE = 0.15
P99_FACTOR = 2.0
#: D: ms of Spark's micro-batch cycle the live workers are fed in (:func:`batched_latencies`):
#: about the steady cycle ``skewer bench latency`` measures (bench/results/worker_latency.md).
DEFAULT_BATCH_MS = 250.0


@dataclass(frozen=True)
class Sample:
    """The records of S sources interleaved by arrival: ``sources[i]`` reads record ``i``, each
    source's records in its own order; ``arrival_ms`` non-decreasing."""

    keys: KeyBatch
    sources: np.ndarray
    arrival_ms: np.ndarray
    n_sources: int

    def __post_init__(self) -> None:
        n = len(self.keys)
        if n < 1:
            raise SchemeError("the sample holds no records")
        if np.shape(self.sources) != (n,) or np.shape(self.arrival_ms) != (n,):
            raise SchemeError("a sample needs one source and one arrival time per record")
        if np.any(np.diff(self.arrival_ms) < 0):
            raise SchemeError("a sample's arrival times must not decrease")

    @classmethod
    def interleaved(cls, streams: Sequence[tuple[KeyBatch, np.ndarray]]) -> Sample:
        """One ``(keys, times_ms)`` per source, in that source's order. A record arrives no
        earlier than the one before it in its source (a source reads in order), so each
        source's times become their running maximum; ties go to the lower source."""
        if not streams or not sum(len(keys) for keys, _ in streams):
            raise SchemeError("the sample holds no records")
        times = [np.maximum.accumulate(np.asarray(t, dtype=np.float64)) for _, t in streams]
        for (keys, _), t in zip(streams, times, strict=True):
            if t.shape != (len(keys),):
                raise SchemeError(f"{t.shape[0]} times for {len(keys)} keys")
        all_times = np.concatenate(times)
        labels = np.concatenate(
            [np.full(t.shape[0], s, dtype=np.int32) for s, t in enumerate(times)]
        )
        order = np.argsort(all_times, kind="stable")
        keys = KeyBatch.concat([keys for keys, _ in streams]).take(order)
        return cls(keys, labels[order], all_times[order], len(streams))

    @property
    def rate(self) -> float | None:
        """Records per second the arrival times show; None if they span no time."""
        span_ms = float(self.arrival_ms[-1] - self.arrival_ms[0])
        return (len(self.keys) - 1) * 1000.0 / span_ms if span_ms > 0 else None


@numba.njit(cache=True)
def _fifo(workers: np.ndarray, arrival_ms: np.ndarray, cost_ms: float, n_workers: int) -> Any:
    finish = np.full(n_workers, -np.inf)
    latency = np.empty(workers.shape[0], dtype=np.float64)
    for i in range(workers.shape[0]):
        w = workers[i]
        t = arrival_ms[i]
        done = (finish[w] if finish[w] > t else t) + cost_ms
        finish[w] = done
        latency[i] = done - t
    return latency


def fifo_latencies(
    workers: np.ndarray, arrival_ms: np.ndarray, cost_ms: float, n_workers: int
) -> np.ndarray:
    """Each record's latency (ms) when every worker is a FIFO server taking ``cost_ms`` per
    record in arrival order: Lindley's f_n = max(f_{n-1}, t_n) + C, latency f_n − t_n (the
    live workers' model, pipeline/stages/worker_task.py ``service_finish_ms``)."""
    workers = np.ascontiguousarray(workers, dtype=np.int32)
    arrival_ms = np.ascontiguousarray(arrival_ms, dtype=np.float64)
    if workers.shape != arrival_ms.shape:
        raise ValueError("workers and arrival_ms differ in length")
    return _fifo(workers, arrival_ms, float(cost_ms), int(n_workers))


@numba.njit(cache=True)
def _batched(
    workers: np.ndarray, arrival_ms: np.ndarray, cost_ms: float, n_workers: int, batch_ms: float
) -> Any:
    n = workers.shape[0]
    finish = np.full(n_workers, -np.inf)
    done = np.empty(n, dtype=np.float64)
    batch = np.empty(n, dtype=np.int64)
    first = arrival_ms[0] if n else 0.0
    for i in range(n):
        w = workers[i]
        t = arrival_ms[i]
        finish[w] = (finish[w] if finish[w] > t else t) + cost_ms
        done[i] = finish[w]
        batch[i] = math.ceil((t - first) / batch_ms)
    # Backwards, the first record met of each (worker, batch) is its last: its share's finish.
    share_batch = np.full(n_workers, -1, dtype=np.int64)
    share_finish = np.zeros(n_workers)
    latency = np.empty(n, dtype=np.float64)
    for i in range(n - 1, -1, -1):
        w = workers[i]
        if batch[i] != share_batch[w]:
            share_batch[w] = batch[i]
            share_finish[w] = done[i]
        batch_end = first + (batch[i] + 1) * batch_ms
        latency[i] = (batch_end if batch_end > share_finish[w] else share_finish[w]) - arrival_ms[i]
    return latency


def batched_latencies(
    workers: np.ndarray,
    arrival_ms: np.ndarray,
    cost_ms: float,
    n_workers: int,
    batch_ms: float,
) -> np.ndarray:
    """Each record's latency (ms) when FIFO workers (:func:`fifo_latencies`) are fed in
    micro-batches of ``batch_ms`` D, as Spark feeds the live workers
    (pipeline/stages/worker_task.py, ``PartitionProcessor``).

    Batches start every D from the first arrival t_0: s_k = t_0 + k·D. A record arriving in
    (s_{k-1}, s_k] is read by batch k, i.e. k = ⌈(t − t_0) / D⌉. Worker w's server runs
    Lindley's recursion over all its records, f_n = max(f_{n-1}, t_n) + C, unchanged by the
    batches (the live task waits until ``service_finish_ms`` of its share, from the worker's
    previous finish). Its share of batch k is applied at once, when both the batch is over and
    the server is done with the share's last record:

        applied_{w,k} = max(s_k + D, F_{w,k}),   F_{w,k} = f of w's last record in batch k

    and a record's latency is applied − t. Below capacity F ≤ s_k + D, so latency lies in
    [D, 2D); past it F dominates and the latency is the FIFO one, rounded up to a batch end.
    D = 0 is :func:`fifo_latencies`.

    Example (D = 10 ms, C = 1 ms: light, then a worker's burst outlasting its batch):
        >>> batched_latencies(np.array([0, 0]), np.array([0.0, 4.0]), 1.0, 1, 10.0).tolist()
        [10.0, 16.0]
        >>> batched_latencies(np.zeros(3, int), np.array([1.0, 1.0, 1.0]), 6.0, 1, 10.0).tolist()
        [18.0, 18.0, 18.0]
    """
    workers = np.ascontiguousarray(workers, dtype=np.int32)
    arrival_ms = np.ascontiguousarray(arrival_ms, dtype=np.float64)
    if workers.shape != arrival_ms.shape:
        raise ValueError("workers and arrival_ms differ in length")
    if not (batch_ms >= 0 and math.isfinite(batch_ms)):
        raise ValueError(f"the batch cycle must be a finite number >= 0, got {batch_ms}")
    if batch_ms == 0:
        return _fifo(workers, arrival_ms, float(cost_ms), int(n_workers))
    return _batched(workers, arrival_ms, float(cost_ms), int(n_workers), float(batch_ms))


def duration_text(ms: float) -> str:
    """``0.5 ms``, ``250 ms``, ``68.2 s``: a latency for a sentence.

    >>> duration_text(0.5), duration_text(250.0), duration_text(68_178.0)
    ('0.5 ms', '250 ms', '68.2 s')
    """
    return f"{ms:.3g} ms" if ms < 1000 else f"{ms / 1000:,.1f} s"


def key_shown(key: bytes) -> str:
    """A key for a sentence: its text if it is printable UTF-8, else its bytes' repr."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return repr(key)
    return text if text.isprintable() and text else repr(key)


@dataclass
class Candidate:
    """One scheme with one parameter setting, replayed on the sample: the model's figures.

    ``skewer advise --validate`` puts measured figures beside these: ``measured`` holds the
    same names (:meth:`figures`) read from a live run, :func:`compare` holds them together.
    """

    scheme: str
    params: dict[str, Any]
    rebalance_interval: int | None
    simulator_only: bool
    final_loads: np.ndarray
    checkpoint_records: np.ndarray
    imbalance_series: np.ndarray
    max_avg_final: float
    max_avg_worst: float
    workers_per_key: float
    #: Distinct workers of each of the sample's top keys (Advice.top_keys order).
    hot_key_workers: list[int]
    state_entries: int
    rebalances: int
    moved_keys: int
    moved_state: float
    #: records/s the busiest worker allows at C (None at C = 0: no bound).
    throughput_bound: float | None
    #: records/s the model's workers apply once steady (:func:`operators.metrics.steady_rate`
    #: of the records' applied times at the offered rate): what a live run's steady rate is
    #: held to.
    steady_rate: float | None
    vs_even: float
    vs_key: float
    #: The busiest worker's utilisation at the offered rate (> 1: its queue grows unbounded).
    busiest_utilisation: float
    p50_ms: float
    p99_ms: float
    #: p50 and p99 as a live run's latency histogram reads them: the upper edge of the bucket
    #: holding the quantile (:func:`operators.metrics.latency_quantile`; 0 when no record
    #: waits). What :meth:`figures` holds a live run's to.
    p50_read_ms: float
    p99_read_ms: float
    routing_rate: float
    #: The top key (index into Advice.top_keys) holding most of the busiest worker's load,
    #: and that share.
    busiest_top_key: int
    busiest_top_key_share: float
    measured: dict[str, Any] | None = None
    #: The figures the model predicts at the rate the live run was offered
    #: (:func:`figures_at`): set with ``measured``, what it is compared with.
    predicted: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return setting_label(self.scheme, self.params, self.rebalance_interval)

    @property
    def workers_per_hot_key(self) -> float:
        return float(np.mean(self.hot_key_workers)) if self.hot_key_workers else 0.0

    def figures(self) -> dict[str, Any]:
        """The figures a live run can measure too, by the names a comparison uses."""
        return {
            "throughput_bound": self.throughput_bound,
            "steady_rate": self.steady_rate,
            "max_avg_final": self.max_avg_final,
            "p50_ms": self.p50_read_ms,
            "p99_ms": self.p99_read_ms,
            "state_entries": self.state_entries,
            "workers_per_key": self.workers_per_key,
            "loads": self.final_loads.tolist(),
        }

    @property
    def live_prediction(self) -> dict[str, Any]:
        """What a live run is compared with: the figures at its offered rate once it ran
        (``predicted``), else those at the advice's rate."""
        return self.predicted or self.figures()

    def checks(self) -> list[Check]:
        """The live run's figures against :attr:`live_prediction` (none unrun)."""
        if self.measured is None:
            return []
        return compare(self.scheme, self.live_prediction, self.measured)

    def summary(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "label": self.label,
            "params": dict(self.params),
            "rebalance_interval": self.rebalance_interval,
            "simulator_only": self.simulator_only,
            **self.figures(),
            "max_avg_worst": self.max_avg_worst,
            "vs_even": self.vs_even,
            "vs_key": self.vs_key,
            "busiest_utilisation": self.busiest_utilisation,
            "workers_per_hot_key": self.workers_per_hot_key,
            "hot_key_workers": list(self.hot_key_workers),
            "rebalances": self.rebalances,
            "moved_keys": self.moved_keys,
            "moved_state": self.moved_state,
            "routing_rate": self.routing_rate,
            "checkpoint_records": self.checkpoint_records.tolist(),
            "imbalance_series": self.imbalance_series.tolist(),
            "measured": self.measured,
            "predicted": self.predicted,
        }


@dataclass
class Advice:
    """Every candidate, the best setting of each scheme ranked for ``goal``, and one sentence."""

    goal: str
    n_workers: int
    n_sources: int
    cpu_cost_us: float
    rate: float
    batch_ms: float
    records: int
    distinct_keys: int
    top_keys: list[bytes]
    top_key_counts: list[int]
    candidates: list[Candidate]
    ranking: list[Candidate]
    recommendation: str
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def candidate(self, label: str) -> Candidate:
        return next(c for c in self.candidates if c.label == label)

    def summary(self) -> dict[str, Any]:
        return {
            "goal": self.goal,
            "workers": self.n_workers,
            "sources": self.n_sources,
            "cpu_cost_us": self.cpu_cost_us,
            "rate": self.rate,
            "batch_ms": self.batch_ms,
            "records": self.records,
            "distinct_keys": self.distinct_keys,
            "top_keys": [key_shown(k) for k in self.top_keys],
            "top_key_counts": self.top_key_counts,
            "recommendation": self.recommendation,
            "ranking": [c.label for c in self.ranking],
            "candidates": [c.summary() for c in self.candidates],
            "notes": list(self.notes),
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class Check:
    """One figure of a setting, predicted against measured live; ``within`` is None when it is
    not checked (a side is missing, or the figure is only shown)."""

    figure: str
    predicted: Any
    measured: Any
    within: bool | None

    @property
    def ratio(self) -> float | None:
        """measured / predicted, for numbers both > 0."""
        p, m = self.predicted, self.measured
        numbers = isinstance(p, (int, float)) and isinstance(m, (int, float))
        return m / p if numbers and p > 0 and m > 0 else None

    def summary(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "predicted": self.predicted,
            "measured": self.measured,
            "ratio": self.ratio,
            "within": self.within,
        }


def compare(scheme: str, predicted: dict[str, Any], measured: dict[str, Any]) -> list[Check]:
    """``predicted`` (:meth:`Candidate.figures`) against ``measured`` (the same names from a
    live run, and ``offered_rate``: records/s the live run was offered) for ``scheme``.

    Loads must be equal for :data:`SOURCE_ORDER_SCHEMES`; max/avg within
    :data:`MAX_AVG_TOLERANCE`; the steady rate within :data:`THROUGHPUT_TOLERANCE` of live when
    there is a bound (C > 0); p99 within :data:`P99_FACTOR` of live when the model predicts a
    wait (C > 0 or D > 0); p50 is shown.

    >>> [c.within for c in compare("key", {"loads": [3, 1], "max_avg_final": 1.5,
    ...     "throughput_bound": None, "steady_rate": 1000.0, "p50_ms": 0.0, "p99_ms": 0.0},
    ...     {"loads": [3, 1], "max_avg_final": 1.5, "steady_rate": 900.0, "p50_ms": 40.0,
    ...     "p99_ms": 90.0})]
    [True, True, None, None, None]
    """
    loads = measured.get("loads")
    exact = scheme in SOURCE_ORDER_SCHEMES and loads is not None
    expected = None if predicted["throughput_bound"] is None else predicted["steady_rate"]
    p99, live_p99 = predicted["p99_ms"], measured.get("p99_ms")
    return [
        Check(
            "loads", predicted["loads"], loads, list(loads) == predicted["loads"] if exact else None
        ),
        _relative(
            "max/avg", predicted["max_avg_final"], measured.get("max_avg_final"), MAX_AVG_TOLERANCE
        ),
        _relative("throughput", expected, measured.get("steady_rate"), THROUGHPUT_TOLERANCE),
        Check("p50", predicted["p50_ms"], measured.get("p50_ms"), None),
        Check(
            "p99",
            p99,
            live_p99,
            None
            if not p99 or live_p99 is None
            else live_p99 / P99_FACTOR <= p99 <= live_p99 * P99_FACTOR,
        ),
    ]


def _relative(
    figure: str, predicted: float | None, measured: float | None, tolerance: float
) -> Check:
    if predicted is None or measured is None:
        return Check(figure, predicted, measured, None)
    return Check(figure, predicted, measured, abs(measured - predicted) <= tolerance * measured)


def setting_label(scheme: str, params: dict[str, Any], rebalance_interval: int | None) -> str:
    """``d-choices threshold_t=5``, ``mixed every=20000``: a scheme and its setting."""
    items = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    if rebalance_interval is not None:
        items.append(f"every={rebalance_interval}")
    return " ".join([scheme, *items])


def settings_of(scheme: str, records: int, rate: float) -> list[tuple[dict[str, Any], int | None]]:
    """``(params, rebalance interval)`` of every setting :func:`advise` tries for ``scheme``:
    its defaults, :data:`SWEEPS`, and for a routing-table scheme the live controller's round at
    ``rate`` plus :data:`ROUNDS_PER_SAMPLE`, none closer than ``records / MAX_ROUNDS``."""
    if not issubclass(registry.scheme_class(scheme), TableScheme):
        name, values = SWEEPS.get(scheme, ("", ()))
        return [({}, None), *(({name: value}, None) for value in values)]
    shortest = max(1, math.ceil(records / MAX_ROUNDS))
    wanted = [round(rate * CONTROL_SECONDS), *(records // n for n in ROUNDS_PER_SAMPLE)]
    intervals = sorted({max(shortest, w) for w in wanted if w < records})
    return [({}, interval) for interval in intervals] or [({}, None)]


def _rank_key(goal: str, c: Candidate) -> tuple[Any, ...]:
    # Shares of the even split rounded to 1%, p99 to 3 significant digits: closer than that
    # a sample cannot tell two schemes apart, so the next criterion decides.
    even = -round(c.vs_even, 2)
    p99 = float(f"{c.p99_ms:.3g}")
    if goal == "throughput":
        return (even, c.state_entries, p99, c.label)
    if goal == "latency":
        return (p99, even, c.state_entries, c.label)
    return (c.state_entries, even, p99, c.label)


def rank(candidates: Sequence[Candidate], goal: str) -> list[Candidate]:
    """The best setting of each scheme, best scheme first, for ``goal`` (:data:`GOALS`):
    throughput = highest bound, latency = lowest p99, memory = fewest state entries."""
    if goal not in GOALS:
        raise SchemeError(f"unknown goal {goal!r}; valid goals: {', '.join(GOALS)}")
    best: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: _rank_key(goal, c)):
        best.setdefault(c.scheme, c)
    return list(best.values())


def live_candidates(ranking: Sequence[Candidate], k: int) -> list[Candidate]:
    """What ``--validate k`` runs live: the first ``k`` settings of ``ranking`` that run live
    (no simulator-only scheme), and key grouping's, the baseline, if not among them."""
    if not k:
        return []
    live = [c for c in ranking if not c.simulator_only][:k]
    key = next(c for c in ranking if c.scheme == "key")
    return live if key in live else [*live, key]


def recommend(ranking: Sequence[Candidate], top_keys: Sequence[bytes], goal: str) -> str:
    """One sentence in the user's terms: the first scheme that runs live, what it buys over
    key grouping, and why key grouping falls short (its busiest worker's top key)."""
    live = [c for c in ranking if not c.simulator_only]
    best = live[0] if live else ranking[0]
    key = next((c for c in ranking if c.scheme == "key"), None)
    if goal == "latency":
        head = f"{best.label}: predicted p99 {duration_text(best.p99_ms)}"
    elif goal == "memory":
        head = (
            f"{best.label}: {best.state_entries:,} state entries "
            f"({best.workers_per_key:.2f} workers per key), {best.vs_even:.2f}× the even "
            "split's throughput"
        )
    else:
        head = (
            f"{best.label}: {best.vs_even:.2f}× the even split's throughput, "
            f"{best.workers_per_hot_key:.1f} workers per hot key"
        )
    if key is None or best.scheme == "key":
        return head + ("" if key is None else "; no scheme does better than key grouping here")
    hot = key_shown(top_keys[key.busiest_top_key]) if top_keys else "?"
    held = f"{key.busiest_top_key_share:.0%} of its load"
    if goal == "latency":
        overload = " (overloaded)" if key.busiest_utilisation > 1 else ""
        return (
            f"{head}; key grouping's is {duration_text(key.p99_ms)}{overload} because one worker "
            f"holds '{hot}' ({held})"
        )
    return (
        f"{head}; key grouping caps at {key.vs_even:.2f}× because one worker holds '{hot}' ({held})"
    )


def _top_keys(key_ids: np.ndarray, keys: KeyBatch) -> tuple[np.ndarray, list[bytes], list[int]]:
    unique, first, counts = np.unique(key_ids, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))[:TOP_KEYS]
    return unique[order], [keys[int(i)] for i in first[order]], counts[order].tolist()


def _percentiles(latency: np.ndarray) -> tuple[float, float]:
    p50, p99 = np.percentile(latency, [50, 99])
    return float(p50), float(p99)


def _read_as_live(latency: np.ndarray, exact: tuple[float, float]) -> tuple[float, float]:
    """p50 and p99 of ``latency`` in the live histogram's buckets (one bucketing for both);
    each 0 where its ``exact`` value is."""
    histogram = dict(enumerate(np.bincount(metrics.latency_buckets(latency)).tolist()))
    reads = []
    for q, value in zip((0.5, 0.99), exact, strict=True):
        read = metrics.latency_quantile(histogram, q) if value > 0 else None
        reads.append(float(read) if read is not None else 0.0)
    return reads[0], reads[1]


def advise(
    sample: Sample,
    n_workers: int,
    cpu_cost_us: float,
    rate: float,
    *,
    goal: str = "throughput",
    schemes: Sequence[str] | None = None,
    seed: int = 0,
    batch_ms: float = DEFAULT_BATCH_MS,
    progress: Callable[[int, int, str], None] | None = None,
) -> Advice:
    """Replay ``sample`` through every setting of ``schemes`` (default: the registry's) at W
    workers, C = ``cpu_cost_us`` µs per record and ``rate`` records/s offered, the workers fed
    in micro-batches of ``batch_ms`` (:func:`batched_latencies`; 0: one by one); rank for
    ``goal``.

    ``progress(done, total, label)`` is called after each setting.
    """
    if int(n_workers) < 2:
        raise SchemeError(f"advice needs at least 2 workers, got {n_workers}")
    if not (cpu_cost_us >= 0 and math.isfinite(cpu_cost_us)):
        raise SchemeError(f"the CPU cost must be a finite number >= 0, got {cpu_cost_us}")
    if not (rate > 0 and math.isfinite(rate)):
        raise SchemeError(f"the rate must be a finite number > 0, got {rate}")
    if goal not in GOALS:
        raise SchemeError(f"unknown goal {goal!r}; valid goals: {', '.join(GOALS)}")
    if not (batch_ms >= 0 and math.isfinite(batch_ms)):
        raise SchemeError(f"the batch cycle must be a finite number >= 0, got {batch_ms}")
    began = time.perf_counter()
    names = list(schemes) if schemes is not None else registry.names()
    if "key" not in names:
        names.insert(0, "key")  # the baseline every ratio is to
    m = len(sample.keys)
    key_ids = sample.keys.key_ids()
    top_ids, top_keys, top_counts = _top_keys(key_ids, sample.keys)
    top_rows = [np.flatnonzero(key_ids == k) for k in top_ids]
    distinct = metrics.distinct_count(key_ids)
    sample_rate = sample.rate
    scale = (sample_rate / rate) if sample_rate is not None else 0.0
    arrival = (sample.arrival_ms - sample.arrival_ms[0]) * scale
    cost_ms = cpu_cost_us / 1000.0
    plan = [(name, p, i) for name in names for p, i in settings_of(name, m, rate)]
    raw: list[dict[str, Any]] = []
    for done, (name, params, interval) in enumerate(plan, start=1):
        fresh = KeyBatch(sample.keys.data, sample.keys.offsets)  # hashing counts in routing cost
        # One object per source, as the live stage runs them (potc, greedy-online); the
        # simulator-only schemes keep the shared object they exist to show.
        result = simulate(
            name,
            fresh,
            n_workers,
            sample.n_sources,
            params=params,
            seed=seed,
            rebalance_interval=interval,
            sources=sample.sources,
            per_source=name not in registry.SIMULATOR_ONLY,
        )
        loads = result.final_loads
        busiest = int(np.argmax(loads))
        spread = [np.bincount(result.workers[rows], minlength=n_workers) for rows in top_rows]
        on_busiest = [int(counts[busiest]) for counts in spread]
        j = int(np.argmax(on_busiest)) if on_busiest else 0
        after = result.checkpoint_records >= WARM_UP_FRACTION * m
        worst = metrics.max_avg_ratio(result.checkpoint_loads[after]) if after.any() else [1.0]
        latency = batched_latencies(result.workers, arrival, cost_ms, n_workers, batch_ms)
        p50, p99 = _percentiles(latency)
        p50_read, p99_read = _read_as_live(latency, (p50, p99))
        raw.append(
            {
                "scheme": name,
                "params": dict(params),
                "rebalance_interval": interval,
                "simulator_only": name in registry.SIMULATOR_ONLY,
                "final_loads": loads,
                "checkpoint_records": result.checkpoint_records,
                "imbalance_series": result.imbalance_series,
                "max_avg_final": result.max_avg_ratio,
                "max_avg_worst": float(np.max(worst)),
                "workers_per_key": result.replication,
                "hot_key_workers": [int(np.count_nonzero(counts)) for counts in spread],
                "state_entries": round(result.replication * result.distinct_keys),
                "rebalances": len(result.migrations),
                "moved_keys": sum(r["moved_keys"] for r in result.migrations),
                "moved_state": sum(r["migrated_state"] for r in result.migrations),
                "p50_ms": p50,
                "p99_ms": p99,
                "p50_read_ms": p50_read,
                "p99_read_ms": p99_read,
                "steady_rate": metrics.steady_rate(arrival + latency),
                "routing_rate": result.routing_rate,
                "busiest_top_key": j,
                "busiest_top_key_share": on_busiest[j] / loads[busiest] if on_busiest else 0.0,
            }
        )
        if progress is not None:
            progress(done, len(plan), setting_label(name, params, interval))
    key_max = next(int(r["final_loads"].max()) for r in raw if r["scheme"] == "key")
    candidates = []
    for r in raw:
        busiest_load = int(r["final_loads"].max())
        bound = m / (busiest_load * cpu_cost_us * 1e-6) if cpu_cost_us > 0 else None
        candidates.append(
            Candidate(
                **r,
                throughput_bound=bound,
                vs_even=(m / n_workers) / busiest_load,
                vs_key=key_max / busiest_load,
                busiest_utilisation=rate * cpu_cost_us * 1e-6 * busiest_load / m,
            )
        )
    ranking = rank(candidates, goal)
    notes = []
    if cpu_cost_us == 0:
        waits = f"the batch cycle alone ({duration_text(batch_ms)})" if batch_ms else "0"
        notes.append(f"C = 0: no record waits for a worker, so every latency is {waits}; no bound")
    if sample_rate is None:
        notes.append("the sample's times span no time: every record arrives at once")
    overloaded = sorted(
        {c.scheme for c in candidates if c.rebalance_interval and c.busiest_utilisation > 1}
    )
    if overloaded:
        notes.append(
            f"{', '.join(overloaded)}: the busiest worker is past its capacity at R, so live a "
            "migration can outlast the next round, which the controller then does not plan; "
            "these settings may end farther from their max/avg than the model says"
        )
    return Advice(
        goal=goal,
        n_workers=int(n_workers),
        n_sources=sample.n_sources,
        cpu_cost_us=float(cpu_cost_us),
        rate=float(rate),
        batch_ms=float(batch_ms),
        records=m,
        distinct_keys=distinct,
        top_keys=top_keys,
        top_key_counts=top_counts,
        candidates=candidates,
        ranking=ranking,
        recommendation=recommend(ranking, top_keys, goal),
        seconds=time.perf_counter() - began,
        notes=notes,
    )


def figures_at(advice: Advice, sample: Sample, candidate: Candidate, rate: float) -> dict[str, Any]:
    """``candidate``'s figures as the model predicts them at ``rate`` records/s offered (the
    same setting replayed on ``sample`` again), or its figures at the advice's rate if ``rate``
    gives the setting another rebalance interval (a routing-table scheme's is a round at the
    rate)."""
    again = advise(
        sample,
        advice.n_workers,
        advice.cpu_cost_us,
        rate,
        schemes=[candidate.scheme],
        batch_ms=advice.batch_ms,
    )
    same = [c for c in again.candidates if c.label == candidate.label]
    return (same[0] if same else candidate).figures()

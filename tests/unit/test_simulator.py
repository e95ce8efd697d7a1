"""The simulator: decisions equal record-at-a-time routing, hooks, metrics by hand.

Only ``key`` and ``shuffle`` of the real schemes are used; everything else is a small stand-in
defined here, so these tests do not depend on the other schemes' modules.
"""

from __future__ import annotations

import json
from typing import ClassVar

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.base import KeyStatistics, Plan, RoutingTable, Scheme, SchemeError, TableScheme
from operators.keys import KeyBatch, choice_from_hash
from operators.simulator import Router, simulate, source_round


def kg(key: bytes, n_workers: int) -> int:
    """Key grouping's worker, straight from the hash definition (docs/schemes.md#pkg)."""
    return abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers


class LocalTwoChoices(Scheme):
    """PKG-like, one record at a time in plain Python: the less loaded of two hashed workers."""

    name = "test-two"
    keeps_key_on_one_worker = False

    def __init__(self, n_workers: int, *, source: int = 0, n_sources: int = 1, seed: int = 0):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self.loads = [0] * self.n_workers

    def route(self, keys: KeyBatch) -> np.ndarray:
        out = []
        for key in keys.to_list():
            a = abs(mmh3.hash64(key, 13, signed=True)[0]) % self.n_workers
            b = abs(mmh3.hash64(key, 17, signed=True)[0]) % self.n_workers
            chosen = b if self.loads[b] < self.loads[a] else a
            self.loads[chosen] += 1
            out.append(chosen)
        return np.array(out, dtype=np.int32)


class GlobalRoundRobin(Scheme):
    """One object for the whole stream: worker = position in the stream mod W."""

    name = "test-global"
    global_estimation: ClassVar[bool] = True
    created: ClassVar[list[int]] = []

    def __init__(self, n_workers: int, *, source: int = 0, n_sources: int = 1, seed: int = 0):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        GlobalRoundRobin.created.append(source)
        self.seen = 0

    def route(self, keys: KeyBatch) -> np.ndarray:
        out = (self.seen + np.arange(len(keys))) % self.n_workers
        self.seen += len(keys)
        return out.astype(np.int32)


class Probed(Scheme):
    """Key grouping that records every probe it receives."""

    name = "test-probed"

    def __init__(
        self,
        n_workers: int,
        *,
        source: int = 0,
        n_sources: int = 1,
        seed: int = 0,
        probe_interval: int = 3,
    ):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self.probe_interval = probe_interval
        self.routed = 0
        self.probes: list[tuple[int, list[int]]] = []

    def route(self, keys: KeyBatch) -> np.ndarray:
        self.routed += len(keys)
        return choice_from_hash(keys.hash64(13), self.n_workers)

    def observe_global_loads(self, loads: np.ndarray) -> None:
        self.probes.append((self.routed, loads.tolist()))


class Prepared(Scheme):
    """Key grouping that must be told its whole stream first."""

    name = "test-prepared"

    def __init__(self, n_workers: int, *, source: int = 0, n_sources: int = 1, seed: int = 0):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self.prepared: list[bytes] | None = None

    def prepare(self, keys: KeyBatch) -> None:
        self.prepared = keys.to_list()

    def route(self, keys: KeyBatch) -> np.ndarray:
        assert self.prepared is not None, "routed before prepare"
        return choice_from_hash(keys.hash64(13), self.n_workers)


class Speedy(Scheme):
    """Receives the worker speeds; routes by key grouping shifted by ``offset``."""

    name = "test-speedy"

    def __init__(
        self,
        n_workers: int,
        *,
        source: int = 0,
        n_sources: int = 1,
        seed: int = 0,
        worker_speeds: np.ndarray | None = None,
        offset: int = 0,
    ):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self.worker_speeds = worker_speeds
        self.offset = offset

    def route(self, keys: KeyBatch) -> np.ndarray:
        base = choice_from_hash(keys.hash64(13), self.n_workers)
        return ((base + self.offset) % self.n_workers).astype(np.int32)


class OutOfRange(Scheme):
    name = "test-bad"

    def route(self, keys: KeyBatch) -> np.ndarray:
        return np.full(len(keys), self.n_workers, dtype=np.int32)


class ToyTable(TableScheme):
    """Key grouping + table; each plan sends the interval's most frequent key (smallest id on
    ties) to the least loaded worker of the interval (lowest index on ties)."""

    name = "test-table"

    def __init__(self, n_workers: int, *, source: int = 0, n_sources: int = 1, seed: int = 0):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self._ids: list[np.ndarray] = []
        self._workers: list[np.ndarray] = []

    def base_workers(self, keys: KeyBatch) -> np.ndarray:
        return choice_from_hash(keys.hash64(13), self.n_workers)

    def route(self, keys: KeyBatch) -> np.ndarray:
        ids = keys.key_ids()
        workers = self.table.apply(ids, self.base_workers(keys))
        self._ids.append(ids)
        self._workers.append(workers)
        return workers

    def statistics(self, reset: bool = True) -> KeyStatistics:
        ids = np.concatenate(self._ids) if self._ids else np.empty(0, dtype=np.int64)
        workers = np.concatenate(self._workers) if self._workers else np.empty(0, np.int32)
        unique, counts = np.unique(ids, return_counts=True)
        if reset:
            self._ids, self._workers = [], []
        frequency = counts.astype(np.float64)
        return KeyStatistics(
            key_ids=unique,
            frequency=frequency,
            cost=frequency,
            state_size=frequency,
            worker_loads=np.bincount(workers, minlength=self.n_workers),
            records=int(ids.shape[0]),
        )

    def plan(self, stats: KeyStatistics) -> Plan:
        hottest = int(np.lexsort((stats.key_ids, -stats.frequency))[0])
        key = int(stats.key_ids[hottest])
        target = int(np.argmin(stats.worker_loads))
        current = self.table.as_dict()
        was = int(self.table.apply(np.array([key]), np.array([-1]))[0])
        if was == -1:
            was = None  # type: ignore[assignment]
        entries = {**current, key: target}
        moved = np.array([key] if was != target else [], dtype=np.int64)
        return Plan(
            table=RoutingTable(np.array(list(entries)), np.array(list(entries.values()))),
            moved_keys=moved,
            migration_cost=float(stats.state_size[hottest]) if moved.size else 0.0,
            feasible=True,
            planning_seconds=0.25,
        )


STAND_INS = (LocalTwoChoices, GlobalRoundRobin, Probed, Prepared, Speedy, OutOfRange, ToyTable)


@pytest.fixture(autouse=True)
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    schemes = dict(registry._SCHEMES)
    schemes.update({cls.name: f"{__name__}:{cls.__name__}" for cls in STAND_INS})
    monkeypatch.setattr(registry, "_SCHEMES", schemes)
    GlobalRoundRobin.created.clear()


def reference_workers(name: str, keys: list[bytes], n_workers: int, n_sources: int) -> list[int]:
    objects = [
        registry.create(name, n_workers, source=s, n_sources=n_sources) for s in range(n_sources)
    ]
    return [
        int(objects[i % n_sources].route(KeyBatch.from_bytes([key]))[0])
        for i, key in enumerate(keys)
    ]


def reference_makespan(workers: list[int], speeds: list[float]) -> float:
    interarrival = 1.0 / sum(speeds)
    finish = [0.0] * len(speeds)
    for t, w in enumerate(workers):
        finish[w] = max(finish[w], t * interarrival) + 1.0 / speeds[w]
    return max(finish)


def test_shuffle_metrics_by_hand() -> None:
    keys = KeyBatch.from_strings(["a", "a", "a", "b", "b", "c"])
    result = simulate("shuffle", keys, n_workers=2, checkpoints=6)
    assert result.workers.tolist() == [0, 1, 0, 1, 0, 1]
    assert result.checkpoint_records.tolist() == [1, 2, 3, 4, 5, 6]
    # loads after t records: [1,0] [1,1] [2,1] [2,2] [3,2] [3,3]
    assert result.imbalance_series.tolist() == [0.5, 0, 0.5, 0, 0.5, 0]
    assert result.imbalance_avg == 0.25
    assert result.imbalance_avg_fraction == 0.25 / 6
    assert result.imbalance_final == 0.0
    assert result.max_avg_ratio == 1.0
    assert result.distinct_keys == 3
    assert result.replication == 5 / 3  # a:{0,1} b:{1,0} c:{1}
    # arrivals every 1/2: worker 0 finishes 1, 2, 3; worker 1: 1.5, 2.5, 3.5
    assert result.exec_time == 3.5
    assert result.exec_time_vs_shuffle == 1.0
    assert result.table_entries == 0 and result.migrated_fraction == 0.0


def test_key_grouping_metrics_by_hand() -> None:
    words = ["x", "y", "z", "x", "x", "w", "x", "y"]
    keys = KeyBatch.from_strings(words)
    result = simulate("key", keys, n_workers=3, checkpoints=4)
    expected = [kg(w.encode(), 3) for w in words]
    assert result.workers.tolist() == expected
    assert result.checkpoint_records.tolist() == [2, 4, 6, 8]
    loads = [np.bincount(expected[:t], minlength=3) for t in (2, 4, 6, 8)]
    series = [lo.max() - lo.mean() for lo in loads]
    assert result.imbalance_series.tolist() == pytest.approx(series)
    assert result.imbalance_final == pytest.approx(series[-1] / 8)
    assert result.imbalance_avg_fraction == pytest.approx(np.mean(series) / 8)
    assert result.max_avg_ratio == pytest.approx(loads[-1].max() / (8 / 3))
    assert result.final_loads.tolist() == loads[-1].tolist()
    assert result.replication == 1.0 and result.distinct_keys == 4
    shuffle = [(i % 3) for i in range(8)]
    assert result.exec_time_vs_shuffle == pytest.approx(
        reference_makespan(expected, [1, 1, 1]) / reference_makespan(shuffle, [1, 1, 1])
    )


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "hot"]), min_size=1, max_size=60),
    n_workers=st.integers(1, 5),
    n_sources=st.integers(1, 4),
    batch_size=st.integers(1, 17),
    checkpoints=st.integers(1, 12),
)
def test_batches_decide_as_record_at_a_time(
    words: list[str], n_workers: int, n_sources: int, batch_size: int, checkpoints: int
) -> None:
    keys = [w.encode() for w in words]
    result = simulate(
        "test-two",
        KeyBatch.from_bytes(keys),
        n_workers,
        n_sources,
        checkpoints=checkpoints,
        batch_size=batch_size,
    )
    expected = reference_workers("test-two", keys, n_workers, n_sources)
    assert result.workers.tolist() == expected
    for position, loads in zip(result.checkpoint_records, result.checkpoint_loads, strict=True):
        assert loads.tolist() == np.bincount(expected[:position], minlength=n_workers).tolist()
    assert result.final_loads.tolist() == np.bincount(expected, minlength=n_workers).tolist()
    pairs = {(k, w) for k, w in zip(keys, expected, strict=True)}
    assert result.replication == pytest.approx(len(pairs) / len(set(keys)))


def test_result_does_not_depend_on_batch_size() -> None:
    keys = KeyBatch.from_ints(np.random.default_rng(3).zipf(1.5, 5000) % 300)
    a = simulate("test-two", keys, 7, 3, batch_size=1000)
    b = simulate("test-two", KeyBatch(keys.data, keys.offsets), 7, 3, batch_size=33)
    assert np.array_equal(a.workers, b.workers)
    assert np.array_equal(a.imbalance_series, b.imbalance_series)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.integers(1, 8), st.integers(1, 6))
def test_shuffle_imbalance_is_at_most_one_record_per_source(m: int, w: int, s: int) -> None:
    keys = KeyBatch.from_ints(np.zeros(m, dtype=np.int64))
    result = simulate("shuffle", keys, w, s, checkpoints=m)
    for loads in result.checkpoint_loads:
        assert loads.max() - loads.min() <= s
    # and the shuffle reference of exec_time_vs_shuffle is the same routing
    assert result.exec_time_vs_shuffle == 1.0


def test_global_estimation_routes_the_interleaved_stream_through_one_object() -> None:
    keys = KeyBatch.from_ints(np.arange(23))
    result = simulate("test-global", keys, 4, 3, batch_size=5)
    assert GlobalRoundRobin.created == [0]
    assert result.workers.tolist() == [i % 4 for i in range(23)]
    assert result.n_sources == 3
    # exec time's shuffle reference still uses three sources: source s starts at worker s
    shuffle = [((i % 3) + i // 3) % 4 for i in range(23)]
    assert result.exec_time_shuffle == pytest.approx(reference_makespan(shuffle, [1] * 4))


def test_per_source_gives_a_global_estimation_scheme_one_object_per_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(GlobalRoundRobin, "created", [])
    keys = KeyBatch.from_ints(np.arange(23))
    result = simulate("test-global", keys, 4, 3, seed=7, batch_size=5, per_source=True)
    assert GlobalRoundRobin.created == [0, 1, 2]
    # record i is source (i mod 3)'s (i // 3)-th: each object counts only its own records
    assert result.workers.tolist() == [(i // 3) % 4 for i in range(23)]
    # made as the live grouping stage makes its sources' objects (pipeline/stages/grouping.py)
    router = Router("test-global", 4, 3, seed=7, per_source=True)
    assert [(o.source, o.n_sources, o.seed) for o in router.objects] == [
        (s, 3, 7) for s in range(3)
    ]
    assert not router.global_estimation
    # the default is unchanged: one object for the whole stream
    assert len(Router("test-global", 4, 3, seed=7).objects) == 1


def test_probes_give_every_source_the_true_loads() -> None:
    words = [f"k{i % 5}".encode() for i in range(10)]
    router = Router("test-probed", 3, 2)
    workers = np.concatenate(
        [router.route(KeyBatch.from_bytes(words[a:b])) for a, b in ((0, 4), (4, 5), (5, 10))]
    )
    expected = [kg(k, 3) for k in words]
    assert workers.tolist() == expected
    # before records 3, 6 and 9 (0-based positions); source 0 had routed 2, 3, 5 records then
    calls = [(t, np.bincount(expected[:t], minlength=3).tolist()) for t in (3, 6, 9)]
    assert router.objects[0].probes == [((t + 1) // 2, loads) for t, loads in calls]
    assert router.objects[1].probes == [(t // 2, loads) for t, loads in calls]


def test_no_probe_or_rebalance_after_the_last_record() -> None:
    router = Router("test-probed", 2, 1)
    router.route(KeyBatch.from_ints(np.arange(6)))
    assert [t for t, _ in router.objects[0].probes] == [3]


def test_prepare_gets_each_source_its_whole_stream_first() -> None:
    words = [f"w{i}".encode() for i in range(11)]
    result = simulate("test-prepared", KeyBatch.from_bytes(words), 3, 2, batch_size=4)
    assert result.workers.tolist() == [kg(k, 3) for k in words]
    router = Router("test-prepared", 3, 2)
    router.prepare(KeyBatch.from_bytes(words))
    assert router.objects[0].prepared == words[0::2]
    assert router.objects[1].prepared == words[1::2]


def test_worker_speeds_reach_the_scheme_and_the_queue_model() -> None:
    words = [f"s{i % 7}".encode() for i in range(40)]
    speeds = np.array([1.0, 2.0, 0.5])
    result = simulate(
        "test-speedy", KeyBatch.from_bytes(words), 3, 2, worker_speeds=speeds, params={"offset": 1}
    )
    expected = [(kg(k, 3) + 1) % 3 for k in words]
    assert result.workers.tolist() == expected
    shuffle = [((i % 2) + i // 2) % 3 for i in range(40)]
    assert result.exec_time == pytest.approx(reference_makespan(expected, speeds.tolist()))
    assert result.exec_time_shuffle == pytest.approx(reference_makespan(shuffle, speeds.tolist()))
    router = Router("test-speedy", 3, 2, worker_speeds=speeds)
    assert all(np.array_equal(o.worker_speeds, speeds) for o in router.objects)
    assert Router("test-speedy", 3).objects[0].worker_speeds is None
    assert Router("key", 3, worker_speeds=speeds).objects[0].params()["n_workers"] == 3


def test_table_scheme_controller_rounds() -> None:
    rng = np.random.default_rng(5)
    values = rng.zipf(1.3, 200) % 20
    keys = KeyBatch.from_ints(values)
    result = simulate("test-table", keys, 3, 2, rebalance_interval=50, batch_size=7)
    ids = keys.key_ids()
    rounds = result.migrations
    assert [r["at_record"] for r in rounds] == [50, 100, 150]
    assert [r["version"] for r in rounds] == [1, 2, 3]
    assert all(r["total_state"] == 50 and r["planning_seconds"] == 0.25 for r in rounds)
    table: dict[int, int] = {}
    for r in rounds:
        start = r["at_record"] - 50
        window = ids[start : r["at_record"]]
        unique, counts = np.unique(window, return_counts=True)
        hottest = unique[np.lexsort((unique, -counts))[0]]
        routed = result.workers[start : r["at_record"]]
        target = int(np.argmin(np.bincount(routed, minlength=3)))
        previous = table.get(int(hottest), kg(str(values[ids == hottest][0]).encode(), 3))
        moved = previous != target
        assert r["moved_keys"] == int(moved)
        assert r["migrated_state"] == (counts.max() if moved else 0)
        table[int(hottest)] = target
        # from the round on, the key goes where the table says, from both sources
        after = result.workers[r["at_record"] :][ids[r["at_record"] :] == hottest]
        if r is rounds[-1]:
            assert set(after.tolist()) <= {target}
        assert r["table_entries"] == len(table)
    assert result.table_entries == len(table)
    moved_total = sum(r["migrated_state"] for r in rounds)
    assert result.migrated_fraction == pytest.approx(moved_total / 150)


def test_per_source_rounds_are_planned_once_every_source_reported_its_share() -> None:
    # S = 2, a round every 4 records: each source reports after every 2 of its own records.
    # Source 0 reads records 0-3 and 6, source 1 records 4, 5 and 7: source 0 reports after
    # records 1 and 3 (and 6), source 1 after record 5, so round 1 is planned after record 5,
    # on source 0's records 0-1 and source 1's 4-5; source 0's records 2-3 wait for round 2,
    # which never comes (source 1 reads only three).
    sources = np.array([0, 0, 0, 0, 1, 1, 0, 1])
    keys = KeyBatch.from_bytes([b"a", b"a", b"b", b"b", b"c", b"a", b"b", b"c"])
    a = int(KeyBatch.from_bytes([b"a"]).key_ids()[0])
    for chunks in (((0, 8),), ((0, 3), (3, 5), (5, 8))):
        router = Router("test-table", 3, 2, rebalance_interval=4, per_source=True)
        workers = np.concatenate([router.route(keys.slice(i, j), sources[i:j]) for i, j in chunks])
        (round_,) = router.migrations
        assert (round_["at_record"], round_["total_state"]) == (6, 4)
        # "a" is the round's hottest key (3 of its 4 records): both sources' table holds it.
        tables = [obj.table.as_dict() for obj in router.objects]
        assert list(tables[0]) == [a] and tables[0] == tables[1]
        assert workers.shape == (8,)
    assert source_round(4, 2) == 2


def test_rebalance_interval_is_ignored_for_ordinary_schemes() -> None:
    result = simulate("key", KeyBatch.from_ints(np.arange(30)), 2, rebalance_interval=5)
    assert result.migrations == [] and result.migrated_fraction == 0.0


def test_summary_is_json_with_the_contract_fields() -> None:
    result = simulate("key", KeyBatch.from_ints(np.arange(100) % 7), 4, 2)
    summary = json.loads(json.dumps(result.summary()))
    for name in (
        "records",
        "distinct_keys",
        "imbalance_final",
        "imbalance_avg_fraction",
        "imbalance_avg",
        "max_avg_ratio",
        "replication",
        "table_entries",
        "migrated_fraction",
        "exec_time_vs_shuffle",
        "routing_rate",
    ):
        assert name in summary
    assert summary["records"] == 100 and summary["distinct_keys"] == 7
    assert summary["checkpoints"] == 100


def test_errors_are_one_line_scheme_errors() -> None:
    keys = KeyBatch.from_ints(np.arange(5))
    with pytest.raises(SchemeError, match="valid schemes: key, shuffle, pkg"):
        simulate("nope", keys, 2)
    with pytest.raises(SchemeError, match="number of workers must be >= 1"):
        simulate("key", keys, 0)
    with pytest.raises(SchemeError, match="number of sources must be >= 1"):
        simulate("key", keys, 2, 0)
    with pytest.raises(SchemeError, match="worker speeds"):
        simulate("key", keys, 2, worker_speeds=np.array([1.0]))
    with pytest.raises(SchemeError, match="no records"):
        simulate("key", KeyBatch.from_ints(np.empty(0, dtype=np.int64)), 2)
    with pytest.raises(SchemeError, match=r"outside 0\.\.W-1"):
        simulate("test-bad", keys, 2)
    with pytest.raises(SchemeError, match="unknown parameter"):
        simulate("key", keys, 2, params={"d": 3})

"""PKG (local, global, probing) against an independent pure-Python model built from mmh3."""

from __future__ import annotations

from fractions import Fraction

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.base import SchemeError
from operators.keys import KeyBatch
from operators.schemes.pkg import (
    DEFAULT_PROBE_INTERVAL,
    GlobalPartialKeyGrouping,
    PartialKeyGrouping,
    ProbingPartialKeyGrouping,
)
from operators.selection import least_loaded


def reference_candidates(key: bytes, n_workers: int) -> tuple[int, int]:
    """docs/schemes.md#pkg's definition, from the hash library directly: |h_seed(key)| mod W."""
    return (
        abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers,
        abs(mmh3.hash64(key, 17, signed=True)[0]) % n_workers,
    )


def reference_pkg(
    keys: list[bytes],
    n_workers: int,
    n_sources: int = 1,
    probe_interval: int | None = None,
) -> list[int]:
    """Record i comes from source i mod S. Each source keeps its own estimate; with probing,
    after every ``probe_interval`` records each estimate becomes true_loads / S (exactly)."""
    true_loads = [0] * n_workers
    estimates = [[Fraction(0)] * n_workers for _ in range(n_sources)]
    chosen = []
    for i, key in enumerate(keys):
        estimate = estimates[i % n_sources]
        first, second = reference_candidates(key, n_workers)
        worker = second if estimate[second] < estimate[first] else first
        estimate[worker] += 1
        true_loads[worker] += 1
        chosen.append(worker)
        if probe_interval and (i + 1) % probe_interval == 0:
            estimates = [
                [Fraction(load, n_sources) for load in true_loads] for _ in range(n_sources)
            ]
    return chosen


def drive(
    name: str,
    keys: list[bytes],
    n_workers: int,
    n_sources: int = 1,
    batch: int = 7,
    **params: object,
) -> list[int]:
    """Routes like the simulator does: record i to source i mod S, in batches per source, the
    true loads handed to every source after each ``probe_interval`` records of the stream."""
    sources = [
        registry.create(name, n_workers, source=s, n_sources=n_sources, **params)
        for s in range(n_sources)
    ]
    interval = getattr(sources[0], "probe_interval", None) or len(keys) or 1
    out = np.full(len(keys), -1, dtype=np.int64)
    true_loads = np.zeros(n_workers, dtype=np.int64)
    for start in range(0, len(keys), interval):
        segment = np.arange(start, min(start + interval, len(keys)))
        for s, scheme in enumerate(sources):
            own = segment[segment % n_sources == s]
            for b in range(0, len(own), batch):
                index = own[b : b + batch]
                workers = scheme.route(KeyBatch.from_bytes([keys[i] for i in index]))
                out[index] = workers
                np.add.at(true_loads, workers, 1)
        if segment[-1] + 1 == start + interval:
            for scheme in sources:
                scheme.observe_global_loads(true_loads.copy())
    return out.tolist()


def zipf_keys(seed: int, n: int, n_keys: int = 200, z: float = 1.1) -> list[bytes]:
    rng = np.random.default_rng(seed)
    weights = np.arange(1, n_keys + 1, dtype=np.float64) ** -z
    ranks = rng.choice(n_keys, size=n, p=weights / weights.sum())
    return [b"k%d" % r for r in ranks]


def test_storm_alternation() -> None:
    """Storm's PartialKeyGroupingTest with tasks 0..5: one key alternates between its two
    tasks (c1 != c2, c3 == c1). By hand from mmh3: "key1" has candidates 4 and 1."""
    assert reference_candidates(b"key1", 6) == (4, 1)
    pkg = PartialKeyGrouping(6)
    choices = [pkg.route(KeyBatch.from_strings(["key1"])).tolist()[0] for _ in range(3)]
    assert choices[0] != choices[1] and choices[2] == choices[0]
    assert choices == [4, 1, 4]


def test_candidates_are_the_two_hash_choices() -> None:
    keys = [b"key1", b"test", b"", b"x" * 40, *zipf_keys(0, 50)]
    for n_workers in (1, 2, 6, 10, 100):
        got = PartialKeyGrouping(n_workers).candidates(KeyBatch.from_bytes(keys)).tolist()
        assert got == [list(reference_candidates(k, n_workers)) for k in keys]


@pytest.mark.parametrize("n_workers", [1, 2, 5, 10, 50, 100])
@pytest.mark.parametrize("n_sources", [1, 3])
def test_decisions_equal_the_independent_model(n_workers: int, n_sources: int) -> None:
    keys = zipf_keys(n_workers * 10 + n_sources, 3000)
    assert drive("pkg", keys, n_workers, n_sources, batch=101) == reference_pkg(
        keys, n_workers, n_sources
    )


def test_fixed_vector_by_hand() -> None:
    """W=6: key1 -> {4, 1}, test -> {4, 5}. Loads by hand: key1 -> 4; test: 4 has 1 > 0 -> 5;
    key1: 4 (1) vs 1 (0) -> 1; test: 4 (1) vs 5 (1), tie -> 4; key1: 4 (2) vs 1 (1) -> 1."""
    keys = ["key1", "test", "key1", "test", "key1"]
    assert PartialKeyGrouping(6).route(KeyBatch.from_strings(keys)).tolist() == [4, 5, 1, 4, 1]


def test_fused_kernel_equals_candidates_then_least_loaded() -> None:
    """The fast path makes exactly Storm's split decision: candidates, then the selector."""
    keys = KeyBatch.from_bytes(zipf_keys(3, 20_000, n_keys=5000, z=0.9))
    for n_workers in (3, 10, 64):
        pkg = PartialKeyGrouping(n_workers)
        loads = np.zeros(n_workers, dtype=np.int64)
        expected = least_loaded(pkg.candidates(keys), loads)
        assert pkg.route(keys).tolist() == expected.tolist()
        assert pkg.load_estimate.tolist() == loads.tolist()


@given(
    st.lists(st.integers(0, 30), max_size=200),
    st.integers(1, 12),
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
)
@settings(max_examples=60, deadline=None)
def test_batches_decide_as_one_record_at_a_time(
    ints: list[int], n_workers: int, cuts: list[int]
) -> None:
    keys = KeyBatch.from_ints(np.array(ints, dtype=np.int64))
    whole = PartialKeyGrouping(n_workers).route(keys).tolist()
    pieces = PartialKeyGrouping(n_workers)
    got: list[int] = []
    position, step = 0, 0
    while position < len(ints):
        stop = min(len(ints), position + cuts[step % len(cuts)])
        got += pieces.route(keys.slice(position, stop)).tolist()
        position, step = stop, step + 1
    assert got == whole
    one_by_one = PartialKeyGrouping(n_workers)
    singles = [one_by_one.route(keys.slice(i, i + 1)).tolist()[0] for i in range(len(ints))]
    assert singles == whole


@given(st.lists(st.integers(0, 40), max_size=300), st.integers(1, 16), st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_each_key_uses_at_most_its_two_candidates(
    ints: list[int], n_workers: int, n_sources: int
) -> None:
    keys = [str(i).encode() for i in ints]
    workers = drive("pkg", keys, n_workers, n_sources)
    placement: dict[bytes, set[int]] = {}
    for key, worker in zip(keys, workers, strict=True):
        placement.setdefault(key, set()).add(worker)
    for key, used in placement.items():
        assert len(used) <= 2
        assert used <= set(reference_candidates(key, n_workers))


def test_local_loads_count_own_records_and_seed_does_not_matter() -> None:
    keys = KeyBatch.from_bytes(zipf_keys(4, 5000))
    first = PartialKeyGrouping(7, seed=1)
    second = PartialKeyGrouping(7, seed=99)
    workers = first.route(keys)
    assert second.route(keys).tolist() == workers.tolist()
    assert first.load_estimate.tolist() == np.bincount(workers, minlength=7).tolist()
    assert registry.create("pkg", 7, seed=5).route(keys).tolist() == workers.tolist()


def test_one_worker_gets_everything() -> None:
    assert PartialKeyGrouping(1).route(KeyBatch.from_strings(["a", "b", ""])).tolist() == [0] * 3


def test_pkg_balances_a_skewed_stream_that_hashing_cannot() -> None:
    """p1 = 1/H(200, 1.1) ~ 0.18 < 2/W for W = 5: PKG keeps max - avg at a few records (the
    paper's "nearly-perfect load balance", §V Q1); key grouping piles up thousands."""
    keys = KeyBatch.from_bytes(zipf_keys(5, 20_000))
    pkg_loads = np.bincount(PartialKeyGrouping(5).route(keys), minlength=5)
    key_loads = np.bincount(registry.create("key", 5).route(keys), minlength=5)
    assert pkg_loads.max() - pkg_loads.mean() <= 5
    assert key_loads.max() - key_loads.mean() > 1000


def test_global_variant_is_one_object_for_the_whole_stream() -> None:
    assert GlobalPartialKeyGrouping.global_estimation is True
    assert not getattr(PartialKeyGrouping, "global_estimation", False)
    assert not getattr(ProbingPartialKeyGrouping, "global_estimation", False)
    keys = zipf_keys(6, 2000)
    # Routing the interleaved stream through one object = PKG with S = 1 on that stream.
    assert drive("pkg-global", keys, 10, 1) == reference_pkg(keys, 10, 1)


def test_probe_replaces_the_estimate_with_the_sources_share_of_true_loads() -> None:
    """By hand, W=6, S=2, key1 -> {4, 1}: after a probe of true loads (0,10,0,0,3,0) the
    estimate is (0,5,0,0,1.5,0); key1 then goes to 4 while 4's estimate (1.5, 2.5, 3.5, 4.5)
    is <= 5, then to 1 once 4 reaches 5.5 > 5, then back to 4 (5.5 < 6). Setting the estimate
    to the true loads (no /S) would send 8 records to 4 first; flooring L/S would send 5."""
    scheme = ProbingPartialKeyGrouping(6, source=0, n_sources=2)
    scheme.observe_global_loads(np.array([0, 10, 0, 0, 3, 0]))
    assert scheme.load_estimate.tolist() == [0, 5, 0, 0, 1.5, 0]
    route = scheme.route(KeyBatch.from_strings(["key1"] * 6)).tolist()
    assert route == [4, 4, 4, 4, 1, 4]
    assert scheme.load_estimate.tolist() == [0, 6, 0, 0, 6.5, 0]


@pytest.mark.parametrize("n_sources", [1, 2, 5])
@pytest.mark.parametrize("probe_interval", [1, 10, 333])
def test_probing_equals_the_independent_model(n_sources: int, probe_interval: int) -> None:
    keys = zipf_keys(n_sources * 1000 + probe_interval, 2000)
    got = drive("pkg-probing", keys, 10, n_sources, probe_interval=probe_interval)
    assert got == reference_pkg(keys, 10, n_sources, probe_interval)


def test_probing_with_one_source_changes_nothing() -> None:
    keys = zipf_keys(7, 3000)
    probed = drive("pkg-probing", keys, 8, 1, probe_interval=50)
    assert probed == drive("pkg", keys, 8, 1) == reference_pkg(keys, 8, 1)


def test_probing_parameters() -> None:
    assert DEFAULT_PROBE_INTERVAL == 15_000
    assert ProbingPartialKeyGrouping(4).probe_interval == 15_000
    scheme = registry.create("pkg-probing", 4, n_sources=3, source=2, probe_interval=10)
    assert scheme.probe_interval == 10
    assert scheme.params() == {"n_workers": 4, "n_sources": 3, "seed": 0, "probe_interval": 10}
    assert PartialKeyGrouping.probe_interval is None
    with pytest.raises(SchemeError, match="probe_interval"):
        registry.create("pkg-probing", 4, probe_interval=0)
    with pytest.raises(ValueError, match="4 worker loads"):
        scheme.observe_global_loads(np.zeros(3))
    with pytest.raises(SchemeError, match="unknown parameter"):
        registry.create("pkg", 4, probe_interval=10)


def test_pkg_ignores_global_loads() -> None:
    scheme = PartialKeyGrouping(6)
    scheme.observe_global_loads(np.array([0, 100, 0, 0, 0, 0]))
    assert scheme.route(KeyBatch.from_strings(["key1"] * 3)).tolist() == [4, 1, 4]


def test_registry_names_and_flags() -> None:
    for name, cls in [
        ("pkg", PartialKeyGrouping),
        ("pkg-global", GlobalPartialKeyGrouping),
        ("pkg-probing", ProbingPartialKeyGrouping),
    ]:
        assert registry.scheme_class(name) is cls
        assert cls.name == name
        assert cls.keeps_key_on_one_worker is False


def test_table2_experiment_quick_sits_on_the_exact_top_key_bounds() -> None:
    """Whatever the placement, the top key's c records add at least c/2 (PKG) or c
    (key-affine schemes) to one worker, so I(m) >= c/2 - m/W, resp. c - m/W."""
    from bench.experiments import pkg_table2

    result = pkg_table2.run(quick=True)
    assert result.name == "pkg_table2" and "| PKG |" in result.markdown
    records = result.data["records"]
    workers = result.data["workers"]
    for dataset, info in result.data["datasets"].items():
        _, keys = pkg_table2.workload(dataset, records)
        top = int(np.unique(keys.key_ids(), return_counts=True)[1].max())
        for scheme, _ in pkg_table2.SCHEMES:
            share = top / 2 if scheme == "pkg" else top
            for w, final in zip(workers, info["cells"][scheme]["final"], strict=True):
                assert final >= share - records / w - 1e-6
        # Off-Greedy's longest-first placement ends perfectly balanced at W = 5 (m = 50,000).
        assert info["cells"]["greedy-offline"]["final"][0] == 0
    assert set(result.figures) == {"imbalance"}


def test_estimation_experiment_quick() -> None:
    from bench.experiments import pkg_estimation

    assert pkg_estimation.jaccard(np.array([0, 1, 2]), np.array([0, 1, 3])) == 2 / 4
    result = pkg_estimation.run(quick=True)
    assert result.name == "pkg_estimation"
    for info in result.data["datasets"].values():
        columns = info["columns"]
        assert set(columns) == {"H", "G", "L5", "L5P", "L5P-fast"}
        assert all(0 < v < 1 for values in columns.values() for v in values)
        assert all(0 < v < 1 for v in info["jaccard"]["L5"])
    assert set(result.figures) == {"fraction", "through_time"}


def test_local_estimation_with_one_source_is_global() -> None:
    from operators.simulator import simulate

    keys = KeyBatch.from_bytes(zipf_keys(8, 5000))
    local = simulate("pkg", keys, 10, 1, checkpoints=10)
    exact = simulate("pkg-global", keys, 10, 7, checkpoints=10)
    assert local.workers.tolist() == exact.workers.tolist() == reference_pkg(keys.to_list(), 10)

"""D-Choices and W-Choices against a pure-Python transcription of the authors' simulator."""

from __future__ import annotations

import itertools
import math

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators import registry
from operators.base import SchemeError
from operators.keys import KeyBatch
from operators.schemes.choices import DChoices, WChoices, choices_from_bounds


def reference_d(p1: float, p_head: float, n_head: int, n: int, epsilon: float) -> int:
    """LBDChoice's do-while loop (anisnasir/SLBSimulator), then our clamp to [2, n]."""
    q = (n - 1) / n
    p_tail = 1 - p_head
    d = math.floor(p1 * n + 0.5)
    while True:
        if d >= n:
            return n
        b_hd = 1 - q ** (n_head * d)
        sum1 = p_head + p_tail * b_hd**2
        b_d = 1 - q**d
        sum2 = p1 + (p_head - p1) * b_d**d + p_tail * b_d**2
        if sum1 <= b_hd + epsilon and sum2 <= b_d + epsilon:
            return min(max(d, 2), n)
        d += 1


def pkg_pair(key: bytes, n: int) -> list[int]:
    return [abs(mmh3.hash64(key, seed, signed=True)[0]) % n for seed in (13, 17)]


def further_choice(key: bytes, j: int, n: int) -> int:
    """Choice j >= 2: high 32 bits of (h13 + j·h17) mod 2^64, scaled to n."""
    h1 = mmh3.hash64(key, 13, signed=True)[0]
    h2 = mmh3.hash64(key, 17, signed=True)[0]
    mixed = (h1 + j * h2) % 2**64
    return ((mixed >> 32) * n) >> 32


def reference_route(
    keys: list[bytes], n: int, threshold_t: float, head_to_all: bool, epsilon: float = 0.001
) -> list[int]:
    """Record-at-a-time D-/W-Choices while the summary never evicts (exact counts, no error)."""
    theta = 2 / (n * threshold_t)
    counts: dict[bytes, int] = {}
    top: bytes | None = None
    loads = [0] * n
    out = []
    for m, key in enumerate(keys, start=1):
        counts[key] = counts.get(key, 0) + 1
        if top is None or counts[key] > counts[top]:
            top = key
        candidates = pkg_pair(key, n)
        if counts[key] > theta * m:
            if head_to_all:
                candidates = list(range(n))
            else:
                head = [c for c in counts.values() if c > theta * m]
                d = reference_d(counts[top] / m, sum(head) / m, len(head), n, epsilon)
                if d >= n:
                    candidates = list(range(n))
                else:
                    candidates += [further_choice(key, j, n) for j in range(2, d)]
        chosen = candidates[0]
        for c in candidates[1:]:
            if loads[c] < loads[chosen]:
                chosen = c
        loads[chosen] += 1
        out.append(chosen)
    return out


def test_d_from_the_bounds_by_hand() -> None:
    # n = 10, q = 0.9, p1 = 0.2, p_H = 0.3 over h = 2 head keys, p_T = 0.7; start d = 2.
    # d = 2: 1 - 0.9^4 = 0.3439; 0.3 + 0.7·0.3439² = 0.3828 > 0.3449: fails.
    # d = 3: 1 - 0.9^6 = 0.4686; 0.3 + 0.7·0.4686² = 0.4537 <= 0.4696, and
    #        1 - 0.9^3 = 0.271; 0.2 + 0.1·0.271³ + 0.7·0.271² = 0.2534 <= 0.272: holds.
    assert choices_from_bounds(0.2, 0.3, 2, 10, 0.001) == 3
    # round(0.5·10) = 5; the second bound fails until d = 10 = n: every worker.
    assert choices_from_bounds(0.5, 0.6, 2, 10, 0.001) == 10
    # p1·n >= n from the start: every worker, without evaluating the bounds.
    assert choices_from_bounds(1.0, 1.0, 1, 8, 0.001) == 8
    # A light head with round(p1·n) = 0 meets the bounds at d = 0: raised to PKG's 2.
    assert choices_from_bounds(0.0004, 0.0004, 1, 100, 0.001) == 2
    # One worker: d = n = 1.
    assert choices_from_bounds(0.5, 0.5, 1, 1, 0.001) == 1


@settings(max_examples=300, deadline=None)
@given(
    p1=st.floats(min_value=0.0, max_value=1.0),
    extra=st.floats(min_value=0.0, max_value=1.0),
    n_head=st.integers(min_value=1, max_value=100),
    n=st.integers(min_value=1, max_value=200),
    epsilon=st.sampled_from([0.0, 0.001, 0.01]),
)
def test_d_equals_reference_loop(
    p1: float, extra: float, n_head: int, n: int, epsilon: float
) -> None:
    p_head = p1 + (1 - p1) * extra
    assert choices_from_bounds(p1, p_head, n_head, n, epsilon) == reference_d(
        p1, p_head, n_head, n, epsilon
    )


key_streams = st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=300)


@settings(max_examples=80, deadline=None)
@given(
    stream=key_streams,
    n=st.integers(min_value=1, max_value=40),
    threshold_t=st.sampled_from([0.5, 1.0, 2.0, 10.0]),
    name=st.sampled_from(["d-choices", "w-choices"]),
)
def test_decisions_equal_reference(
    stream: list[int], n: int, threshold_t: float, name: str
) -> None:
    keys = [str(k).encode() for k in stream]
    scheme = registry.create(name, n, threshold_t=threshold_t)  # capacity 100 > 31 keys
    got = scheme.route(KeyBatch.from_bytes(keys)).tolist()
    assert got == reference_route(keys, n, threshold_t, head_to_all=name == "w-choices")


@pytest.mark.parametrize("cls", [DChoices, WChoices])
def test_without_head_keys_it_is_pkg(cls: type) -> None:
    # θ = 2/(n·T) above 1 means nothing is head: exactly PKG with local load estimation.
    rng = np.random.default_rng(3)
    keys = [str(k).encode() for k in rng.zipf(1.5, 3000) % 500]
    scheme = cls(7, threshold_t=0.1)
    got = scheme.route(KeyBatch.from_bytes(keys)).tolist()
    loads = [0] * 7
    expected = []
    for key in keys:
        first, second = pkg_pair(key, 7)
        chosen = second if loads[second] < loads[first] else first
        loads[chosen] += 1
        expected.append(chosen)
    assert got == expected


def test_storm_alternation_for_a_tail_key() -> None:
    # Storm's PartialKeyGroupingTest: one key alternates between its two tasks.
    scheme = DChoices(6, threshold_t=0.1)
    first, second = pkg_pair(b"key", 6)
    assert first != second
    got = scheme.route(KeyBatch.from_strings(["key"] * 4)).tolist()
    assert got == [first, second, first, second]


def test_w_choices_head_key_goes_to_every_worker_in_turn() -> None:
    assert WChoices(4).route(KeyBatch.from_strings(["a"] * 8)).tolist() == [0, 1, 2, 3] * 2


def zipf_keys(n: int, z: float, n_keys: int, seed: int) -> KeyBatch:
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_keys + 1, dtype=np.float64) ** -z
    cdf = np.cumsum(p) / p.sum()
    return KeyBatch.from_ints(np.searchsorted(cdf, rng.random(n)) + 1)


def test_d_choices_key_stays_within_its_first_max_d_candidates() -> None:
    # With evictions in play (10^4 keys, capacity 100): a key's workers are always a subset
    # of its first d_max candidates, d_max the largest d it was given, so at most d_max.
    from operators.schemes.choices import _classify, bound_tables
    from operators.sketches.spacesaving import SpaceSaving

    n = 20
    keys = zipf_keys(30_000, 1.1, 10_000, seed=4)
    workers = DChoices(n).route(keys)
    summary = SpaceSaving(100)
    n_choices = _classify(
        summary.state,
        np.zeros(1, dtype=np.int64),
        keys.key_ids(),
        2 / (n * 10.0),
        0.001,
        False,
        *bound_tables(n, 100),
    )
    d_of = np.where(n_choices == 0, 2, n_choices)
    key_list = keys.to_list()
    largest: dict[bytes, int] = {}
    used: dict[bytes, set[int]] = {}
    for key, d, w in zip(key_list, d_of.tolist(), workers.tolist(), strict=True):
        largest[key] = max(largest.get(key, 2), d)
        used.setdefault(key, set()).add(w)
    assert any(d > 2 for d in largest.values())
    for key, workers_used in used.items():
        d = largest[key]
        allowed = (
            set(range(n))
            if d >= n
            else set(pkg_pair(key, n)) | {further_choice(key, j, n) for j in range(2, d)}
        )
        assert workers_used <= allowed
        assert len(workers_used) <= d


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=6))
def test_batch_boundaries_do_not_change_decisions(cuts: list[int]) -> None:
    keys = zipf_keys(5000, 1.2, 2000, seed=9)
    for name in ("d-choices", "w-choices"):
        whole = registry.create(name, 12).route(keys)
        scheme = registry.create(name, 12)
        bounds = [0, *sorted(cuts), len(keys)]
        parts = [scheme.route(keys.slice(a, b)) for a, b in itertools.pairwise(bounds)]
        assert np.array_equal(np.concatenate(parts), whole)


def test_deterministic_for_a_seed() -> None:
    keys = zipf_keys(4000, 1.0, 500, seed=2)
    for name in ("d-choices", "w-choices"):
        a = registry.create(name, 9, seed=5).route(keys)
        b = registry.create(name, 9, seed=5).route(keys)
        assert np.array_equal(a, b)


def test_parameters_and_errors() -> None:
    scheme = registry.create("d-choices", 10, capacity=50, threshold_t=4, epsilon=0.01)
    assert scheme.params()["theta"] == pytest.approx(2 / 40)
    assert scheme.params()["epsilon"] == 0.01
    assert not scheme.keeps_key_on_one_worker
    with pytest.raises(SchemeError, match="epsilon"):
        registry.create("w-choices", 4, epsilon=0.1)
    with pytest.raises(SchemeError, match="capacity"):
        DChoices(4, capacity=0)
    with pytest.raises(SchemeError, match="threshold_t"):
        WChoices(4, threshold_t=0)
    with pytest.raises(SchemeError, match="workers"):
        DChoices(0)

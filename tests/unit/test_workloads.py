"""Workloads: exact probabilities, reproducible draws, the papers' constructions, bad specs."""

from __future__ import annotations

import bisect
import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers import workloads
from producers.workloads import (
    Drift,
    File,
    LogNormal,
    Words,
    WorkloadError,
    Zipf,
    parse,
    sample_indices,
    split_lines,
    zipf_exponent_for_p1,
)


def reference_inverse_cdf(probabilities: list[float], uniforms: list[float]) -> list[int]:
    """Smallest index whose cumulative probability exceeds u (plain Python bisection)."""
    cdf, total = [], 0.0
    for p in probabilities:
        total += p
        cdf.append(total)
    cdf = [c / total for c in cdf]
    return [min(bisect.bisect_right(cdf, u), len(cdf) - 1) for u in uniforms]


def test_zipf_probabilities_are_exact() -> None:
    workload = parse("zipf:z=1,keys=4,n=10")
    # 1/r normalised by H_4 = 25/12.
    expected = [Fraction(12, 25), Fraction(6, 25), Fraction(4, 25), Fraction(3, 25)]
    assert workload.probabilities() == pytest.approx([float(f) for f in expected], abs=1e-15)
    assert workload.p1 == pytest.approx(0.48, abs=1e-15)
    assert parse("zipf:z=0,keys=5").probabilities().tolist() == [0.2] * 5


def test_zipf_draws_are_the_inverse_cdf_of_the_seeded_uniforms() -> None:
    workload = Zipf(z=1.3, n_keys=50, n=2000, seed=11)
    uniforms = np.random.default_rng(11).random(2000).tolist()
    ranks = reference_inverse_cdf(workload.probabilities().tolist(), uniforms)
    assert workload.ints().tolist() == [r + 1 for r in ranks]


def test_keys_are_the_decimal_text_of_the_integers() -> None:
    workload = parse("zipf:z=1.1,keys=1000,n=300,seed=2")
    assert workload.keys().to_list() == [str(v).encode() for v in workload.ints().tolist()]


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a = parse("zipf:z=1,keys=1000,n=5000,seed=1").ints()
    b = parse("zipf:z=1,keys=1000,n=5000,seed=1").ints()
    c = parse("zipf:z=1,keys=1000,n=5000,seed=2").ints()
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_sampling_in_chunks_equals_one_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workloads, "SAMPLE_CHUNK", 7)
    probabilities = workloads.zipf_probabilities(0.9, 300)
    whole = sample_indices(probabilities, 10_000, np.random.default_rng(5))
    uniforms = np.random.default_rng(5).random(10_000).tolist()
    assert whole.tolist() == reference_inverse_cdf(probabilities.tolist(), uniforms)


def test_zipf_exponent_for_p1_inverts_p1() -> None:
    for p1, keys in ((0.0932, 100_000), (0.0267, 1_000_000)):
        z = zipf_exponent_for_p1(p1, keys)
        assert Zipf(z=z, n_keys=keys).p1 == pytest.approx(p1, rel=1e-9)


def test_lognormal_presets_reproduce_pkg_table_one() -> None:
    # PKG Table I: LN1 p1 = 14.71%, 16k keys; LN2 p1 = 7.01%, 1.1k keys (10M messages).
    assert LogNormal(preset="ln1").p1 == pytest.approx(0.1471, abs=5e-5)
    assert LogNormal(preset="ln2").p1 == pytest.approx(0.0701, abs=5e-5)
    ln2 = parse("lognormal:preset=ln2,n=200000,seed=4").ints()
    values, counts = np.unique(ln2, return_counts=True)
    assert values[np.argmax(counts)] == 3  # round(X) = 3 is the mode: X in [2.5, 3.5)
    assert counts.max() / ln2.size == pytest.approx(0.0701, abs=0.002)


def test_lognormal_keys_are_rounded_draws() -> None:
    expected = np.rint(np.random.default_rng(9).lognormal(1.0, 0.5, 100)).astype(np.int64)
    assert parse("lognormal:mu=1,sigma=0.5,n=100,seed=9").ints().tolist() == expected.tolist()
    # p1: the largest P(k - 1/2 <= X < k + 1/2), from the normal CDF.
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    cdf = [0.0] + [phi((math.log(k + 0.5) - 1.0) / 0.5) for k in range(60)]
    bins = [high - low for low, high in itertools.pairwise(cdf)]
    assert LogNormal(mu=1.0, sigma=0.5).p1 == pytest.approx(max(bins), rel=1e-12)
    # the search looks near the mode only: any scale works, and almost all mass can sit on 0
    assert LogNormal(mu=30.0, sigma=1.0).p1 < 1e-12
    assert LogNormal(mu=-5.0, sigma=0.5).p1 == pytest.approx(1.0)


def test_drift_switch_shifts_the_ranks_after_eighty_percent() -> None:
    workload = parse("drift:z=1.2,keys=100,n=1000,seed=3")
    ranks = np.array(
        reference_inverse_cdf(
            workloads.zipf_probabilities(1.2, 100).tolist(),
            np.random.default_rng(3).random(1000).tolist(),
        )
    )
    expected = np.concatenate([ranks[:800] + 1, (ranks[800:] + 50) % 100 + 1])
    assert workload.ints().tolist() == expected.tolist()
    assert workload.p1 == pytest.approx(Zipf(z=1.2, n_keys=100).p1)


def test_drift_several_switch_points_and_rotation() -> None:
    base = parse("zipf:z=1,keys=10,n=20,seed=1").ints() - 1
    switch = parse("drift:z=1,keys=10,n=20,seed=1,at=0.25/0.5,shift=3").ints() - 1
    assert switch.tolist() == [
        (r + 3 * ((i >= 5) + (i >= 10))) % 10 for i, r in enumerate(base.tolist())
    ]
    rotate = parse("drift:mode=rotate,z=1,keys=10,n=20,seed=1,every=4,shift=2").ints() - 1
    assert rotate.tolist() == [(r + 2 * (i // 4)) % 10 for i, r in enumerate(base.tolist())]


def test_fluctuation_zero_is_the_stationary_zipf() -> None:
    drift = parse("drift:mode=fluctuate,z=1,keys=500,n=4000,f=0,intervals=4,workers=4,seed=8")
    assert np.array_equal(drift.ints(), parse("zipf:z=1,keys=500,n=4000,seed=8").ints())


def reference_fluctuate(probabilities, task, target, first, second):  # type: ignore[no-untyped-def]
    """The swap rule in plain Python: apply a swap iff it raises ½·Σ|after − before|."""
    p = list(probabilities)
    n_tasks = max(task) + 1
    before = [0.0] * n_tasks
    for k, t in enumerate(task):
        before[t] += p[k]
    after = list(before)
    for a, b in zip(first, second, strict=True):
        moved = 0.5 * sum(abs(x - y) for x, y in zip(after, before, strict=True))
        if moved >= target:
            break
        if task[a] == task[b]:
            continue
        trial = list(after)
        trial[task[a]] += p[b] - p[a]
        trial[task[b]] -= p[b] - p[a]
        if sum(abs(x - y) for x, y in zip(trial, before, strict=True)) > 2 * moved + 2e-12:
            after = trial
            p[a], p[b] = p[b], p[a]
    return p


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    target=st.floats(0.01, 0.6),
    n_tasks=st.integers(2, 5),
)
def test_fluctuation_swaps_match_the_plain_rule(seed: int, target: float, n_tasks: int) -> None:
    rng = np.random.default_rng(seed)
    probabilities = workloads.zipf_probabilities(1.0, 30)
    task = rng.integers(0, n_tasks, 30)
    first = rng.integers(0, 30, 200)
    second = rng.integers(0, 30, 200)
    compiled = probabilities.copy()
    before = np.bincount(task, weights=probabilities, minlength=n_tasks)
    workloads._fluctuate(compiled, task, target, first, second, 0.0, before, before.copy())
    expected = reference_fluctuate(probabilities.tolist(), task.tolist(), target, first, second)
    assert compiled.tolist() == pytest.approx(expected, abs=1e-12)


def test_fluctuation_moves_f_average_loads_between_instances() -> None:
    workload = Drift(
        mode="fluctuate", z=0.85, n_keys=2000, n=10_000, f=1.5, intervals=4, workers=5, seed=2
    )
    task = np.abs(workloads.KeyBatch.from_ints(np.arange(1, 2001)).hash64(13)) % 5
    steps = workload.interval_probabilities()
    assert len(steps) == 4
    for previous, current in itertools.pairwise(steps):
        # swaps only permute the frequencies ...
        assert sorted(current.tolist()) == pytest.approx(sorted(previous.tolist()))
        # ... until the load moved between the 5 instances reaches f · (1/5)
        moved = (
            0.5
            * np.abs(
                np.bincount(task, weights=current, minlength=5)
                - np.bincount(task, weights=previous, minlength=5)
            ).sum()
        )
        assert moved >= 1.5 / 5 - 1e-12
        assert moved < 1.5 / 5 + current.max() * 2  # stops at the first swap past the target


def test_words_are_wordfreq_words() -> None:
    import wordfreq

    words = Words(n_keys=3, n=3000, seed=1)
    frequencies = wordfreq.get_frequency_dict("en")
    top = sorted(frequencies.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert [w for w, _ in top] == ["the", "to", "and"]
    keys = words.keys().to_list()
    assert set(keys) == {b"the", b"to", b"and"}
    assert words.p1 == pytest.approx(top[0][1] / sum(f for _, f in top))
    assert keys == Words(n_keys=3, n=3000, seed=1).keys().to_list()


def test_file_replay_strips_only_the_newline(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_bytes(b"a\nb\r\n\nc\nc")
    workload = parse(f"file:path={path}")
    assert workload.keys().to_list() == [b"a", b"b\r", b"", b"c", b"c"]
    assert workload.p1 == pytest.approx(2 / 5)
    assert File(path=str(path), n=2).keys().to_list() == [b"a", b"b\r"]
    path.write_bytes(b"x\ny\n")
    assert File(path=str(path)).keys().to_list() == [b"x", b"y"]
    path.write_bytes(b"")
    with pytest.raises(WorkloadError, match="holds no keys"):
        File(path=str(path)).keys()


def test_split_lines_edges() -> None:
    assert split_lines(b"").to_list() == []
    assert split_lines(b"\n").to_list() == [b""]
    assert split_lines(b"\n\nab").to_list() == [b"", b"", b"ab"]
    assert split_lines(b"k1\nk22\n").offsets.tolist() == [0, 2, 5]


@pytest.mark.parametrize(
    "spec",
    [
        "zipf:z=0.5,keys=7,n=9,seed=2",
        "lognormal:preset=ln1,n=5,seed=0",
        "lognormal:mu=1.5,sigma=0.5,n=5,seed=0",
        "drift:mode=switch,z=1.0,keys=9,n=5,seed=0,at=0.2/0.6,shift=2",
        "drift:mode=fluctuate,z=1.0,keys=9,n=5,seed=0,f=0.5,intervals=2,workers=3",
        "words:lang=en,keys=4,n=5,seed=1",
    ],
)
def test_spec_round_trip(spec: str) -> None:
    workload = parse(spec)
    assert parse(workload.spec) == workload
    assert workload.records == len(workload.keys())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope:z=1", "unknown workload 'nope'; valid workloads: zipf, lognormal, drift, words"),
        ("zipf:z=-0.5", "zipf: z must be >= 0, got -0.5"),
        ("zipf:q=1", "zipf: unknown parameter(s) q; valid: z, keys, n, seed"),
        ("zipf:z", "zipf: expected NAME=VALUE, got 'z'"),
        ("zipf:n=1.5", "zipf: n must be an integer, got '1.5'"),
        ("zipf:keys=0", "zipf: keys must be >= 1, got 0"),
        ("zipf:z=1,z=2", "zipf: parameter z given twice"),
        ("zipf:z=abc", "zipf: z must be a number, got 'abc'"),
        ("lognormal:preset=ln3", "lognormal: unknown preset 'ln3'; valid: ln1, ln2"),
        ("lognormal:n=5", "lognormal: give preset=ln1|ln2, or both mu and sigma"),
        ("drift:mode=rotate,f=1", "drift: mode=rotate takes no f"),
        ("drift:mode=spin", "drift: unknown mode 'spin'"),
        ("drift:at=1.5", "drift: at must lie in (0, 1)"),
        ("words:lang=xx", "words: unknown lang 'xx'"),
        ("file:path=/no/such/file", "file: no such file: /no/such/file"),
    ],
)
def test_bad_specs_give_one_line_errors(spec: str, message: str) -> None:
    with pytest.raises(WorkloadError) as error:
        parse(spec)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_n_accepts_scientific_notation() -> None:
    assert parse("zipf:n=1e3").n == 1000

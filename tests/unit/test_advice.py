"""`skewer advise`'s model (operators/advice.py) on hand-checked streams, and its CLI's bad input.

Every expected number is worked out by hand or from the schemes' definitions (key grouping's
hash, PKG's per-source rule), never by calling the code under test a second time.

Long because the model's figures and their live check are one contract (operators/advice.py):
each figure is tested with the live comparison it is held to.
"""

from __future__ import annotations

import json
from pathlib import Path

import mmh3
import numpy as np
import pytest

from operators import registry
from operators.advice import (
    MAX_ROUNDS,
    SWEEPS,
    Candidate,
    Check,
    Sample,
    advise,
    batched_latencies,
    compare,
    fifo_latencies,
    key_shown,
    rank,
    recommend,
    settings_of,
)
from operators.base import SchemeError
from operators.keys import KeyBatch
from operators.simulator import Router, simulate
from pipeline.cli import app
from pipeline.runs.advise import quotas


def kg(key: bytes, n_workers: int) -> int:
    """Key grouping's worker, from the hash definition (docs/schemes.md#pkg)."""
    return abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers


def two_choices(keys: list[bytes], sources: list[int], n_workers: int, n_sources: int) -> list[int]:
    """PKG's rule from its definition: each source picks the less loaded (by its own count)
    of the key's two hashed workers, ties to the first."""
    loads = [[0] * n_workers for _ in range(n_sources)]
    out = []
    for key, source in zip(keys, sources, strict=True):
        own = loads[source]
        a = abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers
        b = abs(mmh3.hash64(key, 17, signed=True)[0]) % n_workers
        chosen = b if own[b] < own[a] else a
        own[chosen] += 1
        out.append(chosen)
    return out


def uniform(keys: list[str], n_sources: int = 1, gap_ms: float = 1.0) -> Sample:
    n = len(keys)
    return Sample(
        KeyBatch.from_strings(keys), np.arange(n) % n_sources, np.arange(n) * gap_ms, n_sources
    )


# --- the latency kernel ----------------------------------------------------------------------


def test_lindley_latency_of_three_records_by_hand() -> None:
    # One worker, C = 2 ms, arrivals 0, 1, 5: finishes 2, 4 (waits for the first), 7 (idle).
    latency = fifo_latencies(np.array([0, 0, 0]), np.array([0.0, 1.0, 5.0]), 2.0, 1)
    assert latency.tolist() == [2.0, 3.0, 2.0]
    # The same arrivals on two workers: the second record no longer waits.
    assert fifo_latencies(np.array([0, 1, 0]), np.array([0.0, 1.0, 5.0]), 2.0, 2).tolist() == [
        2.0,
        2.0,
        2.0,
    ]


def test_light_load_in_micro_batches_waits_between_one_and_two_cycles() -> None:
    # D = 100 ms, C = 1 ms, one worker, records 30 ms apart from t = 0: batch starts 0, 100,
    # 200, ...; the record at 0 is read at 0, those at 30, 60, 90 at 100, 120 at 200. Each
    # worker share is done well before its batch ends (s_k + D), so the batch end decides.
    arrival = np.array([0.0, 30.0, 60.0, 90.0, 120.0])
    latency = batched_latencies(np.zeros(5, dtype=np.int32), arrival, 1.0, 1, 100.0)
    assert latency.tolist() == [100.0, 170.0, 140.0, 110.0, 180.0]
    assert all(100.0 <= x < 200.0 for x in latency)


def test_overload_in_micro_batches_is_the_fifo_queue_rounded_up_to_a_batch_end() -> None:
    # D = 10 ms, C = 4 ms, one worker, a record every 1 ms (4x its capacity): Lindley's
    # finishes are 4, 8, ..., 4(i+1). Batch 0 holds the record at 0 (F = 4 < 10: applied at
    # 10); batch 1 the records at 1..10 (F = 44: applied at 44, past its end at 20); batch 2
    # those at 11..20 (F = 84). The second worker gets one record at 5 (batch 1, ends at 20).
    arrival = np.array([*range(6), 5.0, *range(6, 21)], dtype=np.float64)
    workers = np.array([*[0] * 6, 1, *[0] * 15])  # worker 0 at 0, 1, ..., 20; worker 1 at 5
    latency = batched_latencies(workers, arrival, 4.0, 2, 10.0)
    first = {t: i for i, t in enumerate(arrival.tolist()) if workers[i] == 0}
    assert latency[first[0.0]] == 10.0
    assert [latency[first[t]] for t in (1.0, 10.0)] == [43.0, 34.0]
    assert [latency[first[t]] for t in (11.0, 20.0)] == [73.0, 64.0]
    assert latency[6] == 15.0
    # Pure FIFO (D = 0) over the same records: the record at 20 ms finishes at 4 · 21 ms.
    fifo = batched_latencies(workers, arrival, 4.0, 2, 0.0)
    assert fifo.tolist() == fifo_latencies(workers, arrival, 4.0, 2).tolist()
    assert fifo[first[20.0]] == 4.0 * 21 - 20.0


def test_a_bad_batch_cycle_is_refused() -> None:
    with pytest.raises(ValueError, match="batch cycle"):
        batched_latencies(np.array([0]), np.array([0.0]), 1.0, 1, -1.0)
    with pytest.raises(SchemeError, match="batch cycle"):
        advise(uniform(["a"] * 10), 2, 1.0, 100.0, schemes=["key"], batch_ms=float("nan"))


def test_without_a_cpu_cost_only_the_batch_cycle_waits_and_there_is_no_bound() -> None:
    advice = advise(uniform(["a"] * 50), 4, 0.0, 100.0, schemes=["key"], batch_ms=0.0)
    key = advice.candidate("key")
    assert (key.p50_ms, key.p99_ms, key.throughput_bound) == (0.0, 0.0, None)
    assert (key.p50_read_ms, key.p99_read_ms) == (0.0, 0.0)
    assert any("C = 0" in note for note in advice.notes)
    # 50 records 10 ms apart (at 100/s) in 250 ms batches: the first waits D, the rest
    # (s_k + D) - t for s_k the first multiple of 250 at or after t.
    batched = advise(uniform(["a"] * 50), 4, 0.0, 100.0, schemes=["key"], batch_ms=250.0)
    t = np.arange(50) * 10.0
    expected = np.ceil(t / 250.0) * 250.0 + 250.0 - t
    assert batched.candidate("key").p99_ms == pytest.approx(np.percentile(expected, 99))
    assert batched.candidate("key").throughput_bound is None


def test_latency_uses_the_sample_times_rescaled_to_the_offered_rate() -> None:
    # 100 records of one key, 10 ms apart in the sample; offered at 2000/s they come 0.5 ms
    # apart into one worker that needs 1 ms each: record i waits i * 0.5 ms, then 1 ms.
    advice = advise(
        uniform(["a"] * 100, gap_ms=10.0), 2, 1000.0, 2000.0, schemes=["key"], batch_ms=0.0
    )
    latencies = 1.0 + 0.5 * np.arange(100)
    key = advice.candidate("key")
    assert key.p99_ms == pytest.approx(float(np.percentile(latencies, 99)))
    assert key.p50_ms == pytest.approx(float(np.percentile(latencies, 50)))
    assert key.busiest_utilisation == pytest.approx(2.0)  # 2000/s into a 1000/s server
    # Read as a live run's histogram reads it: the 99th of 100 latencies is 1 + 0.5 · 98 =
    # 50 ms, in bucket ceil(20 log10 50) = 34, whose upper edge is 10^(34/20) ms.
    assert key.p99_read_ms == pytest.approx(10 ** (34 / 20), abs=1e-3)
    assert key.figures()["p99_ms"] == key.p99_read_ms


# --- the throughput bound --------------------------------------------------------------------


def test_throughput_bound_of_one_hot_key_by_hand() -> None:
    # 100 records of one key, W = 4, C = 1 ms, one source. Key grouping: one worker takes all
    # 100, so 100 records need 100 ms: 1000 records/s, a quarter of the even split's 4000.
    # Shuffle: 25 each, 4000 records/s.
    advice = advise(uniform(["a"] * 100), 4, 1000.0, 500.0, schemes=["key", "shuffle"])
    key, shuffle = advice.candidate("key"), advice.candidate("shuffle")
    assert key.throughput_bound == pytest.approx(1000.0)
    assert (key.vs_even, key.vs_key) == (pytest.approx(0.25), 1.0)
    assert shuffle.throughput_bound == pytest.approx(4000.0)
    assert (shuffle.vs_even, shuffle.vs_key) == (pytest.approx(1.0), pytest.approx(4.0))
    assert key.final_loads.tolist() == [100 if w == kg(b"a", 4) else 0 for w in range(4)]
    assert (key.state_entries, shuffle.state_entries) == (1, 4)
    assert (key.hot_key_workers, shuffle.hot_key_workers) == ([1], [4])


# --- sources: each replays its own records in order ------------------------------------------


def test_per_source_replay_equals_each_source_routing_its_own_stream() -> None:
    rng = np.random.default_rng(3)
    keys = [f"k{int(k)}".encode() for k in rng.zipf(1.5, 3000) % 50]
    sources = rng.integers(0, 3, size=3000)
    expected = np.bincount(two_choices(keys, sources.tolist(), 5, 3), minlength=5)

    sample = Sample(KeyBatch.from_bytes(keys), sources, np.arange(3000.0), 3)
    advice = advise(sample, 5, 100.0, 1000.0, schemes=["pkg"])
    assert advice.candidate("pkg").final_loads.tolist() == expected.tolist()
    # and against the scheme's own objects, one per source, each given only its records
    own = np.zeros(5, dtype=np.int64)
    for s in range(3):
        scheme = registry.create("pkg", 5, source=s, n_sources=3)
        mine = np.flatnonzero(sources == s)
        own += np.bincount(scheme.route(KeyBatch.from_bytes([keys[i] for i in mine])), minlength=5)
    assert own.tolist() == expected.tolist()


def live_sources_loads(
    scheme: str, keys: list[bytes], sources: np.ndarray, n_workers: int, n_sources: int
) -> tuple[np.ndarray, int]:
    """Loads and distinct (key, worker) pairs of the live grouping stage: source s owns one object
    made as pipeline/stages/grouping.py ``create_scheme`` makes it and routes its own records in
    their order, a consumed batch at a time (batches of 7 here)."""
    loads = np.zeros(n_workers, dtype=np.int64)
    pairs: set[tuple[bytes, int]] = set()
    for s in range(n_sources):
        own = registry.create(scheme, n_workers, source=s, n_sources=n_sources, seed=0)
        mine = [keys[i] for i in np.flatnonzero(sources == s)]
        for start in range(0, len(mine), 7):
            batch = mine[start : start + 7]
            workers = own.route(KeyBatch.from_bytes(batch)).tolist()
            loads += np.bincount(workers, minlength=n_workers)
            pairs.update(zip(batch, workers, strict=True))
    return loads, len(pairs)


@pytest.mark.parametrize("scheme", ["potc", "greedy-online"])
def test_shared_state_schemes_are_replayed_with_one_object_per_source_as_live(
    scheme: str,
) -> None:
    rng = np.random.default_rng(5)
    keys = [f"k{int(k)}".encode() for k in rng.zipf(1.3, 2000) % 300]
    sources = rng.integers(0, 3, size=2000)
    expected, pairs = live_sources_loads(scheme, keys, sources, 5, 3)

    sample = Sample(KeyBatch.from_bytes(keys), sources, np.arange(2000.0), 3)
    candidate = advise(sample, 5, 100.0, 1000.0, schemes=[scheme]).candidate(scheme)
    assert candidate.final_loads.tolist() == expected.tolist()
    assert candidate.state_entries == pairs
    # The simulator's default is still the papers' model: one object routes the whole
    # interleaved stream (coordinated sources), and on this sample it routes differently,
    # so advise above took the live arrangement.
    shared = simulate(scheme, KeyBatch.from_bytes(keys), 5, 3, sources=sources)
    one = registry.create(scheme, 5, n_sources=3).route(KeyBatch.from_bytes(keys))
    assert shared.final_loads.tolist() == np.bincount(one, minlength=5).tolist()
    assert shared.final_loads.tolist() != expected.tolist()
    assert len(Router(scheme, 5, 3).objects) == 1
    assert len(Router(scheme, 5, 3, per_source=True).objects) == 3


def test_a_source_array_of_i_mod_s_routes_as_the_round_robin_default() -> None:
    keys = KeyBatch.from_strings([f"k{i % 37}" for i in range(5000)])
    plain = simulate("pkg", keys, 6, 4, checkpoints=7)
    explicit = simulate("pkg", keys, 6, 4, checkpoints=7, sources=np.arange(5000) % 4)
    assert plain.workers.tolist() == explicit.workers.tolist()
    assert plain.exec_time_shuffle == explicit.exec_time_shuffle


def test_a_bad_source_array_is_refused() -> None:
    router = Router("key", 4, 2)
    with pytest.raises(SchemeError, match=r"sources must lie in 0\.\.1"):
        router.route(KeyBatch.from_strings(["a", "b"]), np.array([0, 2]))
    with pytest.raises(SchemeError, match="1 sources for 2 records"):
        router.route(KeyBatch.from_strings(["a", "b"]), np.array([0]))


def test_interleaving_by_arrival_keeps_each_sources_order() -> None:
    # Source 1's third record is stamped before its second: it cannot arrive before it (the
    # source reads in order), so it arrives with it, and ties go to the lower source.
    first = (KeyBatch.from_strings(["a0", "a1"]), np.array([0, 5]))
    second = (KeyBatch.from_strings(["b0", "b1", "b2"]), np.array([1, 5, 2]))
    sample = Sample.interleaved([first, second])
    assert sample.keys.to_list() == [b"a0", b"b0", b"a1", b"b1", b"b2"]
    assert sample.sources.tolist() == [0, 1, 0, 1, 1]
    assert sample.arrival_ms.tolist() == [0, 1, 5, 5, 5]
    assert sample.rate == pytest.approx(4 * 1000 / 5)


def test_a_sample_without_records_is_refused() -> None:
    with pytest.raises(SchemeError, match="no records"):
        Sample.interleaved([(KeyBatch.from_strings([]), np.zeros(0))])


# --- the sweep, the ranking, the recommendation ----------------------------------------------


def test_the_sweep_tries_defaults_main_parameters_and_bounded_rebalance_intervals() -> None:
    assert settings_of("key", 10_000, 100.0) == [({}, None)]
    name, values = SWEEPS["d-choices"]
    assert settings_of("d-choices", 10_000, 100.0) == [({}, None)] + [
        ({name: v}, None) for v in values
    ]
    # mixed: the live 2 s round at 100 records/s (200), 10_000 / 10 and 10_000 / 40 records
    assert [i for _, i in settings_of("mixed", 10_000, 100.0)] == [200, 250, 1000]
    # at 1 record/s the live round (2 records) would plan too often: none below 10_000 / 100
    assert MAX_ROUNDS == 100
    assert [i for _, i in settings_of("mixed", 10_000, 1.0)] == [100, 250, 1000]


def candidate(scheme: str, vs_even: float, p99: float, state: int, **more: object) -> Candidate:
    fields: dict[str, object] = {
        "scheme": scheme,
        "params": {},
        "rebalance_interval": None,
        "simulator_only": False,
        "final_loads": np.array([1, 1]),
        "checkpoint_records": np.array([2]),
        "imbalance_series": np.array([0.0]),
        "max_avg_final": 1 / vs_even,
        "max_avg_worst": 1 / vs_even,
        "workers_per_key": 1.0,
        "hot_key_workers": [1],
        "state_entries": state,
        "rebalances": 0,
        "moved_keys": 0,
        "moved_state": 0.0,
        "throughput_bound": 1000 * vs_even,
        "steady_rate": 1000 * vs_even,
        "vs_even": vs_even,
        "vs_key": 1.0,
        "busiest_utilisation": 0.5,
        "p50_ms": p99 / 2,
        "p99_ms": p99,
        "p50_read_ms": p99 / 2,
        "p99_read_ms": p99,
        "routing_rate": 1e6,
        "busiest_top_key": 0,
        "busiest_top_key_share": 1.0,
    }
    fields.update(more)
    return Candidate(**fields)  # type: ignore[arg-type]


def test_ranking_per_goal_and_its_tie_breaks() -> None:
    a = candidate("a", vs_even=0.996, p99=9.0, state=300)  # ties b on throughput, more state
    b = candidate("b", vs_even=1.0, p99=5.0, state=200)
    c = candidate("c", vs_even=0.5, p99=2.0, state=100)
    d = candidate("d", vs_even=0.6, p99=2.0, state=100)  # ties c on p99 and state: faster
    labels = {goal: [x.label for x in rank([a, b, c, d], goal)] for goal in ("throughput",)}
    assert labels["throughput"] == ["b", "a", "d", "c"]
    assert [x.label for x in rank([a, b, c, d], "latency")] == ["d", "c", "b", "a"]
    assert [x.label for x in rank([a, b, c, d], "memory")] == ["d", "c", "b", "a"]
    with pytest.raises(SchemeError, match="unknown goal 'speed'"):
        rank([a], "speed")


def test_ranking_keeps_each_schemes_best_setting() -> None:
    low = candidate("d-choices", 0.7, 3.0, 10, params={"threshold_t": 5.0})
    high = candidate("d-choices", 0.9, 4.0, 20, params={"threshold_t": 20.0})
    assert [x.label for x in rank([low, high], "throughput")] == ["d-choices threshold_t=20"]
    assert [x.label for x in rank([low, high], "latency")] == ["d-choices threshold_t=5"]


def test_the_recommendation_names_the_hot_key_key_grouping_is_stuck_with() -> None:
    # 'self' is 70 of 100 records; three cold keys share the rest. W = 4, one source.
    keys = ["self"] * 70 + ["x", "y", "z"] * 10
    advice = advise(uniform(keys), 4, 1000.0, 100.0, schemes=["key", "shuffle"])
    key = advice.candidate("key")
    busiest = max(key.final_loads)
    assert advice.top_keys[0] == b"self"
    assert advice.recommendation == (
        "shuffle: 1.00× the even split's throughput, 4.0 workers per hot key; key grouping "
        f"caps at {25 / busiest:.2f}× because one worker holds 'self' ({70 / busiest:.0%} of its "
        "load)"
    )


def test_the_recommendation_skips_simulator_only_schemes() -> None:
    only = candidate("pkg-global", 1.0, 1.0, 10, simulator_only=True)
    live = candidate("pkg", 0.9, 1.0, 10)
    assert recommend([only, live], [b"k"], "throughput").startswith("pkg: 0.90×")


def test_keys_are_shown_as_text_when_printable() -> None:
    assert (key_shown(b"self"), key_shown(b"\xff\x00"), key_shown(b"a\nb")) == (
        "self",
        "b'\\xff\\x00'",
        "b'a\\nb'",
    )


def test_topic_quotas_share_the_sample_by_partition_size() -> None:
    assert quotas([100, 300, 0], 40) == [10, 30, 0]
    assert sum(quotas([7, 7, 7], 10)) == 10


# --- the command -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "1"], "--workers must be >= 2, got 1"),
        (["--workers", "eight"], "--workers 'eight': not a number"),
        (["--goal", "speed"], "--goal 'speed': not one of throughput, latency, memory"),
        (["--cpu-cost-us", "-5"], "--cpu-cost-us must be >= 0, got -5"),
        (["--batch-ms", "-1"], "--batch-ms must be >= 0, got -1"),
        (["--batch-ms", "soon"], "--batch-ms 'soon': not a number"),
        (["--rate", "0"], "--rate must be > 0, got 0"),
        (["--sample", "1.5"], "--sample '1.5': not an integer"),
        (["--workload", "zipf:z=-1"], "zipf: z must be >= 0, got -1.0"),
        (
            ["--workload", "zipf:n=10", "--input", "x"],
            "give one of --input-topic, --workload and --input",
        ),
        (["--check"], "--check needs --validate K: there is nothing measured to check"),
        (["--validate", "0"], "--validate must be >= 1, got 0"),
        (["--validate", "two"], "--validate 'two': not a number"),
        (
            ["--validate", "1", "--seed", "3"],
            "--validate: live grouping stages seed their schemes with 0; drop --seed",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.delenv("SKEWER_INPUT_TOPIC", raising=False)
    argv = ["advise", "--quiet", *flags]
    if "--workload" not in flags:
        argv += ["--workload", "zipf:n=100"]
    assert app.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"skewer advise: error: {message}"]


def test_advise_on_a_file_prints_the_ranked_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.delenv("SKEWER_INPUT_TOPIC", raising=False)
    path = tmp_path / "keys.txt"
    path.write_text("self\n" * 60 + "a\nb\nc\nd\n" * 10)
    argv = ["advise", "--input", str(path), "--workers", "4", "--quiet", "--json"]
    assert app.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 100 and out["sources"] == 2 and out["rate"] == 4000.0
    assert out["top_keys"][0] == "self" and out["top_key_counts"][0] == 60
    assert set(out["ranking"]) >= {"key", "shuffle", "pkg"}
    picture = tmp_path / "advice.png"
    argv = ["advise", "--input", str(path), "--workers", "4", "--quiet"]
    assert app.main([*argv, "--picture", str(picture), "--goal", "memory"]) == 0
    table = capsys.readouterr().out
    assert picture.read_bytes()[:4] == b"\x89PNG"
    assert "ranked for memory" in table and table.splitlines()[-1].startswith("recommendation: ")


def test_kafka_not_answering_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    monkeypatch.setenv("SKEWER_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    assert app.main(["advise", "--quiet", "--input-topic", "clicks"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("skewer advise: error: kafka does not answer at 127.0.0.1:1")


def test_a_workload_is_dealt_to_sources_as_skewer_produce_deals_it() -> None:
    from pipeline.runs.advise import dealt_sample

    taken = dealt_sample(KeyBatch.from_strings(list("abcdefg")), 3, 500.0, "letters")
    assert taken.sample.sources.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert taken.sample.arrival_ms.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert (taken.rate, taken.read, taken.refused) == (500.0, 7, 0)


def figures(**changed: object) -> dict[str, object]:
    """A setting's predicted figures (Candidate.figures' names): 4 workers, a bound at C > 0."""
    base: dict[str, object] = {
        "loads": [40, 20, 20, 20],
        "max_avg_final": 1.6,
        "throughput_bound": 10_000.0,
        "steady_rate": 4_000.0,
        "p50_ms": 1.0,
        "p99_ms": 100.0,
        "state_entries": 10,
        "workers_per_key": 1.0,
    }
    return {**base, **changed}


def live(**changed: object) -> dict[str, object]:
    """What a live run measured, as :mod:`pipeline.runs.advise_live` names it."""
    base: dict[str, object] = {
        "loads": [40, 20, 20, 20],
        "max_avg_final": 1.6,
        "throughput_bound": None,
        "steady_rate": 4_000.0,
        "offered_rate": 4_000.0,
        "p50_ms": 300.0,
        "p99_ms": 100.0,
    }
    return {**base, **changed}


def within(checks: list[Check]) -> dict[str, bool | None]:
    return {check.figure: check.within for check in checks}


def test_source_order_schemes_must_put_exactly_the_predicted_loads_live() -> None:
    assert within(compare("pkg", figures(), live()))["loads"] is True
    # One record on another worker: the same max/avg, but not the same records.
    moved = live(loads=[40, 21, 19, 20])
    assert within(compare("pkg", figures(), moved)) == {
        "loads": False,
        "max/avg": True,
        "throughput": True,
        "p50": None,
        "p99": True,
    }
    # Replayed with one object per source as live: checked record for record too.
    for scheme in ("greedy-online", "potc"):
        assert within(compare(scheme, figures(), moved))["loads"] is False
    # Table schemes: their loads are shown, only max/avg checked.
    for scheme in ("mixed", "scan"):
        assert within(compare(scheme, figures(), moved))["loads"] is None


def test_the_exactly_checked_schemes_are_every_live_scheme_without_a_controller() -> None:
    from operators.advice import SOURCE_ORDER_SCHEMES
    from operators.base import TableScheme

    for scheme in SOURCE_ORDER_SCHEMES:
        cls = registry.scheme_class(scheme)
        assert not issubclass(cls, TableScheme), scheme
        assert scheme not in registry.SIMULATOR_ONLY, scheme
        # No hook but routing: no probes of the true loads, no look at the whole stream.
        assert not getattr(cls, "probe_interval", None), scheme
        assert not hasattr(cls, "prepare"), scheme
    table = {n for n in registry.names() if issubclass(registry.scheme_class(n), TableScheme)}
    live = set(registry.names()) - registry.SIMULATOR_ONLY
    assert live - table == SOURCE_ORDER_SCHEMES


def test_max_avg_within_five_percent_of_live() -> None:
    # |predicted - live| <= 5 % of live: 1.6 against 1.53 (4.6 %) is in, against 1.52 (5.3 %) out.
    assert within(compare("mixed", figures(), live(max_avg_final=1.53)))["max/avg"] is True
    assert within(compare("mixed", figures(), live(max_avg_final=1.52)))["max/avg"] is False


def test_the_predicted_steady_rate_is_held_within_15_percent_of_the_live_one() -> None:
    # Predicted 4,000/s: 15 % of the live rate apart at most.
    checks = compare("key", figures(), live(steady_rate=3_500.0))  # 500 <= 525
    assert (checks[2].predicted, checks[2].within, checks[2].ratio) == (4_000.0, True, 0.875)
    assert within(compare("key", figures(), live(steady_rate=3_450.0)))["throughput"] is False
    assert within(compare("key", figures(), live(steady_rate=4_700.0)))["throughput"] is True
    # C = 0: no bound, nothing to check; nor without a live rate.
    assert within(compare("key", figures(throughput_bound=None), live()))["throughput"] is None
    assert within(compare("key", figures(), live(steady_rate=None)))["throughput"] is None


def test_the_model_steady_rate_of_a_worker_past_its_capacity_by_hand() -> None:
    # 100 records of one key offered at 2,000/s to W = 2 workers taking C = 1 ms each, one
    # by one (D = 0): the worker applies record i at (i + 1) ms. The steady cut is the 20th
    # record, at 20 ms; the 80 after it take until 100 ms: 1,000 records/s, the server's rate.
    advice = advise(
        uniform(["a"] * 100, gap_ms=10.0), 2, 1000.0, 2000.0, schemes=["key"], batch_ms=0.0
    )
    assert advice.candidate("key").steady_rate == pytest.approx(1000.0)
    # The same at 500/s (2 ms apart): the worker keeps up, so it applies at the offered rate.
    slow = advise(uniform(["a"] * 100, gap_ms=10.0), 2, 1000.0, 500.0, schemes=["key"], batch_ms=0)
    assert slow.candidate("key").steady_rate == pytest.approx(500.0)


def test_the_steady_rate_below_the_bound_when_other_workers_finish_early() -> None:
    # Half the records one key, whose worker is offered twice its capacity; the rest spread
    # light. The light workers' records bring the steady cut forward, so the records after it
    # take longer than the bound (the records over the busiest worker's work) allows them.
    keys = [("a" if i % 2 else f"k{i}") for i in range(1000)]
    advice = advise(uniform(keys), 8, 1000.0, 4000.0, schemes=["key"], batch_ms=0.0)
    key = advice.candidate("key")
    assert key.throughput_bound == pytest.approx(1000 / (key.final_loads.max() * 1e-3))
    assert key.steady_rate is not None and key.steady_rate < 0.95 * key.throughput_bound


def test_figures_at_another_rate_are_the_models_at_that_rate() -> None:
    from operators.advice import figures_at

    keys = KeyBatch.from_strings(["a"] * 600 + ["b", "c"] * 200)
    sample = Sample(keys, np.arange(1000) % 2, np.arange(1000) * 10.0, n_sources=2)
    advice = advise(sample, 4, 1000.0, 100.0, schemes=["key", "pkg", "mixed"])
    pkg = advice.candidate("pkg")
    faster = advise(sample, 4, 1000.0, 400.0, schemes=["key", "pkg"]).candidate("pkg")
    assert figures_at(advice, sample, pkg, 400.0) == faster.figures() != pkg.figures()
    # A routing-table setting's round is a rate's: at another rate it is another setting,
    # so its figures stay the advice's.
    table = advice.candidate("mixed every=200")  # 2 s at 100/s; at 400/s it is every=800
    assert figures_at(advice, sample, table, 400.0) == table.figures()


def test_p99_within_a_factor_two_of_live_when_the_model_predicts_a_wait() -> None:
    assert within(compare("key", figures(), live(p99_ms=200.0)))["p99"] is True
    assert within(compare("key", figures(), live(p99_ms=201.0)))["p99"] is False
    assert within(compare("key", figures(), live(p99_ms=50.0)))["p99"] is True
    assert within(compare("key", figures(), live(p99_ms=49.0)))["p99"] is False
    # C = 0: every predicted latency is 0, no prediction to hold the live one to.
    assert within(compare("key", figures(p99_ms=0.0), live(p99_ms=49.0)))["p99"] is None


def test_the_live_table_marks_figures_outside_tolerance(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipeline.cli.advise import live_table

    keys = KeyBatch.from_strings(["a"] * 60 + ["b", "c"] * 20)
    sample = Sample(keys, np.arange(100) % 2, np.arange(100) * 10.0, n_sources=2)
    advice = advise(sample, n_workers=4, cpu_cost_us=1000, rate=100, schemes=["key", "pkg"])
    pkg, key = advice.candidate("pkg"), advice.candidate("key")
    pkg.measured = {**pkg.figures(), "offered_rate": 100.0}
    wrong = [*key.final_loads.tolist()]
    wrong[0], wrong[1] = wrong[0] - 1, wrong[1] + 1
    key.measured = {**key.figures(), "loads": wrong, "offered_rate": 100.0}
    key.measured.update(p99_ms=key.p99_ms * 3)
    stream = {"workload": "letters", "rate": 100.0, "records": 100}
    lines = live_table(advice, [pkg, key], stream).splitlines()
    assert lines[1].split()[:3] == ["scheme", "loads", "max/avg"]
    assert lines[2].split()[:2] == ["pkg", "equal"] and "#" not in lines[2]
    assert lines[3].split()[:3] == ["key", "2", "apart#"]
    assert lines[3].count("#") == 2  # the loads and the p99 (3x the prediction)


def test_a_live_run_of_a_setting_is_the_demos_plan_with_the_same_w_c_and_parameters() -> None:
    from pipeline.io import config
    from pipeline.runs.advise_live import setting_plan, workload_stream

    keys = KeyBatch.from_strings(["a"] * 60 + ["b", "c"] * 20)
    sample = Sample(keys, np.arange(100) % 2, np.arange(100) * 10.0, n_sources=2)
    advice = advise(sample, 4, 500.0, 100.0, schemes=["key", "d-choices", "mixed"])
    stream = workload_stream("zipf:n=100", 100, 2, 100.0)
    d = setting_plan(config.load({}), advice.candidate("d-choices threshold_t=5"), advice, stream)
    assert (d.scheme, d.params, d.workers, d.cpu_cost_us) == (
        "d-choices",
        ("threshold_t=5.0",),
        4,
        500.0,
    )
    assert (d.workload, d.records, d.sources, d.rate) == ("zipf:n=100", 100, 2, 100.0)
    assert d.run_id.startswith("advise-") and d.input_topic is None
    # A round every 10 records (records / 10): the live controller's rounds counted in records.
    table = next(c for c in advice.candidates if c.label == "mixed every=10")
    assert setting_plan(config.load({}), table, advice, stream).control_every == 10
    assert d.control_every is None


def test_the_live_steady_rate_runs_from_the_steady_cut_to_the_last_record_applied() -> None:
    from pipeline.runs.advise_live import steady_rate
    from pipeline.runs.latency import Snapshot

    snapshots = [Snapshot(10.0, {5: 100}), Snapshot(11.0, {5: 300}), Snapshot(12.0, {5: 1000})]
    # The cut: 20 % of 1,000 records applied, at 11.0 s with 300; 700 more until 13.0 s.
    assert steady_rate(snapshots, 1000, 13.0) == 350.0
    assert steady_rate(snapshots, 1000, None) is None
    assert steady_rate(snapshots[:1], 1000, 13.0) is None  # the cut never came


def test_a_live_run_that_fails_names_the_setting_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.io import config
    from pipeline.runs import orchestrator
    from pipeline.runs.advise_live import LiveRunError, run_live, workload_stream

    def failing(plan: object, *_args: object, **_kwargs: object) -> None:
        raise orchestrator.PipelineError("work did not start within 180 s")

    monkeypatch.setattr(orchestrator, "run_pipeline", failing)
    keys = KeyBatch.from_strings(["a"] * 60 + ["b", "c"] * 20)
    sample = Sample(keys, np.arange(100) % 2, np.arange(100) * 10.0, n_sources=2)
    advice = advise(sample, 4, 500.0, 100.0, schemes=["key", "pkg"])
    said: list[str] = []
    with pytest.raises(LiveRunError) as failed:
        run_live(
            advice,
            [advice.candidate("pkg")],
            sample,
            workload_stream("zipf:n=100", 100, 2, 100.0),
            config.load({}),
            say=said.append,
            progress=said.append,
        )
    assert str(failed.value) == "live run of pkg failed: work did not start within 180 s"
    assert said[0].startswith("live run 1/1: pkg (run advise-")
    assert advice.candidate("pkg").measured is None


# --- skewer bench advise: the ranking held to live rates -------------------------------------


def test_the_ranking_agrees_with_live_unless_a_lower_setting_runs_clearly_faster() -> None:
    from bench.advise import ranking_agrees

    order = ["fish", "pkg", "key"]
    # fish 15 % below pkg is a tie (0.85 · 16,000 = 13,600); 13,500 is clearly slower.
    assert ranking_agrees(order, {"fish": 14_000.0, "pkg": 16_000.0, "key": 6_000.0}) is True
    assert ranking_agrees(order, {"fish": 13_500.0, "pkg": 16_000.0, "key": 6_000.0}) is False
    assert ranking_agrees(order, {"fish": 14_000.0, "pkg": 14_000.0, "key": 17_000.0}) is False
    assert ranking_agrees(order, {"fish": 14_000.0, "pkg": None, "key": 6_000.0}) is None


def test_the_bench_table_marks_each_figure_outside_its_tolerance() -> None:
    from bench.advise import table

    figures = {"throughput_bound": 7000.0, "steady_rate": 6500.0, "max_avg_final": 2.0}
    figures.update(p50_ms=300.0, loads=[4, 2])
    live = {**figures, "steady_rate": 5000.0, "offered_rate": 14_000.0, "p99_ms": 1200.0}
    checks = compare("key", {**figures, "p99_ms": 500.0}, live)
    row = table({"runs": [{"label": "key", "rank": 3, "checks": [c.summary() for c in checks]}]})
    # Rate 5000 / 6500 = 0.77: outside ±15 %; p99 1200 / 500 = 2.4: outside 2×; loads equal.
    assert row.splitlines()[-1] == (
        "| key | 3 | 6,500 | 5,000 | 0.77 | **no** | 500 | 1,200 | 2.40 | **no** "
        "| 2.00 | 2.00 | yes |"
    )


def test_a_note_warns_when_a_routing_table_settings_busiest_worker_is_past_capacity() -> None:
    # One key: its worker takes every record, at C = 1 ms a capacity of 1,000 records/s.
    keys = uniform(["a"] * 1000)
    busy = advise(keys, 4, 1000.0, 2000.0, schemes=["key", "mixed"], batch_ms=0.0)
    assert any(note.startswith("mixed: the busiest worker is past") for note in busy.notes)
    calm = advise(keys, 4, 1000.0, 500.0, schemes=["key", "mixed"], batch_ms=0.0)
    assert not any("past its capacity" in note for note in calm.notes)

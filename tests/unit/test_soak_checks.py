"""The soak's pure parts: its fault schedule and the checks on its samples."""

from __future__ import annotations

import itertools

import pytest

from bench import chaos, soak_checks
from bench.soak_samples import Sample


def sample(t: float, produced: int, applied: int, state_keys: int = 8) -> Sample:
    return Sample(
        t_s=t,
        produced=[produced],
        grouped=[produced],
        applied=[applied],
        latency=[{}],
        rss_mb={},
        redis_memory_mb=None,
        redis_keys=None,
        state_keys=state_keys,
        kafka_log_mb=None,
    )


def test_the_schedule_is_the_seed_s_and_covers_every_kind_in_turn() -> None:
    faults = chaos.schedule(14, 3600.0, seed=5)
    assert faults == chaos.schedule(14, 3600.0, seed=5)
    assert faults != chaos.schedule(14, 3600.0, seed=6)
    assert sorted(f.kind for f in faults) == sorted(chaos.KINDS * 2)
    assert all(720.0 <= f.at_s <= 2880.0 for f in faults)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)


def test_overlapping_faults_are_of_two_kinds_at_once_or_during_the_recovery() -> None:
    faults = chaos.schedule(24, 3600.0, seed=1)
    gaps = [(b.at_s - a.at_s, a.kind, b.kind) for a, b in itertools.pairwise(faults)]
    together = [g for g in gaps if g[0] == 0.0]
    during = [g for g in gaps if g[0] == chaos.DOWN_SECONDS + 1.0]
    assert together and during  # seed 1 has both
    assert all(a != b for _, a, b in together + during)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)


def test_a_schedule_of_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="no fault kind 'disk'"):
        chaos.schedule(3, 300.0, seed=1, kinds=["broker", "disk"])


def test_the_lag_is_back_when_it_is_at_most_its_highest_before_the_kill() -> None:
    samples = [sample(t, 1000 * t, 1000 * t - 500) for t in range(0, 40)]  # lag 500
    samples += [sample(t, 1000 * t, 1000 * 40 - 500) for t in range(40, 50)]  # stalled
    samples += [sample(t, 1000 * t, 1000 * t - 400 * (60 - t)) for t in range(50, 61)]
    struck = [chaos.Struck(chaos.Fault(40.0, "broker", 0), "kafka-1", 40.0, 44.0)]
    # lag at t (50..60): 400 * (60 - t), at most 500 from t = 59 on
    assert soak_checks.lag_recovery(samples, struck, runs=1) == {0: 15.0}
    never = samples[:45]
    assert soak_checks.lag_recovery(never, struck, runs=1) == {0: None}


def test_a_process_s_growth_is_from_the_reference_to_its_last_sample() -> None:
    rss = {
        1: [(0.0, 50.0), (100.0, 100.0), (600.0, 120.0)],
        2: [(300.0, 80.0), (600.0, 160.0)],  # started after the reference: a new process
        3: [(0.0, 10.0), (50.0, 11.0)],  # gone before the reference
        4: [(0.0, 10.0), (100.0, 10.0), (300.0, 30.0)],  # killed by a fault: no end
    }
    assert soak_checks.growth(rss, reference_s=100.0) == {1: 1.2}


def test_the_verdicts_name_what_failed() -> None:
    data = {
        "seconds": 3600.0,
        "state_keys": {"reference": 16, "max_after": 900},
        "checks": {
            "exact": True,
            "nothing_lost_or_doubled": True,
            "no_stage_left_stopped": False,
            "rss_grown": {"kafka-1": 1.31},
            "state_keys_flat": False,
            "lag_recovered": True,
            "p99_within": True,
        },
    }
    verdicts = dict(soak_checks.verdicts(data))
    assert verdicts["no stage or service left stopped"] == "NO"
    assert verdicts["RSS of every process at the end within 1.10x of its RSS 600 s in"] == (
        "NO: kafka-1 1.31x"
    )
    assert verdicts["partial-state keys flat (closed windows' deleted)"] == (
        "NO (16, then at most 900)"
    )

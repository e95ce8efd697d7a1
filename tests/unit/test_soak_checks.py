"""The soak's pure parts: its fault schedule and the checks on its samples."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import chaos, soak, soak_checks
from bench.soak_samples import Sample
from pipeline.io import config
from pipeline.runs.plan import RunPlan

PLAN = RunPlan("pkg", 100, workers=2, workload="zipf:z=1,keys=10")


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


def judged(
    samples: list[Sample],
    seconds: float,
    struck: list[chaos.Struck] | None = None,
    summaries: list[dict[str, Any]] | None = None,
    plan: RunPlan = PLAN,
) -> dict[str, Any]:
    """The soak's figures and checks of one run at 1,000 records/s."""
    return soak_checks.results(
        plans=[plan],
        rate=1000.0,
        capacity=None,
        load=0.5,
        seed=1,
        seconds=seconds,
        samples=samples,
        struck=struck or [],
        summaries=summaries or [],
        stopped=[],
        services_down=[],
        ran_s=seconds,
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


def test_a_lag_that_dips_under_its_level_and_rises_again_is_not_back() -> None:
    """A cold executor's slow micro-batches: the lag falls under its level after each one and
    climbs again during the next, until the executor is warm."""
    samples = [sample(t, 1000 * t, 1000 * t - 500) for t in range(0, 40)]  # lag 500
    sawtooth = {t: 300 if t % 6 == 0 else 3000 for t in range(40, 70)}  # dips at 42, 48, .., 66
    samples += [sample(t, 1000 * t, 1000 * t - lag) for t, lag in sawtooth.items()]
    samples += [sample(t, 1000 * t, 1000 * t - 400) for t in range(70, 90)]
    struck = [chaos.Struck(chaos.Fault(40.0, "executor", 0), "executor 1", 40.0, 41.0)]
    assert soak_checks.lag_recovery(samples, struck, runs=1) == {0: 29.0}  # from t = 70 on


def test_an_executor_counts_as_registered_and_serving_once_its_stderr_says_so(
    tmp_path: Path,
) -> None:
    """An executor's stderr is in its work directory, its current directory; a replacement
    executor fault is restarted when it has finished a task, not when the JVM starts or
    registers."""
    stderr = tmp_path / "stderr"
    stderr.write_bytes(b"Spark Executor Command: java ...\n")
    executor = subprocess.Popen(["sleep", "30"], cwd=tmp_path)
    try:
        assert not chaos.executor_says(executor.pid, chaos.REGISTERED)
        with stderr.open("ab") as out:
            out.write(b"INFO CoarseGrainedExecutorBackend: " + chaos.REGISTERED + b"\n")
        assert chaos.executor_says(executor.pid, chaos.REGISTERED)
        assert not chaos.executor_says(executor.pid, chaos.SERVED)
        with stderr.open("ab") as out:
            out.write(b"26/12/07 08:03:44 INFO Executor: Finished task 1.0 in stage 3198.0\n")
        assert chaos.executor_says(executor.pid, chaos.SERVED)
    finally:
        executor.kill()
        executor.wait()
    assert not chaos.executor_says(executor.pid, chaos.REGISTERED)  # gone


def test_the_level_before_a_fault_leaves_out_the_recovery_from_an_earlier_one() -> None:
    """A broker killed at 20 s drove the lag to 5,000 until 40 s; the executor killed at 100 s
    is back at the lag's own level, 500, not at the earlier fault's."""
    lags = {t: 5000 if 20 <= t < 40 else 500 for t in range(0, 100)}
    lags |= {t: 3000 for t in range(100, 110)} | {t: 500 for t in range(110, 140)}
    samples = [sample(t, 1000 * t, 1000 * t - lag) for t, lag in lags.items()]
    struck = [
        chaos.Struck(chaos.Fault(20.0, "broker", 0), "kafka-1", 20.0, 25.0),
        chaos.Struck(chaos.Fault(100.0, "executor", 0), "executor 1", 100.0, 105.0),
    ]
    assert soak_checks.lag_recovery(samples, struck, runs=1) == {0: 15.0, 1: 5.0}


def test_a_lost_executor_is_restarted_once_its_replacement_has_finished_a_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Executor 2 of run "r" was killed; 3 replaces it, registers at the 2nd look and finishes
    its first task at the 4th: the fault is restarted then, its registration noted."""
    from pipeline.services import spark_standalone

    looks: list[bytes] = []

    def says(pid: int, line: bytes) -> bool:
        looks.append(line)
        return pid == 3 and len(looks) >= (2 if line == chaos.REGISTERED else 4)

    monkeypatch.setattr(spark_standalone, "executor_pids", lambda _settings, _runs: [1, 3])
    monkeypatch.setattr(chaos, "executor_says", says)
    monkeypatch.setattr(chaos.time, "sleep", lambda _seconds: None)
    injector = chaos.Injector(settings=None, pipelines=[], origin=0.0)
    struck = chaos.Struck(chaos.Fault(1.0, "executor", 0))
    injector._until_replaced(struck, {"r": {1, 2}})
    assert looks == [chaos.REGISTERED] * 2 + [chaos.SERVED] * 2
    assert struck.details["registered_s"] is not None and struck.restarted_s is not None
    assert "replacement" not in struck.details


def test_a_replacement_that_registered_as_the_streams_ended_is_restarted_without_a_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Executor 3 replaces 2 and registers, and then the runs apply their last records before
    any task of it finishes: no batch is left for it, so the fault is restarted then (not left
    waiting for a task that cannot come), with a note that it served none."""
    from pipeline.services import spark_standalone

    applied = iter([False, False, True])
    monkeypatch.setattr(spark_standalone, "executor_pids", lambda _settings, _runs: [1, 3])
    monkeypatch.setattr(chaos, "executor_says", lambda pid, line: line == chaos.REGISTERED)
    monkeypatch.setattr(chaos.time, "sleep", lambda _seconds: None)
    injector = chaos.Injector(
        settings=None, pipelines=[], origin=0.0, applied=lambda: next(applied)
    )
    struck = chaos.Struck(chaos.Fault(1.0, "executor", 0))
    injector._until_replaced(struck, {"r": {1, 2}})
    assert struck.restarted_s is not None
    assert struck.details["served"] == "no task: the streams ended first"
    assert "replacement" not in struck.details


def test_faults_that_overlap_are_back_from_the_last_restart_of_their_episode() -> None:
    """An aggregator killed with an executor of the other run: the lag cannot be back while
    the executor's replacement is still cold, so both count from its restart, against the
    lag before the first kill; a fault during that recovery joins them."""
    samples = [sample(t, 1000 * t, 1000 * t - 500) for t in range(0, 40)]  # lag 500
    samples += [sample(t, 1000 * t, 1000 * 40 - 500) for t in range(40, 70)]  # stalled
    samples += [sample(t, 1000 * t, 1000 * t - 400) for t in range(70, 120)]
    struck = [
        chaos.Struck(chaos.Fault(40.0, "aggregator", 0), "aggregate", 40.0, 43.0),
        chaos.Struck(chaos.Fault(40.0, "executor", 1), "executor 1", 40.5, 65.0),
        chaos.Struck(chaos.Fault(100.0, "broker", 1), "kafka-1", 100.0, 104.0),
    ]
    assert [e.faults for e in soak_checks.episodes(struck)] == [[0, 1], [2]]
    # back at t = 70, 5 s after the executor's restart, 27 s after the aggregator's
    assert soak_checks.lag_recovery(samples, struck, runs=1) == {0: 5.0, 1: 5.0, 2: 0.0}
    # A broker killed 15 s after the executor's restart strikes during its recovery.
    during = [*struck[:2], chaos.Struck(chaos.Fault(80.0, "broker", 1), "kafka-1", 80.0, 84.0)]
    assert [e.faults for e in soak_checks.episodes(during)] == [[0, 1, 2]]


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
            "redis_keys_flat": True,
            "result_keys_flat": False,
            "lag_recovered": True,
            "p99_within": True,
        },
        "redis_keys": {"reference": 2000, "max_after": 2100},
        "result_keys": {"reference": 12, "max_after": 700},
    }
    verdicts = dict(soak_checks.verdicts(data))
    assert verdicts["no stage or service left stopped"] == "NO"
    assert verdicts["RSS of every process at the end within 1.10x of its RSS 600 s in"] == (
        "NO: kafka-1 1.310x"
    )
    assert verdicts["partial-state keys flat (closed windows' deleted)"] == (
        "NO (16, then at most 900)"
    )
    assert (
        verdicts["Redis keys flat (at most 1.10x the count 600 s in)"]
        == "yes (2000, then at most 2100)"
    )
    results = (
        "results of closed windows leave Redis once checked (`--keep-results`; outside the faults)"
    )
    assert verdicts[results] == "NO (12, then at most 700)"


def test_a_count_is_flat_within_its_factor_or_slack_of_the_reference() -> None:
    def counted(t: float, redis_keys: int, result_keys: int) -> Sample:
        return dataclasses.replace(sample(t, 0, 0), redis_keys=redis_keys, result_keys=result_keys)

    samples = [counted(0.0, 900, 0), counted(600.0, 1000, 10), counted(3000.0, 1100, 22)]
    data = soak_checks.results(
        plans=[PLAN], rate=1.0, capacity=None, load=0.5, seed=1, seconds=3600.0, samples=samples,
        struck=[], summaries=[], stopped=[], services_down=[], ran_s=3600.0,
    )  # fmt: skip
    assert data["redis_keys"] == {"reference": 1000, "max_after": 1100}
    assert data["checks"]["redis_keys_flat"]  # 1.1x
    assert data["checks"]["result_keys_flat"]  # 2x, more than 10 + 12 x 1 run of slack
    samples.append(counted(3600.0, 1101, 23))
    data = soak_checks.results(
        plans=[PLAN], rate=1.0, capacity=None, load=0.5, seed=1, seconds=3600.0, samples=samples,
        struck=[], summaries=[], stopped=[], services_down=[], ran_s=3600.0,
    )  # fmt: skip
    assert not data["checks"]["redis_keys_flat"] and not data["checks"]["result_keys_flat"]


def test_the_p99_reference_starts_once_the_start_up_backlog_is_applied() -> None:
    """Applying starts at 20 s on a backlog of 20 s of records, drained by 40 s; the lag's
    median over the first part is its steady 500, first reached at 40 s."""
    samples = [sample(t, 1000 * t, 0) for t in range(0, 20)]
    samples += [sample(t, 1000 * t, 2000 * (t - 20) + 1) for t in range(20, 40)]
    samples += [sample(t, 1000 * t, 1000 * t - 500) for t in range(40, 600)]
    assert soak_checks.startup_end(samples, reference_s=100.0, runs=1) == 40.0
    # Its records waited up to 20 s; the steady ones 0.5 s, and so does the rest.
    for x in samples:
        x.latency[0][20_000 if x.t_s < 40 else 500] = 1000
    data = judged(samples, seconds=600.0)
    assert data["startup_s"] == 40.0
    assert data["p99"][0]["first"] == data["p99"][0]["rest"]
    label = dict(soak_checks.verdicts(data))
    assert any("from 40 s in, the start-up's backlog applied" in check for check in label)


def test_a_soak_whose_kafka_logs_the_disk_cannot_hold_is_refused(tmp_path: Path) -> None:
    """The Kafka logs keep every record until the runs are checked: a soak that would fill the
    disk stops before it starts, with one line, not with every node at once an hour in."""
    settings = config.load({config.ENV_RUN_DIR: str(tmp_path / "run")})
    soak.require_disk(settings, 1_000_000)  # 0.3 GB
    with pytest.raises(soak.SoakError) as refused:
        soak.require_disk(settings, 10**15)
    message = str(refused.value)
    assert message.startswith("the soak's Kafka logs need about 350000000.0 GB")
    assert f"{tmp_path} has " in message and "\n" not in message


def start_up_then_drain(seconds: int, rate: float) -> list[int]:
    """A run's lag as the capacity measure met it on the cluster: its backlog grows for 45 s
    while its Spark applications start (to 27 s of a 1,000 records/s rate), then drains at a
    third of the rate."""
    lags, lag = [], 0.0
    for t in range(seconds):
        lag = lag + 0.6 * rate if t < 45 else max(0.0, lag - 0.3 * rate)
        lags.append(int(lag))
    return lags


def test_a_try_keeps_up_once_its_start_up_s_backlog_drains_and_is_long_enough_to_see_it() -> None:
    rate = 1000.0
    assert soak.kept_up(start_up_then_drain(soak.SUSTAIN_SECONDS, rate), rate)
    # A minute's try ends as the backlog peaks: it read as falling behind at any rate.
    assert not soak.kept_up(start_up_then_drain(60, rate), rate)
    falling_behind = [int(t * rate / 30) for t in range(soak.SUSTAIN_SECONDS)]
    assert not soak.kept_up(falling_behind, rate)


def test_a_cluster_that_keeps_up_with_no_share_stops_the_soak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tried: list[float] = []

    def falls_behind(_settings: object, plans: list[float]) -> bool:
        tried.append(sum(plans))
        return False

    monkeypatch.setattr(soak, "saturating_rate", lambda _settings: 10_000.0)
    monkeypatch.setattr(soak, "plan_of", lambda _settings, _scheme, rate, *_a, **_k: rate)
    monkeypatch.setattr(soak, "keeps_up", falls_behind)
    with pytest.raises(soak.SoakError, match="kept up with none of 80%, 65%, 50%, 40%"):
        soak.measure_capacity(None, lambda _line: None)
    assert tried == [8000.0, 6500.0, 5000.0, 4000.0]
    monkeypatch.setattr(soak, "keeps_up", lambda _settings, plans: sum(plans) <= 6500.0)
    assert soak.measure_capacity(None, lambda _line: None) == 6500.0


def test_a_live_bench_stopped_by_sigterm_leaves_through_its_clean_up() -> None:
    """A soak stopped with SIGTERM (a supervisor's stop, or `kill`; a background job started
    from a script ignores Ctrl-C) runs its ``finally`` blocks, as on Ctrl-C: without them its
    runs' topics and Redis keys would stay behind."""
    import argparse
    import os
    import signal
    import time

    from bench import cli

    cleaned: list[bool] = []

    def run() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal lands in here
        finally:
            cleaned.append(True)

    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt):
            cli._write_live(argparse.Namespace(bench_command="soak"), "skewer bench soak", run)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cleaned == [True]


def test_a_recorded_soak_is_judged_again_and_a_file_that_is_not_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--recheck` rebuilds the samples, faults and runs from a soak's JSON and checks them as
    the soak did; a file that is not a soak's JSON is one line and exit 2."""
    import argparse

    from bench import cli
    from pipeline.cli.arguments import UsageError

    samples = [sample(t, 1000 * t, 1000 * t - 500) for t in range(0, 90)]
    struck = [chaos.Struck(chaos.Fault(40.0, "broker", 0), "kafka-1", 40.0, 44.0)]
    summary = {"run_id": "r", "scheme": "pkg", "records": 9, "produced": 9, "processed": 9}
    summary |= {"exact": True, "verification": [], "restarts": {}}
    recorded = judged(samples, 90.0, struck, [summary], dataclasses.replace(PLAN, run_id="r"))
    data = json.loads(json.dumps(recorded))  # as the page's JSON holds it
    monkeypatch.setattr(soak, "figure", lambda _data: None)  # the picture is not checked here
    again = soak.recheck(data).data
    assert again["checks"] == recorded["checks"] and again["faults"] == recorded["faults"]
    assert soak.command_of(data).endswith("--faults 1 --seed 1 --rate 1000")
    other = tmp_path / "other.json"
    other.write_text('{"rows": []}')
    args = argparse.Namespace(bench_command="soak", recheck=other, out=tmp_path)
    with pytest.raises(UsageError, match="not a soak's JSON"):
        cli.run_soak(args)

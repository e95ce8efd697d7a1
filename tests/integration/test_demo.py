"""`skewer demo`: the whole pipeline through its real entry points, and its failures at start.

The acceptance command -- ``skewer demo --scheme pkg --records 100000 --verify --json`` --
runs produce, group, work (its own Spark) and aggregate as subprocesses. Its per-worker loads
are checked against PKG written out by hand (two MurmurHash3 choices, seeds 13 and 17, the less
loaded by this source's own counts, ties to the first: Nasir et al., The Power of Both Choices,
ICDE 2015, §III).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import mmh3
import pytest

from operators.metrics import load_figures
from pipeline.cli import app
from pipeline.cli.demo import ProgressPrinter
from pipeline.io import config, kafka_io, probes
from pipeline.runs.orchestrator import Progress
from pipeline.runs.plan import RunPlan
from pipeline.services import process

WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"


def pkg_reference_loads(keys: list[bytes], workers: int, sources: int) -> list[int]:
    """Partial key grouping, one slow obvious loop per source over its records s, s+S, ..."""
    total = [0] * workers
    for source in range(sources):
        local = [0] * workers
        for key in keys[source::sources]:
            first = abs(mmh3.hash64(key, 13, signed=True)[0]) % workers
            second = abs(mmh3.hash64(key, 17, signed=True)[0]) % workers
            chosen = second if local[second] < local[first] else first
            local[chosen] += 1
        total = [a + b for a, b in zip(total, local, strict=True)]
    return total


@pytest.mark.integration
def test_demo_pkg_100000_verify_json_is_exact_and_reports_the_contract_fields(
    settings: config.Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from producers.workloads import parse

    code = app.main(["demo", "--scheme", "pkg", "--records", "100000", "--verify", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)

    keys = parse(f"{WORKLOAD},n=100000").keys().to_list()
    loads = pkg_reference_loads(keys, workers=8, sources=2)
    assert report["scheme"] == "pkg"
    assert report["records_produced"] == report["records_processed"] == 100_000
    assert report["exact"] is True
    assert report["verification"]["mismatch_count"] == 0
    # 100,000 records at 4,000 records per second of event time, from a window boundary.
    assert report["windows"] == 3
    assert report["per_worker"] == loads
    assert report["imbalance_final"] == round(max(loads) - 100_000 / 8, 3)
    assert report["max_avg_ratio"] == round(max(loads) / (100_000 / 8), 4)
    assert report["dead_letters"] == 0
    assert report["throughput"] > 0 and report["seconds"] > 0
    assert report["throughput"] == pytest.approx(100_000 / report["seconds"], rel=1e-3)
    assert 0 < report["latency_p50_ms"] <= report["latency_p99_ms"]
    # PKG keeps a key on at most two workers: between 1 and 2 state entries per key.
    assert 1.0 < report["replication"] <= 2.0
    # Progress went to stderr, the JSON alone to stdout.
    assert "produced" in captured.err and captured.out.count("\n") == 1
    # The start-up timeline: the orchestrator's events in the order it meets them (Spark and the
    # gated producers first, the other stages once Spark committed a micro-batch; the producers
    # send once the workers applied the warm-up batches and the grouping sources started), the
    # first record applied after the producers started, every event's seconds in order.
    at = {e["event"]: e["seconds"] for e in report["timeline"]}
    order = [
        "command started",
        "services checked",
        "work started",
        "run prepared",
        "produce started",
        "Spark workers ready",
        "aggregate started",
        "group started",
        "workers warmed up",
        "grouping sources ready",
        "producers started",
        "verified",
    ]
    assert [at[event] for event in order] == sorted(at[event] for event in order)
    assert at["command started"] == 0
    assert at["producers started"] < at["first record applied"] <= at["last record applied"]
    # The producers started up with the other stages, but sent nothing before their go (a
    # Kafka timestamp is in whole ms, the timeline's seconds are rounded to 10 ms).
    assert at["first record produced"] >= at["producers started"] - 0.01
    assert at["first record applied"] <= at["every window final"] < at["verified"]
    assert {"first record produced", "last record produced"} <= set(at)
    seconds = [e["seconds"] for e in report["timeline"]]
    assert seconds == sorted(seconds)
    assert report["first_applied_seconds"] == at["first record applied"]
    # Every record counts in one 5 s window; the steady state is there or (a backlog applied
    # in one jump past 20 %) empty.
    windows = report["latency_windows"]
    assert sum(w["records"] for w in windows) == 100_000
    assert all(w["start_s"] % 5 == 0 for w in windows)
    steady = (report["latency_steady_p50_ms"], report["latency_steady_p99_ms"])
    assert steady == (None, None) or 0 < steady[0] <= steady[1]


def _children(pid: int) -> dict[int, str]:
    """pid -> skewer subcommand of the processes whose parent is ``pid``."""
    found = {}
    for child in process.child_pids(pid, b"pipeline.cli"):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        found[child] = argv[argv.index(b"pipeline.cli") + 1].decode()
    return found


def _group_members(pgids: set[int]) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] != "Z" and int(fields[2]) in pgids:
                members.append(int(entry.name))
    return members


@pytest.mark.integration
def test_ctrl_c_stops_every_stage_with_its_children_and_deletes_the_run(
    settings: config.Settings, kafka: str, redis: Any
) -> None:
    run_id = f"demo-sigint-{uuid.uuid4().hex[:6]}"
    argv = ["demo", "--records", "100000", "--run-id", run_id, "--cpu-cost-us", "2000", "--quiet"]
    demo = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # Ctrl-C's SIGINT as a terminal delivers it, even when this test session was started
        # in the background by a shell without job control, whose children inherit SIGINT
        # ignored (and Python then installs no KeyboardInterrupt handler).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stages: dict[int, str] = {}
    deadline = time.monotonic() + 120
    # Wait until the workers process records: every stage has started by then.
    while not int(redis.hlen(f"skewer:{run_id}:stats:records") or 0):
        assert demo.poll() is None, demo.communicate()
        assert time.monotonic() < deadline, "the demo did not get going"
        stages.update(_children(demo.pid))
        time.sleep(0.1)
    stages.update(_children(demo.pid))
    assert {"work", "aggregate", "group"} <= set(stages.values())
    os.kill(demo.pid, signal.SIGINT)
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 130, err
    assert b"skewer demo: interrupted: every stage stopped" in err
    # Every stage leads its own process group: the Spark JVM and Python workers, the grouping
    # stage's source processes went with them.
    assert _group_members(set(stages)) == []
    assert all(kafka_io.topic_partitions(kafka, f"{run_id}-{t}") is None for t in ("keys", "work"))
    assert list(redis.scan_iter(match=f"skewer:{run_id}:*")) == []
    # The stage logs of an interrupted run stay for a look; this test's go.
    logs = config.load().run_dir / "demo" / run_id
    assert (logs / "work.err").exists()
    shutil.rmtree(logs)


@pytest.mark.integration
def test_an_existing_run_is_refused_and_left_alone(
    settings: config.Settings, kafka: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"demo-taken-{uuid.uuid4().hex[:6]}"
    kafka_io.ensure_topic(kafka, f"{run_id}-work", 3)
    try:
        assert app.main(["demo", "--records", "10", "--run-id", run_id, "--quiet"]) == 1
        assert capsys.readouterr().err == (
            f"skewer demo: error: run '{run_id}' exists already (topic '{run_id}-work'); "
            "use another --run-id and --topic-prefix\n"
        )
        assert kafka_io.topic_partitions(kafka, f"{run_id}-work") == 3
    finally:
        kafka_io.delete_topics(kafka, [f"{run_id}-work"])


@pytest.mark.integration
@pytest.mark.native_only("starts a native Redis for the run, as the demo does")
def test_a_service_that_does_not_answer_is_started_for_the_run_and_stopped_after(
    kafka: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from live_runs import free_port

    from pipeline.runs.service_lease import ensure_services

    port = free_port()
    # A private Redis (own port and run directory) beside the session's services.
    monkeypatch.setenv(config.ENV_RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, kafka)
    monkeypatch.setenv(config.ENV_REDIS_URL, f"redis://127.0.0.1:{port}/0")
    settings = config.load()
    assert not probes.redis_answers(settings.redis_url)
    lease = ensure_services(settings, start=True)
    try:
        assert lease.started == ["redis"] and lease.leased == ["redis"]
        assert probes.redis_answers(settings.redis_url)
    finally:
        lease.release()
    assert not probes.redis_answers(settings.redis_url)


@pytest.mark.integration
def test_a_failing_stage_stops_the_run_with_its_own_error_line(settings: config.Settings) -> None:
    from pipeline.runs.orchestrator import Pipeline, StageFailedError

    plan = RunPlan(
        scheme="key", records=10, workers=2, sources=1, run_id=f"demo-fail-{uuid.uuid4().hex[:6]}"
    )
    with Pipeline(plan) as pipeline:
        try:
            pipeline.prepare()
            # The run's recorded window length disagrees with the aggregator's: it refuses.
            pipeline.store.client.hset(pipeline.store.keys.config, "window_ms", 5000)
            pipeline.start_all(["aggregate"])
            with pytest.raises(StageFailedError) as failed:
                pipeline.wait(timeout=60)
        finally:
            pipeline.cleanup()
    assert failed.value.stage == "aggregate" and failed.value.code == 2
    assert failed.value.reason == (
        f"skewer aggregate: error: run '{plan.run_id}' uses window_ms=5000, not 10000: "
        "pass --window-ms 5000"
    )
    assert str(failed.value).startswith(f"aggregate failed (exit 2): {failed.value.reason} (log: ")


@pytest.mark.integration
def test_the_warm_up_runs_micro_batches_through_every_worker_and_changes_nothing() -> None:
    from pipeline.runs.orchestrator import Pipeline

    plan = RunPlan(
        scheme="pkg", records=10, workers=4, sources=2, run_id=f"demo-warm-{uuid.uuid4().hex[:6]}"
    )
    with Pipeline(plan) as pipeline:
        try:
            pipeline.prepare(start_work=True)
            pipeline.wait_work_ready()
            before = pipeline.store.applied_batches(plan.workers)
            pipeline.warm_up_workers(3)
            after = pipeline.store.applied_batches(plan.workers)
            # Three rounds, each waited for until every worker applied a later batch.
            assert all(
                b is not None and b - (a if a is not None else -1) >= 3
                for a, b in zip(before, after, strict=True)
            ), (before, after)
            # Source 0's watermark at event time 0 with source 1 silent: no worker has a
            # watermark, and nothing was counted.
            assert pipeline.store.worker_watermarks(plan.workers) == [None] * plan.workers
            assert pipeline.store.processed_per_worker(plan.workers).tolist() == [0] * 4
        finally:
            pipeline.stop()
            pipeline.cleanup()


def test_demo_rejects_an_unknown_scheme_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["demo", "--scheme", "nope", "--records", "10"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith("skewer demo: error: unknown scheme 'nope'; valid schemes: key, ")


def test_demo_rejects_a_simulator_only_scheme(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["demo", "--scheme", "pkg-global", "--records", "10"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "pkg-global reads global state no live source has" in error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--sources", "0"], "--sources must be >= 1, got 0"),
        (["--records", "0"], "--records must be >= 1, got 0"),
        (["--cpu-cost-us", "-1"], "--cpu-cost-us must be >= 0, got -1.0"),
        (["--window", "0"], "--window must be >= 1, got 0"),
    ],
)
def test_demo_rejects_bad_numbers(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert app.main(["demo", *argv]) == 2
    assert capsys.readouterr().err == f"skewer demo: error: {message}\n"


def test_demo_uses_grouping_scheme_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GROUPING_SCHEME", "not-a-scheme")
    assert app.main(["demo", "--records", "10"]) == 2
    assert "unknown scheme 'not-a-scheme'" in capsys.readouterr().err


def test_demo_with_an_unreachable_broker_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Port 1 on the loopback address: nothing listens there; --no-start: do not start one.
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, "127.0.0.1:1")
    assert app.main(["demo", "--records", "10", "--no-start"]) == 1
    assert capsys.readouterr().err == (
        "skewer demo: error: kafka does not answer at 127.0.0.1:1 (--no-start); "
        "start it: skewer services up\n"
    )


def test_a_remote_broker_that_does_not_answer_is_never_started(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # TEST-NET-1 (RFC 5737): not ours, so not ours to start either.
    monkeypatch.setenv(config.ENV_KAFKA_BOOTSTRAP, "192.0.2.1:9092")
    assert app.main(["demo", "--records", "10"]) == 1
    assert capsys.readouterr().err == (
        "skewer demo: error: kafka does not answer at 192.0.2.1:9092; "
        "start it: skewer services up\n"
    )


def test_plan_commands_and_balance_figures() -> None:
    plan = RunPlan(
        scheme="fish", records=500, workers=3, sources=1, rate=250.0, run_id="x", cpu_cost_us=0.5
    )
    assert " ".join(plan.argv("produce")) == (
        "produce --workload zipf:z=1.2,keys=100000,seed=0 --records 500 --sources 1 "
        "--window-ms 10000 --event-rate 4000 --rate 250 --run-id x --topic-prefix x- --scheme fish "
        "--json"
    )
    assert " ".join(plan.argv("aggregate")) == (
        "aggregate --workers 3 --window-ms 10000 --lateness-ms 0 --top-k 10 --run-id x "
        "--topic-prefix x- --scheme fish --until-end --json"
    )
    checkpoint = plan.checkpoint_dir(config.load())
    assert " ".join(plan.argv("work")) == (
        "work --workers 3 --sources 1 --window-ms 10000 --cpu-cost-us 0.5 --checkpoint "
        f"{checkpoint} --spark-master local --jit quick --trigger micro-batch --run-id x "
        "--topic-prefix x- "
        "--scheme fish --until-end --verbose --json"
    )
    assert plan.topics == ["x-keys", "x-work", "x-dead-letters", "x-late", "x-results"]
    assert plan.stages == ("work", "aggregate", "group", "produce")  # no routing table
    mixed = RunPlan(
        scheme="mixed", records=500, run_id="y", control_interval=1.5, params=("theta_max=0.1",)
    )
    assert mixed.stages == ("work", "aggregate", "control", "group", "produce")
    assert " ".join(mixed.argv("control")) == (
        "control --scheme mixed --workers 8 --sources 2 --interval 1.5 --param theta_max=0.1 "
        "--run-id y --topic-prefix y- --until-end --json"
    )
    assert " ".join(mixed.argv("group")) == (
        "group --scheme mixed --workers 8 --sources 2 --param theta_max=0.1 --run-id y "
        "--topic-prefix y- --until-end --json"
    )
    assert mixed.stage_config(config.load()).params == {"theta_max": 0.1}
    # I = max - avg and lambda = max / avg (PKG §II), by hand: loads 6, 2, 1 -> avg 3.
    assert load_figures([6, 2, 1]) == (3.0, 3.0 / 9, 2.0)
    assert load_figures([0, 0]) == (0.0, 0.0, 0.0)


def test_progress_lines() -> None:
    progress = Progress(
        elapsed=3.3,
        produced=500,
        grouped=400,
        processed=300,
        loads=[200, 50, 50],
        windows_final=1,
    )
    assert progress.line(1000) == (
        "[   3.3 s] produced 500/1,000 · grouped 400 · processed 300 (30%) · windows final 1 · "
        "load max/avg 2.00 (worker 0: 200)"
    )
    stream = io.StringIO()
    printer = ProgressPrinter(1000, stream)
    for _ in range(6):
        printer(progress)
    # Not a terminal: every fifth report is printed, as a line of its own.
    assert stream.getvalue().count("\n") == 2


def test_benchmark_table_ratios_and_verdicts() -> None:
    from bench.end_to_end import markdown

    def fake(scheme: str, throughput: float, p99: float, hottest: float) -> dict[str, Any]:
        return {
            "scheme": scheme,
            "throughput": throughput,
            "seconds": 100_000 / throughput,
            "bound_seconds": hottest * 100,
            "latency_p50_ms": p99 / 2,
            "latency_p99_ms": p99,
            "max_avg_ratio": hottest * 8,
            "hottest_share": hottest,
            "replication": 1.0,
            "exact": True,
            "offered_rate": 40_000.0,
        }

    text = markdown(
        [
            fake("key", 2_000, 40_000, 0.31),
            fake("shuffle", 5_000, 20_000, 0.125),
            fake("pkg", 4_000, 10_000, 0.142),
        ],
        100_000,
        1_000,
    )
    row = "| pkg | 4,000 | 2.00 | 0.80 | - | - | 25.0 | 14.2 | 5,000 | 10,000 | 1.136 | 14.2 % |"
    assert row in text
    assert "- pkg >= 1.6x key throughput: 2.00x -- met." in text
    assert "- pkg >= 0.9x shuffle throughput: 0.80x -- missed." in text
    assert "10,000 ms vs 40,000 ms (0.25x)" in text
    assert "at least 5.0x what the 8 workers can serve together (8,000 records/s)" in text
    # 31 % / 14.2 % and 12.5 % / 14.2 %: the bounds the hottest workers set.
    assert "at most 2.18x key and 0.88x shuffle for pkg" in text


def test_steady_state_leaves_out_start_and_tail() -> None:
    """The steady rate is the slope while a backlog exists between 20 % and 90 % of the
    records; the steady latency is the histogram of what was applied after 20 %."""
    from bench.end_to_end import Trace

    trace = Trace(
        samples=[(1.0, 0, 0), (2.0, 500, 100), (3.0, 900, 300), (5.0, 1000, 700), (6.0, 1000, 950)],
        latency_at_steady={10: 5, 20: 1},
        latency_at_end={10: 5, 20: 9, 30: 2},
    )
    assert trace.steady_rate(1_000) == (700 - 300) / (5.0 - 3.0)
    assert trace.steady_latency() == {20: 8, 30: 2}
    assert Trace(samples=[(1.0, 10, 5)]).steady_rate(10) is None


def test_the_benchmark_stream_facts_that_explain_pkg() -> None:
    """bench/end_to_end.py's PKG_ON_THIS_STREAM, recomputed: the hottest key's share and
    choices, and the second hottest key's two choices landing on one worker."""
    from collections import Counter

    from bench.end_to_end import PKG_ON_THIS_STREAM, WORKERS, WORKLOAD
    from producers.workloads import parse

    keys = parse(f"{WORKLOAD},n=200000").keys().to_list()
    (first, first_count), (second, second_count) = Counter(keys).most_common(2)

    def choices(key: bytes) -> tuple[int, int]:
        return tuple(abs(mmh3.hash64(key, seed, signed=True)[0]) % WORKERS for seed in (13, 17))

    assert round(100 * first_count / len(keys), 1) == 19.7
    assert choices(first) == (6, 0)
    assert round(100 * second_count / len(keys), 1) == 8.5
    assert choices(second) == (3, 3)
    assert "19.7 %" in PKG_ON_THIS_STREAM and "(8.5 %) hashes to worker 3" in PKG_ON_THIS_STREAM

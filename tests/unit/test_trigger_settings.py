"""The workers' trigger as the settings, a run plan and the worker job's options take it:
micro-batch by default, real-time from ``--trigger`` or ``$SKEWER_TRIGGER``, and the settings
that cannot go with Real-Time Mode refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import app
from pipeline.io import config
from pipeline.runs.plan import RunPlan
from pipeline.stages.worker_job import WorkerConfigError, WorkOptions


def _work_options(**fields: object) -> WorkOptions:
    base: dict[str, object] = {
        "workers": 4,
        "sources": 2,
        "kafka_bootstrap": "127.0.0.1:1",
        "redis_url": "redis://127.0.0.1:1/0",
        "checkpoint": Path("/nonexistent"),
        "work_topic": "work",
    }
    return WorkOptions(**{**base, **fields})  # type: ignore[arg-type]


def test_a_plan_passes_its_trigger_to_the_worker_stage() -> None:
    def trigger(plan: RunPlan) -> str:
        argv = plan.argv("work")
        return argv[argv.index("--trigger") + 1]

    assert trigger(RunPlan("pkg", 10, run_id="r")) == "micro-batch"
    real_time = RunPlan("pkg", 10, run_id="r", trigger="real-time")
    assert trigger(real_time) == "real-time"
    assert real_time.work_options(config.load({})).trigger == "real-time"


def test_a_real_time_plans_producers_send_each_record_at_once() -> None:
    """linger.ms 1 for a real-time run's producers (a batch's wait would be its latency), the
    default for a micro-batch run's; a bad value is one line and exit 2."""
    from pipeline.cli import app
    from pipeline.io import kafka_io

    real_time = RunPlan("pkg", 10, run_id="r", trigger="real-time").argv("produce")
    assert real_time[real_time.index("--linger-ms") + 1] == str(kafka_io.REAL_TIME_LINGER_MS)
    assert "--linger-ms" not in RunPlan("pkg", 10, run_id="r").argv("produce")
    parsed = app.build_parser().parse_args(real_time)
    assert parsed.linger_ms == kafka_io.REAL_TIME_LINGER_MS


def test_a_negative_linger_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import app

    assert app.main(["produce", "--records", "10", "--linger-ms", "-1"]) == 2
    assert capsys.readouterr().err == "skewer produce: error: --linger-ms must be >= 0, got -1\n"


def test_settings_that_real_time_mode_cannot_take_are_one_line() -> None:
    with pytest.raises(ValueError, match="--trigger must be one of micro-batch, real-time"):
        RunPlan("pkg", 10, trigger="fast", run_id="r").validate()
    with pytest.raises(ValueError, match="--sum is for --trigger micro-batch"):
        RunPlan("pkg", 10, trigger="real-time", sum="$.amount", run_id="r").validate()
    with pytest.raises(WorkerConfigError, match="--max-records-per-batch is for"):
        _work_options(trigger="real-time", max_records_per_batch=100).validate()
    with pytest.raises(WorkerConfigError, match="one task per worker: --tasks must be W=4"):
        _work_options(trigger="real-time", tasks=2).validate()
    _work_options(trigger="real-time", tasks=4).validate()


def test_real_time_mode_runs_one_task_per_worker() -> None:
    assert _work_options(trigger="real-time").task_count == 4
    assert _work_options(trigger="real-time", spark_master="spark://h:7077").task_count == 4


def test_a_bad_trigger_variable_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(config.ENV_TRIGGER, "fast")
    assert app.main(["work", "--workers", "2", "--spark-master", "local"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "skewer work: error: SKEWER_TRIGGER='fast' is not one of micro-batch, real-time"
    ]

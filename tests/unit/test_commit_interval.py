"""The grouping stage's transaction cadence, ``--commit-interval-ms``: parsed by ``skewer group``,
``demo``, ``bench e2e`` and ``bench grouping``, refused below 1 ms with one line and exit 2, and
carried by a run's plan to the grouping stage's command line. No services: the stage's start is
replaced by a recorder."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.cli import app
from pipeline.io import config, kafka_io
from pipeline.runs.plan import RunPlan
from pipeline.stages import grouping


class _NoExporter:
    def close(self) -> None:
        pass


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[grouping.StageConfig]:
    """The stage configs ``skewer group`` would run, recorded instead of started."""
    from pipeline.cli import group

    configs: list[grouping.StageConfig] = []
    monkeypatch.setattr(grouping, "prepare", configs.append)
    monkeypatch.setattr(grouping, "run_sources", lambda stage, sources: [])
    monkeypatch.setattr(group, "start_exporter", lambda *args, **kwargs: _NoExporter())
    return configs


def test_the_default_is_the_stages_own() -> None:
    assert grouping.COMMIT_INTERVAL_MS == kafka_io.COMMIT_INTERVAL_MS == 100
    stage = grouping.StageConfig("h:1", "redis://h", kafka_io.RunNames(), "key", 2, 1)
    assert stage.commit_interval_ms == 100
    assert RunPlan(scheme="pkg", records=10).commit_interval_ms == 100


def test_a_source_waits_at_most_the_interval_for_a_batch() -> None:
    """The loop's consume call: a batch of up to ``batch_size`` records, waiting at most the
    commit interval (the stage's parts replaced by stand-ins: no Kafka, no Redis)."""
    from types import SimpleNamespace

    calls: list[tuple[int, float]] = []

    class Checkpoint:
        consumer, next_offset = None, 0

        def consume(self, batch_size: int, timeout: float) -> list[Any]:
            calls.append((batch_size, timeout))
            return []

        def close(self) -> None:
            pass

    source = object.__new__(grouping.GroupingSource)
    source.config = grouping.StageConfig(
        "h:1", "redis://h", kafka_io.RunNames(), "key", 2, 1, commit_interval_ms=20
    )
    source.checkpoint = Checkpoint()  # type: ignore[assignment]
    source.start = lambda: None  # type: ignore[method-assign]
    source.tables = None
    source.summary = grouping.SourceSummary(0)
    source.watermark = SimpleNamespace(ended=False)  # type: ignore[assignment]
    source.input = SimpleNamespace(markers_due=lambda *args: False)  # type: ignore[assignment]
    stops = iter([False, True])
    source.run(lambda: next(stops))
    assert calls == [(grouping.DEFAULT_BATCH_SIZE, 0.02)]


@pytest.mark.parametrize(("flags", "expected"), [([], 100), (["--commit-interval-ms", "20"], 20)])
def test_skewer_group_hands_the_interval_to_its_sources(
    flags: list[str], expected: int, started: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["group", "--workers", "2", "--metrics-port", "-1", "--json", *flags]
    assert app.main(argv) == 0
    [stage] = started
    assert stage.commit_interval_ms == expected
    capsys.readouterr()


@pytest.mark.parametrize(
    "argv",
    [
        ["group", "--workers", "2", "--commit-interval-ms", "0"],
        ["demo", "--no-start", "--commit-interval-ms", "0"],
        ["bench", "e2e", "--commit-interval-ms", "0"],
        ["bench", "grouping", "--commit-interval-ms", "100", "0"],
    ],
)
def test_an_interval_below_one_ms_is_one_line_and_exit_2(
    argv: list[str], started: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert app.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"skewer {argv[0]}: error: --commit-interval-ms must be >= 1, got 0\n"
    assert started == []  # refused before anything started


def test_bench_grouping_takes_several_intervals_and_refuses_an_unknown_scheme(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = app.build_parser()
    args = parser.parse_args(["bench", "grouping", "--commit-interval-ms", "100", "20", "5"])
    assert args.commit_interval_ms == [100, 20, 5]
    assert parser.parse_args(["bench", "grouping"]).commit_interval_ms == [100]
    assert parser.parse_args(["bench", "e2e"]).commit_interval_ms == 100
    assert app.main(["bench", "grouping", "--only", "nope"]) == 2
    assert capsys.readouterr().err.startswith("skewer bench: error: --only: no live scheme nope;")


def test_a_run_plan_carries_the_interval_to_the_grouping_stage() -> None:
    default = RunPlan(scheme="pkg", records=10, run_id="r")
    assert "--commit-interval-ms" not in default.argv("group")
    plan = RunPlan(scheme="pkg", records=10, run_id="r", commit_interval_ms=20)
    argv = plan.argv("group")
    assert argv[argv.index("--commit-interval-ms") + 1] == "20"
    assert argv[0] == "group" and argv.count("--commit-interval-ms") == 1
    for stage in ("work", "aggregate", "produce"):
        assert "--commit-interval-ms" not in plan.argv(stage, config.load({}))
    assert plan.stage_config(config.load({})).commit_interval_ms == 20
    with pytest.raises(ValueError, match="--commit-interval-ms must be >= 1, got 0"):
        RunPlan(scheme="pkg", records=10, run_id="r", commit_interval_ms=0).validate()


def test_the_recorded_grouping_results_re_render_from_their_data() -> None:
    import json
    import re

    from bench import grouping_stage, harness

    text = (harness.RESULTS_DIR / "grouping_stage.md").read_text()
    data = json.loads((harness.RESULTS_DIR / "grouping_stage.json").read_text())
    assert re.search(r"^Generated by `skewer bench grouping .*` on:$", text, re.M)
    assert re.search(r"^- CPU: .+\n- cores: \d+$", text, re.M)  # the machine it ran on
    assert text.endswith("\n\n" + grouping_stage.body(data).rstrip() + "\n")
    intervals = [row["commit_interval_ms"] for row in data["intervals"]]
    assert intervals == data["commit_intervals_ms"]
    assert {row["commit_interval_ms"] for row in data["rows"]} == set(intervals)

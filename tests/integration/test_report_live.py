"""The run report against a real Redis: the aggregator's timeline, `skewer report`, and the
report at the end of a real `skewer demo` whose figures must equal the run's Redis counters."""

from __future__ import annotations

import itertools
import json
import shutil
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import app
from pipeline.io import config, kafka_io
from pipeline.io.redis_layout import RunKeys
from pipeline.io.state_store import StateStore
from pipeline.observe import timeline
from pipeline.runs import report


@pytest.fixture
def run_id(redis: Any) -> Iterator[str]:
    run = f"report-{uuid.uuid4().hex[:8]}"
    yield run
    for key in redis.scan_iter(match=f"{RunKeys(run).prefix}*"):
        redis.delete(key)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.integration
def test_the_sampler_appends_cumulative_samples_about_once_a_second(
    redis: Any, run_id: str
) -> None:
    keys = RunKeys(run_id)
    clock = Clock()
    sampler = timeline.TimelineSampler(StateStore(redis, run_id), 3, clock=clock)
    redis.hset(keys.stats("records"), mapping={0: 5, 2: 7})
    redis.hset(keys.stats("routed"), mapping={0: 6, 1: 1, 2: 9})
    assert sampler.tick() == timeline.Sample(1_000_000, (5, 0, 7), (6, 1, 9))
    clock.now += 0.5
    assert sampler.tick() is None  # not due yet
    redis.hincrby(keys.stats("records"), 1, 4)
    clock.now += 0.5
    assert sampler.tick() == timeline.Sample(1_001_000, (5, 4, 7), (6, 1, 9))
    clock.now += 0.25
    sampler.close()  # the final sample, due or not
    raw = redis.lrange(keys.stats("timeline"), 0, -1)
    assert [json.loads(item) for item in raw] == [
        {"t_ms": 1_000_000, "records": [5, 0, 7], "routed": [6, 1, 9]},
        {"t_ms": 1_001_000, "records": [5, 4, 7], "routed": [6, 1, 9]},
        {"t_ms": 1_001_250, "records": [5, 4, 7], "routed": [6, 1, 9]},
    ]


@pytest.mark.integration
def test_the_timeline_keeps_the_newest_samples(
    redis: Any, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timeline, "MAX_SAMPLES", 2)
    for t in range(4):
        timeline.append_sample(redis, run_id, timeline.Sample(t, (t,), (t,)))
    raw = redis.lrange(timeline.timeline_key(run_id), 0, -1)
    assert [timeline.Sample.from_json(item).t_ms for item in raw] == [2, 3]


@pytest.mark.integration
def test_report_reads_samples_loads_and_rebalances_and_counts_malformed_entries(
    redis: Any, run_id: str
) -> None:
    keys = RunKeys(run_id)
    redis.hset(keys.config, mapping={"workers": 2, "window_ms": 10_000})
    redis.hset(keys.stats("records"), mapping={0: 30, 1: 10})
    for sample in (timeline.Sample(0, (0, 0), (0, 0)), timeline.Sample(1_000, (30, 10), (30, 10))):
        timeline.append_sample(redis, run_id, sample)
    redis.rpush(timeline.timeline_key(run_id), b"garbage", b'{"t_ms": 1, "records": [1, 2, 3]}')
    redis.rpush(
        report.rebalances_key(run_id),
        json.dumps({"version": 2, "published_ms": 800, "completed_ms": 900}),
        json.dumps({"version": 1, "published_ms": 300, "completed_ms": None}),
        b"{}",
    )
    data = report.load_report_data(redis, run_id, "mixed")
    assert data.per_worker == [30, 10] and data.final_max_avg == 1.5
    assert [s.t_ms for s in data.samples] == [0, 1_000]
    assert data.rebalances == [report.Rebalance(1, 300, None), report.Rebalance(2, 800, 900)]
    assert data.skipped == {"timeline": 2, "rebalances": 1}


@pytest.mark.integration
def test_skewer_report_writes_the_png_and_refuses_unknown_runs_and_bad_paths(
    settings: config.Settings,
    redis: Any,
    run_id: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert app.main(["report", "--run-id", run_id, "--out", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err == (
        f"skewer report: error: run {run_id!r} has no timeline samples and no worker counters "
        f"in Redis (skewer:{run_id}:stats:*)\n"
    )
    assert not (tmp_path / "x.png").exists()

    redis.hset(RunKeys(run_id).stats("records"), mapping={0: 3, 1: 1})
    redis.rpush(timeline.timeline_key(run_id), b"garbage")
    out = tmp_path / "deeper" / "x.png"
    assert app.main(["report", "--run-id", run_id, "--out", str(out), "--scheme", "key"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{out}\n"
    assert captured.err == "skewer report: skipped 1 malformed timeline entries\n"
    assert png_size(out.read_bytes()) == (1200, 800)

    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert app.main(["report", "--run-id", run_id, "--out", str(blocker / "x.png")]) == 2
    assert capsys.readouterr().err == (
        f"skewer report: error: cannot write {blocker / 'x.png'}: File exists\n"
    )


@pytest.mark.integration
def test_the_demo_report_shows_the_runs_own_figures(
    settings: config.Settings,
    kafka: str,
    redis: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = f"demo-report-{uuid.uuid4().hex[:6]}"
    settings = config.load()
    argv = ["demo", "--scheme", "key", "--records", "20000", "--workers", "4"]
    argv += ["--run-id", run, "--keep", "--json", "--quiet"]
    try:
        assert app.main(argv) == 0
        summary = json.loads(capsys.readouterr().out)
        png = Path(summary["report_png"])
        assert png == settings.run_dir / "reports" / f"{run}.png"
        assert png_size(png.read_bytes()) == (1200, 800)

        # The run's own counters, read straight from Redis.
        keys = RunKeys(run)
        raw = redis.hgetall(keys.stats("records"))
        loads = [int(raw.get(str(w).encode(), 0)) for w in range(4)]
        assert sum(loads) == 20_000
        final_lambda = max(loads) / (sum(loads) / 4)
        assert summary["max_avg_ratio"] == round(final_lambda, 4)
        data = report.load_report_data(redis, run, "key")
        assert data.per_worker == loads
        assert build_figure_title(data) == (
            f"run {run} · scheme key · W=4 workers · 20,000 records · "
            f"final max/avg load λ = {final_lambda:.3f}"
        )

        # The aggregator's timeline: cumulative, in time order, the last sample after the end.
        samples = [json.loads(item) for item in redis.lrange(keys.stats("timeline"), 0, -1)]
        assert len(samples) >= 3
        assert [s["t_ms"] for s in samples] == sorted(s["t_ms"] for s in samples)
        for before, after in itertools.pairwise(samples):
            assert all(a >= b for a, b in zip(after["records"], before["records"], strict=True))
        assert samples[-1]["records"] == loads
        routed = redis.hgetall(keys.stats("routed"))
        assert samples[-1]["routed"] == [int(routed.get(str(w).encode(), 0)) for w in range(4)]
        # Invariant 3: the workers processed exactly what the grouping stage routed to them.
        assert samples[-1]["routed"] == loads

        # `skewer report` of the same run draws the same picture, byte for byte.
        again = tmp_path / "again.png"
        assert app.main(["report", "--run-id", run, "--scheme", "key", "--out", str(again)]) == 0
        assert capsys.readouterr().out == f"{again}\n"
        assert again.read_bytes() == png.read_bytes()
    finally:
        names = kafka_io.RunNames(run, f"{run}-")
        kafka_io.delete_topics(
            kafka,
            [names.keys_topic, names.work_topic, names.dead_letters_topic, names.results_topic],
        )
        for key in redis.scan_iter(match=f"{RunKeys(run).prefix}*"):
            redis.delete(key)
        shutil.rmtree(settings.cache_dir / "checkpoints" / run, ignore_errors=True)
        shutil.rmtree(settings.run_dir / "demo" / run, ignore_errors=True)
        (settings.run_dir / "reports" / f"{run}.png").unlink(missing_ok=True)


def build_figure_title(data: report.ReportData) -> str:
    """The title as drawn: read back from the figure object."""
    title = report.build_figure(data).get_suptitle()
    assert title == data.title()
    return title

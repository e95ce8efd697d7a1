"""``--query`` at the command line: a query skewer cannot run stops ``skewer demo`` and ``skewer
group`` before anything starts, with one line and exit 2; one it runs becomes the same reading of
the topic as the flags it replaces."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pipeline.cli.app import build_parser, main
from pipeline.cli.arguments import job_from_args, user_topic_from_args

GROUPED = "GROUP BY url, window(timestamp_millis(ts), '1 minute')"

#: Ten queries skewer refuses, malformed or beyond what it runs, and a word of each line.
REFUSED = [
    ("SELECT url, count(*) FROM clicks GROUP BY url, window(ts, '1 minute'", "not Spark SQL"),
    ("SELECT url, count(*) FROM clicks " + GROUPED + " HAVING count(*) > 1", "HAVING"),
    ("SELECT url, count(*) FROM clicks JOIN users ON clicks.u = users.u " + GROUPED, "JOIN"),
    ("SELECT url, count(*) FROM (SELECT url, ts FROM clicks) " + GROUPED, "subquery"),
    ("SELECT url, stddev(ms) FROM clicks " + GROUPED, "stddev()"),
    ("SELECT url, count(*) FROM clicks GROUP BY url, window(ts, '1 fortnight')", "duration"),
    ("SELECT url, count(*) FROM clicks GROUP BY url", "0 windows"),
    ("SELECT url, ms, count(*) FROM clicks " + GROUPED, "neither grouped nor aggregated"),
    ("SELECT url, count(*) FROM clicks WHERE upper(url) = 'A' " + GROUPED, "UPPER(url)"),
    ("SELECT url, sum(url) FROM clicks WHERE url LIKE 'a%' " + GROUPED, "as a number"),
    (
        "SELECT url, approx_count_distinct(user) FROM clicks " + GROUPED,
        "approx_count_distinct() is not run live yet",
    ),
    (
        "SELECT url, count(*) FROM clicks GROUP BY url, session_window(ts, '1 minute')",
        "session windows are not run live yet",
    ),
]


@pytest.mark.parametrize("command", [["demo"], ["group", "--workers", "2"]])
@pytest.mark.parametrize(("query", "said"), REFUSED, ids=[str(i) for i in range(len(REFUSED))])
def test_a_query_skewer_cannot_run_is_one_line_and_exit_2(
    command: list[str], query: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--query", query]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"skewer {command[0]}: error: --query") and said in line


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["group", "--workers", "2", *argv])


def test_a_query_reads_the_topic_as_the_flags_it_replaces() -> None:
    query = parsed(
        "--query",
        "SELECT url, window.start, count(*) AS hits, sum(bytes) AS bytes FROM clicks "
        "GROUP BY url, window(timestamp_millis(ts), '1 minute')",
    )
    job = job_from_args(query)
    assert job is not None and job.window.size_ms == 60_000
    by_query = user_topic_from_args(query, window_ms=60_000, lateness_ms=0, job=job)
    flags = parsed(
        "--input-topic",
        "clicks",
        "--key",
        "json:url",
        "--time",
        "json:ts:ms",
    )
    by_flags = user_topic_from_args(flags, window_ms=60_000, lateness_ms=0)
    assert by_query is not None and by_query.query == query.query
    # The query's sum is a state field of its own, NULLs skipped: not --sum's amount, which a
    # record must have.
    assert by_query.extractor.amount is None
    assert [c.name for c in by_query.extractor.aggregated] == ["bytes"]
    assert [f.name for f in by_query.state_fields] == ["count(bytes)", "sum(bytes)"]
    extractor = dataclasses.replace(by_query.extractor, aggregated=())
    assert dataclasses.replace(by_query, query=None, extractor=extractor) == by_flags


def test_a_query_of_skewers_own_stream_reads_no_topic_of_ones_own() -> None:
    query = parsed(
        "--query", "SELECT key, count(*) FROM keys GROUP BY key, window(ts, '5 seconds')"
    )
    job = job_from_args(query)
    assert job is not None and job.window.size_ms == 5_000
    assert user_topic_from_args(query, window_ms=5_000, lateness_ms=0, job=job) is None


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--input-topic", "clicks"], "drop --input-topic"),
        (["--sum", "json:bytes"], "drop --sum"),
        (["--window-ms", "60000"], "drop --window-ms"),
    ],
)
def test_a_query_beside_the_flags_it_replaces_is_refused(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    query = "SELECT url, count(*) FROM clicks " + GROUPED
    assert main(["group", "--workers", "2", "--query", query, *flags]) == 2
    assert said in capsys.readouterr().err


def test_a_plans_query_reaches_the_grouping_stage_and_survives_redis() -> None:
    """The plan hands the grouping stage its query as it is; the stage reads the same topic,
    with the WHERE's columns, and Redis keeps the query for the workers and the recount."""
    from pipeline.io import config
    from pipeline.io.kafka_io import RunNames
    from pipeline.runs.plan import RunPlan
    from pipeline.stages.user_topic import describe, restore

    query = (
        "SELECT url, count(*), sum(bytes) FROM `clicks-1` WHERE status >= 500 "
        "GROUP BY url, window(timestamp_millis(ts), '10 seconds')"
    )
    plan = RunPlan(
        scheme="pkg",
        records=10,
        sources=2,
        input_topic="clicks-1",
        key="json:url",
        time="json:ts:ms",
        query=query,
        run_id="r",
        ending_offsets=(4, 5),
    )
    argv = plan.argv("group", config.load({}))
    assert argv[argv.index("--query") + 1] == query and "--input-topic" not in argv
    args = build_parser().parse_args(argv)
    job = job_from_args(args)
    from_argv = user_topic_from_args(args, window_ms=10_000, lateness_ms=0, job=job)
    planned = plan.user_topic()
    assert from_argv is not None and planned is not None
    assert from_argv.extractor == planned.extractor
    assert [c.name for c in planned.extractor.columns] == ["status"]
    restored, _prefix = restore(describe(planned, RunNames("r")))
    assert restored == planned and restored.where == planned.where is not None


def test_a_query_that_sums_is_refused_in_real_time_mode(capsys: pytest.CaptureFixture[str]) -> None:
    query = "SELECT url, count(*), sum(bytes) FROM clicks " + GROUPED
    assert main(["demo", "--trigger", "real-time", "--query", query]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(
        "--query's sum(bytes) is for --trigger micro-batch: the real-time writer keeps counts only"
    )


def test_a_plan_with_a_query_and_sum_is_refused() -> None:
    """A query's aggregates are its state fields: a plan that also names --sum's amount would
    read the topic two ways (a dead letter for a record the query counts with a NULL)."""
    from pipeline.runs.plan import RunPlan

    query = "SELECT url, count(*), sum(bytes) FROM clicks " + GROUPED
    plan = RunPlan(scheme="pkg", records=1, input_topic="clicks", key="json:url",
                   time="json:ts:ms", sum="json:bytes", query=query, run_id="r")  # fmt: skip
    with pytest.raises(ValueError, match=r"--query says the job's aggregates: drop --sum"):
        plan.validate()

"""The worker job's progress reports (``skewer work --verbose``): every micro-batch's report
reaches the callback once, in order, however many batches end between two looks."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.stages.worker_job import log_progress, report_progress


class Query:
    """The two members of a ``StreamingQuery`` that report_progress reads, and how often."""

    def __init__(self, batches: list[int]) -> None:
        self.recent = [{"batchId": b, "durationMs": {"addBatch": 10 * b}} for b in batches]
        self.recent_reads = 0

    @property
    def lastProgress(self) -> dict[str, Any] | None:  # noqa: N802 (Spark's name)
        return self.recent[-1] if self.recent else None

    @property
    def recentProgress(self) -> list[dict[str, Any]]:  # noqa: N802 (Spark's name)
        self.recent_reads += 1
        return self.recent


def test_each_batch_is_reported_once_in_order_and_the_recent_list_read_only_after_a_jump() -> None:
    seen: list[int] = []
    query = Query([])
    assert report_progress(query, -1, lambda p: seen.append(p["batchId"])) == -1  # type: ignore[arg-type]
    query.recent = [{"batchId": b} for b in (7, 8)]  # a restarted query goes on from its checkpoint
    reported = report_progress(query, -1, lambda p: seen.append(p["batchId"]))  # type: ignore[arg-type]
    assert (reported, seen, query.recent_reads) == (8, [7, 8], 1)
    query.recent.append({"batchId": 9})
    reported = report_progress(query, reported, lambda p: seen.append(p["batchId"]))  # type: ignore[arg-type]
    assert (reported, seen, query.recent_reads) == (9, [7, 8, 9], 1)
    assert report_progress(query, reported, lambda p: seen.append(p["batchId"])) == 9  # type: ignore[arg-type]
    query.recent += [{"batchId": 10}, {"batchId": 11}, {"batchId": 12}]
    reported = report_progress(query, reported, lambda p: seen.append(p["batchId"]))  # type: ignore[arg-type]
    assert (reported, seen, query.recent_reads) == (12, [7, 8, 9, 10, 11, 12], 2)


def test_a_progress_line_names_every_part_of_the_batchs_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log_progress(
        {"batchId": 3, "numInputRows": 120, "durationMs": {"latestOffset": 4, "addBatch": 310}}
    )
    line = capsys.readouterr().err.strip()
    assert line.endswith("progress 3: 120 rows, ms: addBatch 310, latestOffset 4")

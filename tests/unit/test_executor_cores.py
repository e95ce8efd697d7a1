"""How long a cluster session waits for its executors' cores (spark_session.require_executor_cores).

A session whose executors offer fewer cores than its tasks is refused once the number stays the
same for a while, unless the master's live workers have the cores: then a second executor that
is slow to start on a loaded machine, or an earlier application still letting go of its cores,
is waited for until the longer limit. The executors and the master are stand-ins here; the
refusal on a real standalone cluster is test_spark_cluster.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.io import spark_session
from pipeline.io.spark_session import SparkClusterError, require_executor_cores

WEB_URL = "http://127.0.0.1:17078"


def cluster_session(
    monkeypatch: pytest.MonkeyPatch, cores: Callable[[float], int], alive: int | None
) -> Any:
    """A session on a standalone master whose executors offer ``cores(seconds since start)``
    and whose master's live workers have ``alive`` cores (None: the master does not answer)."""
    started = time.monotonic()
    offered = lambda _spark: cores(time.monotonic() - started)  # noqa: E731
    monkeypatch.setattr(spark_session, "executor_cores", offered)
    monkeypatch.setattr(spark_session, "alive_worker_cores", lambda url, timeout=2.0: alive)
    return SimpleNamespace(sparkContext=SimpleNamespace(master="spark://127.0.0.1:17077"))


def test_a_late_executor_is_waited_for_while_the_live_workers_have_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = cluster_session(monkeypatch, lambda t: 2 if t < 1.0 else 4, alive=8)
    assert require_executor_cores(spark, 4, master_web_url=WEB_URL, settle=0.3, timeout=5) == 4


def test_too_few_cores_on_the_live_workers_are_refused_once_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = cluster_session(monkeypatch, lambda t: 2, alive=2)
    started = time.monotonic()
    with pytest.raises(SparkClusterError) as refusal:
        require_executor_cores(spark, 4, master_web_url=WEB_URL, settle=0.3, timeout=60)
    assert time.monotonic() - started < 30  # once settled, not at the timeout
    assert "offers 2 executor core(s) (its live workers have 2 in all), fewer than the 4" in str(
        refusal.value
    )


def test_without_the_masters_word_the_settled_cores_are_all_there_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = cluster_session(monkeypatch, lambda t: 2, alive=8)
    started = time.monotonic()
    with pytest.raises(SparkClusterError, match=r"offers 2 executor core\(s\), fewer than"):
        require_executor_cores(spark, 4, master_web_url=None, settle=0.3, timeout=60)
    assert time.monotonic() - started < 30  # once settled, not at the timeout


def test_cores_that_never_come_are_refused_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    spark = cluster_session(monkeypatch, lambda t: 2, alive=8)
    started = time.monotonic()
    with pytest.raises(SparkClusterError, match="offers 2 executor core"):
        require_executor_cores(spark, 4, master_web_url=WEB_URL, settle=0.2, timeout=1.0)
    assert time.monotonic() - started >= 1.0

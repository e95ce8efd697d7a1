"""The size of a run's executors on a standalone cluster (spark_session.executor_size), and the
Spark settings given to spark-submit, which win over the job's own (spark_session.submitted_conf).

A run's cores come in executors of a fixed size, two at least, each a divisor of its tasks: a
standalone master gives an application without ``spark.executor.cores`` one executor per worker,
so a run that lost a worker could not get its cores back on the other until that one returned
(test_spark_cluster.py kills a worker and waits for the replacements on the other). A run in
micro-batches asks for twice its tasks' cores, in executors of up to all its tasks, so each of
two workers can hold a core for every task (executor_request).
"""

from __future__ import annotations

import pytest

from pipeline.io.spark_session import (
    EXECUTOR_MAX_CORES,
    executor_request,
    executor_size,
    submitted_conf,
)


@pytest.mark.parametrize("tasks", range(1, 41))
def test_a_runs_cores_are_whole_executors_two_at_least(tasks: int) -> None:
    cores = executor_size(tasks)
    assert tasks % cores == 0
    assert 1 <= cores <= EXECUTOR_MAX_CORES
    assert tasks == 1 or tasks // cores >= 2
    # The largest such size: fewer executors, fewer JVMs on the machine.
    assert not any(
        tasks % bigger == 0 for bigger in range(cores + 1, min(tasks // 2, EXECUTOR_MAX_CORES) + 1)
    )


@pytest.mark.parametrize("tasks", range(1, 41))
def test_spare_cores_are_twice_the_tasks_in_whole_executors(tasks: int) -> None:
    request = executor_request(tasks, spare=True)
    cores, size = int(request["spark.cores.max"]), int(request["spark.executor.cores"])
    assert cores == 2 * tasks and tasks % size == 0 and 1 <= size <= EXECUTOR_MAX_CORES
    # Up to the cores one worker can hold for the run: every task, in whole executors.
    assert not any(tasks % bigger == 0 for bigger in range(size + 1, EXECUTOR_MAX_CORES + 1))
    if tasks <= EXECUTOR_MAX_CORES:
        assert size == tasks, "one executor per worker holds every task"


def test_without_spare_a_run_asks_for_its_tasks_cores() -> None:
    assert executor_request(8, spare=False) == {
        "spark.cores.max": "8",
        "spark.executor.cores": str(executor_size(8)),
    }


def test_no_tasks_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one task"):
        executor_size(0)
    with pytest.raises(ValueError, match="at least one task"):
        executor_request(0, spare=True)


def test_settings_given_to_spark_submit_are_read_from_its_arguments() -> None:
    environ = {
        "PYSPARK_SUBMIT_ARGS": "--conf spark.executor.cores=1 --master local "
        "--conf 'spark.executor.extraJavaOptions=-Xms1g -Dx=1' --conf broken pyspark-shell"
    }
    assert submitted_conf(environ) == {
        "spark.executor.cores": "1",
        "spark.executor.extraJavaOptions": "-Xms1g -Dx=1",
    }
    assert submitted_conf({}) == {}

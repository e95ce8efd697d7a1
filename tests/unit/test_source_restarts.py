"""Which source processes a grouping stage starts again, and how often.

Pure logic of :mod:`pipeline.stages.grouping`; the restart itself, on a real broker, is
``tests/integration/test_grouping_stage.py::test_a_killed_source_is_started_again_by_its_stage``.
"""

from __future__ import annotations

import signal

import pytest

from pipeline.stages.grouping import RestartBudget, restartable
from pipeline.stages.source_checkpoint import EXIT_STUCK


@pytest.mark.parametrize(
    ("exitcode", "again"),
    [
        (-signal.SIGKILL, True),  # kill -9, the OOM killer
        (-signal.SIGSEGV, True),
        (EXIT_STUCK, True),  # its stuck-call watchdog ended it
        (None, False),  # still running
        (0, False),  # done: its summary is on the queue
        (1, False),  # failed with an error, reported on the queue
    ],
)
def test_a_killed_or_stuck_source_is_started_again_and_a_failed_one_is_not(
    exitcode: int | None, again: bool
) -> None:
    assert restartable(exitcode) is again


def test_a_source_that_keeps_dying_exhausts_its_budget_until_the_window_moves_on() -> None:
    budget = RestartBudget(limit=3, window_s=600.0)
    assert [budget.spend(t) for t in (0.0, 10.0, 20.0)] == [True, True, True]
    assert budget.spend(30.0) is False  # a fourth within ten minutes: the stage fails
    assert budget.spend(599.0) is False
    assert budget.spend(600.5) is True  # the first has left the window
    assert budget.spent == 4


def test_a_stuck_source_ends_after_a_working_failover_would_and_well_before_a_run_stalls() -> None:
    """A source stuck in ``send_offsets_to_transaction`` holds back every ``work`` partition
    of its run (the workers read committed records only), so its watchdog fires within a few
    seconds after a failover that works would be over on skewer's cluster (the controller
    fences a dead node after ``broker.session.timeout.ms``, plus a heartbeat): every worker of
    the run is idle meanwhile, and the backlog a stall leaves takes about as long to drain."""
    from service_backends import parse_properties

    from pipeline.io import config
    from pipeline.services.kafka_broker import KafkaNodeService
    from pipeline.stages.source_checkpoint import STUCK_AFTER_SECONDS

    properties = parse_properties(KafkaNodeService(config.load({}), 1).server_properties())
    fenced_after_s = (
        int(properties["broker.session.timeout.ms"])
        + int(properties["broker.heartbeat.interval.ms"])
    ) / 1000
    assert fenced_after_s < STUCK_AFTER_SECONDS <= fenced_after_s + 3


def test_restarts_that_cure_a_lost_coordinator_do_not_spend_the_budget() -> None:
    """One source within ten minutes of a soak's faults: killed, stuck after a broker kill,
    killed, stuck after another, killed. Were the stuck ends to spend the budget, the third kill
    would fail the whole stage (its supervisor's restart takes 10 s, a source's half a second)."""
    budget = RestartBudget(limit=3, window_s=600.0)
    ends = [(0.0, -signal.SIGKILL), (504.0, EXIT_STUCK), (676.0, -signal.SIGKILL)]
    ends += [(933.0, EXIT_STUCK), (1061.0, -signal.SIGKILL)]
    assert [budget.spend(t, code) for t, code in ends] == [True] * 5
    assert budget.spent == 5
    # Kills alone still run out: three within the window, then the stage fails.
    assert [budget.spend(t) for t in (1062.0, 1063.0)] == [True, False]

"""The micro-batch path builds, from the golden vectors' ``work`` rows, the ARGV they hold
(tests/apply_vectors.py): the apply's payload as the real-time writer builds it too."""

from __future__ import annotations

import pytest
from apply_vectors import BATCH_ID, Case, micro_batch_argv, read

CASES = read()


def test_the_vectors_hold_a_case_of_each_path() -> None:
    """Counts only (both paths) and a query's state fields (micro-batches): neither empty."""
    assert {case.query is None for case in CASES} == {True, False}
    assert all(case.rows and case.argv and case.state for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_micro_batch_builds_the_vectors_argv(case: Case) -> None:
    argv = micro_batch_argv(case)
    assert argv[2:4] == [str(BATCH_ID).encode()] * 2  # the guard: its batch id, twice
    assert argv[:2] + argv[4:] == case.argv[:2] + case.argv[4:]

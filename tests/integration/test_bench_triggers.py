"""`skewer bench triggers` runs: both triggers, saturated and paced, at a small size.

Its committed result (bench/results/triggers.md) is only as good as the code that can re-run
it, so it runs here once against the real services with one cost, one scheme and one load:
every run exact, a capacity per trigger, each paced run's way from the producers to the
grouping stage read back for every record it applied, and in real-time mode each record's way
to its apply.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench import triggers
from operators.metrics import STEADY_FROM
from pipeline.io import config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Seconds of offered load per paced run: long enough that, on a busy machine too, the workers
#: apply records in several micro-batches after the steady state begins (STEADY_FROM of them),
#: so that each paced run has a steady-state latency to bound.
PACED_SECONDS = 10.0


def test_both_triggers_are_measured_side_by_side(
    settings: config.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(triggers, "SATURATING_RECORDS", {0.0: 30_000})
    monkeypatch.setattr(triggers, "SETTLE_SECONDS", 0.0)
    result = triggers.run(costs=(0.0,), schemes=("pkg",), loads=(0.25,), seconds=PACED_SECONDS)
    capacities, paced = result.data["capacities"], result.data["paced"]
    assert [c["trigger"] for c in capacities] == list(config.TRIGGERS)
    assert all(c["exact"] and c["capacity"] > 0 for c in capacities)
    assert [p["trigger"] for p in paced] == list(config.TRIGGERS)
    for run in paced:
        assert run["exact"], run["trigger"]
        assert np.isclose(run["rate"], 0.25 * capacities[paced.index(run)]["capacity"])
        # Both parts of the way, and their bound, for the records of the steady state.
        assert 0 < run["group_p50_ms"] <= run["group_p99_ms"]
        assert run["steady_p99_ms"] is not None, f"{run['trigger']}: no steady-state applies"
        assert run["e2e_p99_bound_ms"] >= run["steady_p99_ms"]
    micro, real = paced
    assert micro["e2e_p50_ms"] is None  # a micro-batch's applies carry no offsets: bound only
    # Real-time: every record of the steady state seen applied, its own time measured.
    records = int(real["rate"] * PACED_SECONDS)
    assert real["e2e_records"] == records - int(STEADY_FROM * records)
    assert 0 < real["e2e_p50_ms"] <= real["e2e_p99_ms"]
    assert real["e2e_p99_ms"] >= real["group_p99_ms"] / 2
    assert "| real-time | 0 | pkg | 25% |" in result.markdown
    assert "x micro-batch" in result.markdown

"""The worker stage's JIT as a run plan chooses it: quick for a paced local run, peak otherwise."""

from __future__ import annotations

import pytest

from pipeline.io import config
from pipeline.runs.plan import RunPlan


def _jit(plan: RunPlan) -> str:
    argv = plan.argv("work")
    return argv[argv.index("--jit") + 1]


def test_a_paced_local_run_compiles_quick_and_a_backlog_at_peak() -> None:
    assert _jit(RunPlan("pkg", 10, rate=10_000.0, run_id="r")) == "quick"
    assert _jit(RunPlan("pkg", 10, rate=10_000.0, spark_master="local[4]", run_id="r")) == "quick"
    assert _jit(RunPlan("pkg", 10, run_id="r")) == "peak"


def test_a_cluster_run_and_a_chosen_jit_keep_their_own() -> None:
    on_cluster = RunPlan("pkg", 10, rate=10_000.0, spark_master="spark://127.0.0.1:7077")
    assert _jit(on_cluster) == "peak"
    assert _jit(RunPlan("pkg", 10, rate=10_000.0, jit="peak", run_id="r")) == "peak"
    assert _jit(RunPlan("pkg", 10, jit="quick", run_id="r")) == "quick"
    assert RunPlan("pkg", 10, jit="quick").work_options(config.load({})).jit == "quick"


def test_an_unknown_jit_is_one_line() -> None:
    with pytest.raises(ValueError, match="--jit must be one of peak, quick, got 'fast'"):
        RunPlan("pkg", 10, jit="fast", run_id="r").validate()

"""`skewer advise --validate`: chosen settings run live, the demo's way, on the sampled stream.

Layer: runs. Each setting becomes a :class:`~pipeline.runs.plan.RunPlan` (same W and C; a
table scheme's round of ``every`` records is the live run's ``--control-every``)
run whole by :func:`~pipeline.runs.orchestrator.run_pipeline`, one after another; its summary
fills the candidate's ``measured`` under the names of :meth:`operators.advice.Candidate.figures`.
The stream: a user's topic read whole (the grouping stage reads to the end offsets it finds at
its start, so the sample must be the whole topic), or skewer's producer paced at R.
What is compared and why: docs/advise.md#checking-the-prediction-live.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from operators.advice import Advice, Candidate, Sample, figures_at
from pipeline.io import config, kafka_io
from pipeline.runs.latency import Snapshot, steady_cut
from pipeline.runs.plan import RunPlan, plan_run

if TYPE_CHECKING:
    from pipeline.runs.orchestrator import Pipeline, Progress
    from pipeline.runs.summary import RunSummary
    from pipeline.stages.user_topic import UserTopic

#: Seconds one live run may take before it counts as failed.
RUN_TIMEOUT = 1800.0

Log = Callable[[str], None]
#: A run's own stream (see :func:`run_live`): its :class:`RunPlan` fields, and what to start
#: once the run's stages have.
Feed = Callable[
    [], contextlib.AbstractContextManager[tuple[dict[str, Any], Callable[["Pipeline"], None]]]
]


class LiveRunError(Exception):
    """A live run failed or cannot be made; the message is one line naming the setting."""


def whole_topic(bootstrap: str, topic: str, sampled: int) -> list[int]:
    """The records each partition of ``topic`` holds, if ``sampled`` (records the sample read)
    is all of them; :class:`LiveRunError` else (a live run reads the whole topic)."""
    held = kafka_io.topic_records(bootstrap, topic) or []
    if sum(held) != sampled:
        raise LiveRunError(
            f"--validate: a live run reads all {sum(held):,} records of {topic} but the sample "
            f"read {sampled:,}; sample the whole topic (--sample {max(sum(held), 1)})"
        )
    return held


def topic_stream(bootstrap: str, spec: UserTopic, sampled: int) -> dict[str, Any]:
    """The :class:`RunPlan` fields of a run on ``spec.topic`` as it is now, which the sample
    must cover whole (:func:`whole_topic`)."""
    held = whole_topic(bootstrap, spec.topic, sampled)
    amount = spec.extractor.amount
    return {
        "input_topic": spec.topic,
        "key": spec.extractor.key.text,
        "time": spec.extractor.time.text,
        "sum": amount.text if amount is not None else None,
        "max_out_of_order_ms": spec.max_out_of_order_ms,
        "idle_timeout_ms": spec.idle_timeout_ms,
        "window_ms": spec.window_ms,
        "sources": len(held),
        "records": sum(held),
    }


def workload_stream(spec: str, records: int, sources: int, rate: float) -> dict[str, Any]:
    """The :class:`RunPlan` fields of a run whose producer sends ``spec``'s ``records`` keys
    to ``sources`` sources at ``rate`` records/s, as the sample dealt them."""
    return {"workload": spec, "records": records, "sources": sources, "rate": rate}


def setting_plan(
    settings: config.Settings, candidate: Candidate, advice: Advice, stream: dict[str, Any]
) -> RunPlan:
    """The live run of one setting; :class:`LiveRunError` if the plan is refused."""
    try:
        return plan_run(
            settings,
            run_prefix="advise",
            scheme=candidate.scheme,
            workers=advice.n_workers,
            cpu_cost_us=advice.cpu_cost_us,
            params=tuple(f"{name}={value}" for name, value in candidate.params.items()),
            control_every=candidate.rebalance_interval,
            **stream,
        )
    except ValueError as error:
        raise LiveRunError(f"live run of {candidate.label}: {error}") from None


def steady_rate(
    snapshots: Sequence[Snapshot], records: int, last_applied: float | None
) -> float | None:
    """Records/s the workers applied from the steady cut (:func:`steady_cut`, the cut of the
    summary's steady p50/p99) to the last record applied; None if no time lies between."""
    cut = steady_cut(snapshots, records)
    if cut is None or last_applied is None or not snapshots or last_applied <= cut.at:
        return None
    applied = snapshots[-1].records - cut.records
    return applied / (last_applied - cut.at) if applied > 0 else None


def measured(summary: RunSummary, rate: float | None) -> dict[str, Any]:
    """A live run's figures under :meth:`Candidate.figures`' names: ``steady_rate`` is
    :func:`steady_rate`'s (no bound is measured); state is counted per window live, so it is
    not measured here. ``offered_rate``: records/s the run was offered."""
    return {
        "throughput_bound": None,
        "steady_rate": rate,
        "max_avg_final": summary.max_avg_ratio,
        "p50_ms": summary.latency_steady_p50_ms,
        "p99_ms": summary.latency_steady_p99_ms,
        "state_entries": None,
        "workers_per_key": None,
        "loads": list(summary.per_worker),
        "offered_rate": summary.offered_rate,
        "throughput": summary.throughput,
        "run_id": summary.run_id,
        "exact": summary.exact,
    }


def run_live(
    advice: Advice,
    candidates: Sequence[Candidate],
    sample: Sample,
    stream: dict[str, Any],
    settings: config.Settings,
    *,
    say: Log,
    progress: Log,
    feed: Feed | None = None,
) -> None:
    """Run each of ``candidates`` live, one after another, and fill its ``measured`` and its
    ``predicted``: the model's figures on ``sample`` at the rate the run was offered.

    ``say`` gets a line per run, ``progress`` the run's progress lines. A topic must still hold
    what was sampled before each run, unless ``feed`` gives each run its own: entered per run,
    it yields the run's stream (``stream`` updated) and what to start once the run's stages
    have (a writer of the topic). :class:`LiveRunError` names the setting whose run failed.
    """
    for i, candidate in enumerate(candidates, start=1):
        with contextlib.ExitStack() as run_stack:
            on_start = None
            if feed is not None:
                fields, on_start = run_stack.enter_context(feed())
                run_stream = {**stream, **fields}
            else:
                run_stream = stream
                if "input_topic" in stream:
                    whole_topic(settings.kafka_bootstrap, stream["input_topic"], stream["records"])
            plan = setting_plan(settings, candidate, advice, run_stream)
            say(f"live run {i}/{len(candidates)}: {candidate.label} (run {plan.run_id})")
            live = _run_one(plan, settings, candidate.label, progress, on_start)
            offered = live.get("offered_rate")
            candidate.measured = live
            if offered:
                candidate.predicted = figures_at(advice, sample, candidate, offered)


def _run_one(
    plan: RunPlan,
    settings: config.Settings,
    label: str,
    progress: Log,
    on_start: Callable[[Pipeline], None] | None,
) -> dict[str, Any]:
    """One live run of ``plan``, whole; its :func:`measured` figures."""
    from pipeline.runs import orchestrator

    rates: list[float | None] = []

    def read_rate(pipeline: Pipeline, _summary: RunSummary) -> None:
        # The records the summary's steady cut counts from: the plan's, as summary_timing.
        sampler = pipeline.sampler
        rates.append(steady_rate(sampler.snapshots, pipeline.plan.records, sampler.last_applied))

    def show(state: Progress) -> None:
        progress(f"{label}: {state.line(plan.records)}")

    try:
        summary = orchestrator.run_pipeline(
            plan,
            settings,
            timeout=RUN_TIMEOUT,
            on_progress=show,
            on_start=on_start,
            on_end=read_rate,
        )
    except orchestrator.PipelineError as error:
        raise LiveRunError(f"live run of {label} failed: {error}") from None
    return measured(summary, rates[0] if rates else None)

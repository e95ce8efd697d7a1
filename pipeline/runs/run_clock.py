"""A run's start-up timeline: wall-clock events from the command to the verified counts.

Layer: runs.

A :class:`RunClock` starts with the command and marks each event once, in wall-clock seconds
(``time.time()``): the clock of Kafka's record timestamps, so the first record produced (a
Kafka timestamp) and the orchestrator's own events share one line of time. :data:`EVENTS` lists
them in the order a run meets them, and where each is marked says how it is measured.
:meth:`RunClock.timeline` gives them in time order as ``{"event", "seconds"}`` (seconds since
the command), :func:`timeline_lines` as ``skewer demo --timings`` prints them.

    >>> clock = RunClock(started=100.0)
    >>> clock.mark_at("services checked", 100.25); clock.mark_at("run prepared", 101.5)
    >>> clock.mark_at("run prepared", 109.0)  # an event is marked once: the first time counts
    >>> print("\\n".join(timeline_lines(clock.timeline())))
         0.00 s  command started
         0.25 s  services checked          (+0.25 s)
         1.50 s  run prepared              (+1.25 s)
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from operators.metrics import latency_quantile
from pipeline.runs.latency import LatencySampler, latency_windows, steady_histogram

#: The events of a run, in the order a run meets them (a run on a user's topic has no producers).
EVENTS = (
    "command started",
    "services checked",
    "work started",
    "run prepared",
    "produce started",
    "Spark workers ready",
    "aggregate started",
    "control started",
    "group started",
    "workers warmed up",
    "grouping sources ready",
    "controller ready",
    "workers applied a batch",
    "producers started",
    "first record produced",
    "first record applied",
    "last record produced",
    "last record applied",
    "every window final",
    "every stage exited",
    "verified",
)
#: A process older than this when the demo starts is not the command's own (the demo called
#: in-process, as tests do): the command then starts at the call.
COMMAND_STARTUP_SECONDS = 30.0


def process_started_at() -> float:
    """Wall-clock time this process started (/proc/self/stat's start time against the clock
    since boot, to 10 ms), so the interpreter's start and imports count; now if unreadable."""
    now = time.time()
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - since_boot if 0 <= since_boot <= COMMAND_STARTUP_SECONDS else now


class RunClock:
    """The events of one run: wall-clock times, from ``started`` (default: now) on."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started
        self.events: dict[str, float] = {"command started": self.started}

    def mark(self, event: str) -> None:
        """``event`` happens now (an event is marked once: the first time counts)."""
        self.mark_at(event, time.time())

    def mark_at(self, event: str, at: float | None) -> None:
        """``event`` happened at wall-clock time ``at``; nothing if ``at`` is None (the run did
        not see it) or the event was marked before."""
        if at is not None:
            self.events.setdefault(event, at)

    def seconds(self, event: str) -> float | None:
        """Seconds from the command to ``event`` (None if not marked)."""
        at = self.events.get(event)
        return None if at is None else round(at - self.started, 3)

    def timeline(self) -> list[dict[str, Any]]:
        """Every marked event in time order (ties in :data:`EVENTS` order), seconds since the
        command."""
        order = {name: i for i, name in enumerate(EVENTS)}
        marked = sorted(self.events.items(), key=lambda e: (e[1], order.get(e[0], len(order))))
        return [{"event": name, "seconds": round(at - self.started, 3)} for name, at in marked]


def timeline_lines(timeline: Sequence[dict[str, Any]]) -> list[str]:
    """One line per event: seconds since the command, the event, the gap since the previous."""
    lines = []
    previous: float | None = None
    for entry in timeline:
        seconds = entry["seconds"]
        gap = "" if previous is None else f"(+{seconds - previous:.2f} s)"
        lines.append(f"{seconds:9.2f} s  {entry['event']:<25} {gap}".rstrip())
        previous = seconds
    return lines


def summary_timing(
    clock: RunClock,
    sampler: LatencySampler,
    records: int,
    first_ms: int | None,
    last_ms: int | None,
    final_ms: int | None,
) -> dict[str, Any]:
    """A finished run's timing fields of :class:`~pipeline.runs.summary.RunSummary`, once the
    events read after the run are marked: the first and last record produced and the last
    window final (Kafka timestamps, ms: their producers' wall clocks), the first and last
    record applied (the sampler's polls: at most 0.1 s late)."""
    for event, stamp in (
        ("first record produced", first_ms),
        ("last record produced", last_ms),
        ("every window final", final_ms),
    ):
        clock.mark_at(event, None if stamp is None else stamp / 1000)
    clock.mark_at("first record applied", sampler.first_applied)
    last = sampler.last_applied
    if last is not None and final_ms is not None:
        # Every record was applied before its window could be final: a bound the poll may miss.
        last = min(last, final_ms / 1000)
    clock.mark_at("last record applied", last)
    steady = steady_histogram(sampler.snapshots, records)
    windows = latency_windows(sampler.snapshots, clock.started)
    return {
        "latency_steady_p50_ms": latency_quantile(steady, 0.5),
        "latency_steady_p99_ms": latency_quantile(steady, 0.99),
        "first_applied_seconds": clock.seconds("first record applied"),
        "latency_windows": [window.as_dict() for window in windows],
        "timeline": clock.timeline(),
    }

"""The soak's checks and its page (``skewer bench soak``, :mod:`bench.soak`): from the
samples of every second and the faults struck, whether nothing was lost, leaked or drifted,
as a verdict table, the tables of runs and faults, and a picture of every series.

Example (the verdict on a process's memory, from its samples):
    >>> rss = {7: [(0.0, 100.0), (600.0, 200.0), (3600.0, 215.0)]}
    >>> growth(rss, reference_s=600.0)
    {7: 1.075}
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from bench import chaos
from bench.experiment import or_dash
from bench.soak_samples import Sample

#: The checks' reference moment, as a share of the soak (minute 10 of 60).
REFERENCE = 1 / 6
#: A fault's stage or service is back when the lag is at most its level before the fault
#: (the highest of the :data:`LAG_BEFORE_SECONDS` before the kill, outside other faults) ...
#: A level is a band, which the lag's own swings (micro-batches, migrations, the hot set's
#: drift) reach the top of only now and then: at moments without a fault, the highest of the
#: 30 s before was itself often not "back" for tens of seconds; two minutes hold the band.
LAG_BEFORE_SECONDS = 120.0
#: ... within this many seconds of its restart ...
LAG_RECOVERY_SECONDS = 30.0
#: ... and stays there this long: a cold executor's slow micro-batches let the lag dip under its
#: level between two of them. Longer holds fail at moments without a fault, where the lag's own
#: swings between micro-batches and migrations exceed the highest of any 30 s now and then.
LAG_HOLD_SECONDS = 3.0
#: p99 outside the faults within this factor of the first ``REFERENCE`` of the soak's.
P99_FACTOR = 1.5
#: RSS of a process at the end within this factor of its RSS at the reference moment.
RSS_FACTOR = 1.10
#: A process's last sample this close to the soak's last counts as "at the end".
END_SLACK_SECONDS = 5.0
#: Seconds after a fault's recovery that still count as its window (for the p99 check).
FAULT_TAIL_SECONDS = 10.0


def growth(
    rss: Mapping[int, Sequence[tuple[float, float]]], reference_s: float, end_s: float | None = None
) -> dict[int, float]:
    """Each process's RSS at its last sample over its RSS at the reference moment (its sample
    nearest after ``reference_s``), for the processes that lived from then to the end (a
    sample within :data:`END_SLACK_SECONDS` of ``end_s``, by default the last of all): one a
    fault started later is a new process, still growing into its working set, and one a fault
    killed has no end."""
    end_s = max(samples[-1][0] for samples in rss.values()) if end_s is None and rss else end_s
    ratios = {}
    for pid, samples in rss.items():
        if samples[0][0] > reference_s or samples[-1][0] < (end_s or 0) - END_SLACK_SECONDS:
            continue
        at_reference = next(value for t, value in samples if t >= reference_s)
        if at_reference:
            ratios[pid] = round(samples[-1][1] / at_reference, 4)
    return ratios


def latency_quantile_of(histograms: Sequence[Mapping[int, int]], q: float) -> float | None:
    """The ``q`` quantile (ms) of the records of several latency histograms together."""
    from pipeline.runs.latency import latency_quantile

    total: dict[int, int] = {}
    for histogram in histograms:
        for bucket, count in histogram.items():
            total[int(bucket)] = total.get(int(bucket), 0) + count
    return latency_quantile(total, q)


class Episode(NamedTuple):
    """Faults that struck together or one during the recovery from another
    (:func:`episodes`)."""

    #: The indexes of its faults, in the order of their kills.
    faults: list[int]
    #: Its first kill ...
    first_kill: float
    #: ... and its last restart (an executor's: its replacement's first finished task; a
    #: fault's kill if it was never restarted).
    back: float


def episodes(struck: Sequence[chaos.Struck]) -> list[Episode]:
    """The faults that struck, grouped into episodes: a fault joins the episode before it when
    it strikes before that one's last restart plus :data:`LAG_RECOVERY_SECONDS`, together with
    it or during the recovery from it. The lag is not back from any fault of an episode while a
    process of another is down, and a recovery that a second fault interrupts cannot be told
    from the second's."""
    spans = sorted(
        (s.killed_s, s.restarted_s if s.restarted_s is not None else s.killed_s, i)
        for i, s in enumerate(struck)
        if s.killed_s is not None
    )
    found: list[Episode] = []
    for killed, back, i in spans:
        if found and killed <= found[-1].back + LAG_RECOVERY_SECONDS:
            last = found[-1]
            found[-1] = Episode([*last.faults, i], last.first_kill, max(last.back, back))
        else:
            found.append(Episode([i], killed, back))
    return found


def fault_windows(
    struck: Sequence[chaos.Struck], recovery: Mapping[int, float | None]
) -> list[tuple[float, float]]:
    """Seconds from each fault's kill to the lag's recovery after the last restart of its
    episode (:func:`episodes`, :func:`lag_recovery`), or to that restart if the lag never
    recovered, plus :data:`FAULT_TAIL_SECONDS`."""
    return [
        (killed, episode.back + (recovery.get(i) or 0.0) + FAULT_TAIL_SECONDS)
        for episode in episodes(struck)
        for i in episode.faults
        if (killed := struck[i].killed_s) is not None
    ]


def lag_recovery(
    samples: Sequence[Sample], struck: Sequence[chaos.Struck], runs: int
) -> dict[int, float | None]:
    """Per fault, seconds from the last restart of its episode (:func:`episodes`; an
    executor's restart is its replacement's first finished task) until every run's lag was
    back at most at its level before the episode (the highest of the
    :data:`LAG_BEFORE_SECONDS` before its first kill, leaving out the other episodes up to
    :data:`LAG_RECOVERY_SECONDS` after their restart, unless that is all of them) and stayed
    there for :data:`LAG_HOLD_SECONDS` (a lag that dips under its level between two slow
    micro-batches is not back); None if it never was before the end."""
    recovery: dict[int, float | None] = {}
    found = episodes(struck)
    for episode in found:
        first_kill, back = episode.first_kill, episode.back
        others = [(e.first_kill, e.back + LAG_RECOVERY_SECONDS) for e in found if e is not episode]
        window = [x for x in samples if first_kill - LAG_BEFORE_SECONDS <= x.t_s < first_kill]
        before = [x for x in window if not any(a <= x.t_s <= b for a, b in others)] or window
        levels = []
        for run in range(runs):
            lags = [lag for x in before if (lag := x.lag(run)) is not None]
            levels.append(max(lags) if lags else math.inf)

        def within(x: Sample, levels: list[float] = levels) -> bool | None:
            """Every run's lag at most its level; None if a run's lag is unknown."""
            lags = [x.lag(run) for run in range(runs)]
            if any(lag is None for lag in lags):
                return None
            return all(lag <= level for lag, level in zip(lags, levels, strict=True))

        after = [x for x in samples if x.t_s >= back]
        recovered = None
        for j, x in enumerate(after):
            until = x.t_s + LAG_HOLD_SECONDS
            held = itertools.takewhile(lambda y, until=until: y.t_s <= until, after[j:])
            if within(x) and all(within(y) is not False for y in held):
                recovered = round(x.t_s - back, 3)
                break
        recovery.update(dict.fromkeys(episode.faults, recovered))
    return recovery


def startup_end(samples: Sequence[Sample], reference_s: float, runs: int) -> float:
    """Seconds until every run, once applying, first had a lag at most its median over the
    first ``reference_s``: the backlog the runs start with (produced while their Spark
    applications planned their first batches) applied. Their latency before then is the
    start-up's, not the steady state the later parts are held to."""
    first = [x for x in samples if x.t_s <= reference_s]
    medians = []
    for run in range(runs):
        lags = sorted(lag for x in first if (lag := x.lag(run)) is not None)
        medians.append(lags[len(lags) // 2] if lags else 0)
    for x in first:
        if all(
            (applied := x.applied[run]) is not None
            and applied > 0
            and (lag := x.lag(run)) is not None
            and lag <= medians[run]
            for run in range(runs)
        ):
            return x.t_s
    return reference_s


def results(
    *,
    plans: Sequence[Any],
    rate: float,
    capacity: float | None,
    load: float,
    seed: int,
    seconds: float,
    samples: Sequence[Sample],
    struck: Sequence[chaos.Struck],
    summaries: Sequence[dict[str, Any]],
    stopped: Sequence[str],
    services_down: Sequence[str],
    ran_s: float,
) -> dict[str, Any]:
    """The soak's figures and its checks."""
    runs = len(plans)
    workers = sum(p.workers for p in plans)  # a window's partial-state keys, every run's
    reference_s = seconds * REFERENCE
    recovery = lag_recovery(samples, struck, runs)
    windows = fault_windows(struck, recovery)

    def outside(t: float) -> bool:
        return not any(a <= t <= b for a, b in windows)

    startup_s = startup_end(samples, reference_s, runs)
    p99: list[dict[str, float | None]] = []
    for run in range(runs):
        first = [
            x.latency[run] for x in samples if startup_s <= x.t_s <= reference_s and outside(x.t_s)
        ]
        rest = [x.latency[run] for x in samples if x.t_s > reference_s and outside(x.t_s)]
        p99.append(
            {"first": latency_quantile_of(first, 0.99), "rest": latency_quantile_of(rest, 0.99)}
        )
    rss: dict[int, list[tuple[float, float]]] = {}
    names: dict[int, str] = {}
    for x in samples:
        for pid, (name, mb) in x.rss_mb.items():
            rss.setdefault(pid, []).append((x.t_s, mb))
            names[pid] = name
    ratios = growth(rss, reference_s)
    grown = {names[pid]: ratio for pid, ratio in ratios.items() if ratio > RSS_FACTOR}
    quiet = [x for x in samples if outside(x.t_s)]
    # A fault holds windows open (the watermark waits for the workers), so their keys pile up
    # until it recovers: what must stay flat is the count outside the faults.
    state_keys = {
        "reference": _at_reference_and_after(samples, "state_keys", reference_s)["reference"],
        "max_after": _at_reference_and_after(quiet, "state_keys", reference_s)["max_after"],
    }
    redis_keys = _at_reference_and_after(samples, "redis_keys", reference_s)
    # Windows a fault held open become final at once when it recovers: their results are
    # there together for ``--keep-results`` seconds. What must stay flat is the count outside.
    result_keys = _at_reference_and_after(quiet, "result_keys", reference_s)
    faults = [s.as_dict() | {"recovery_s": recovery.get(i)} for i, s in enumerate(struck)]
    checks = {
        "exact": all(s.get("exact") for s in summaries),
        "nothing_lost_or_doubled": all(
            s.get("produced") == s.get("processed") == s.get("records") for s in summaries
        ),
        "no_stage_left_stopped": not stopped
        and not services_down
        and all("failed" not in s for s in summaries),
        "faults_struck": sum(1 for s in struck if s.killed_s is not None),
        "faults_failed": [f"{s.fault.kind}: {s.error}" for s in struck if s.error],
        "rss_grown": grown,
        "state_keys_flat": _flat(state_keys, 2, 2 * workers),
        # The truth of every window is written at the start and leaves as windows are
        # checked, so the whole count falls; the results must not pile up meanwhile.
        "redis_keys_flat": _flat(redis_keys, RSS_FACTOR, 0),
        "result_keys_flat": _flat(result_keys, 2, 12 * runs),
        "lag_recovered": all(
            r is not None and r <= LAG_RECOVERY_SECONDS for r in recovery.values()
        ),
        "p99_within": all(
            p["first"] is not None
            and p["rest"] is not None
            and p["rest"] <= P99_FACTOR * p["first"]
            for p in p99
        ),
    }
    return {
        "runs": [p.run_id for p in plans],
        "schemes": [p.scheme for p in plans],
        "workload": plans[0].workload,
        "rate": rate,
        "capacity": capacity,
        "load": load,
        "seed": seed,
        "seconds": seconds,
        "ran_s": round(ran_s, 1),
        "summaries": list(summaries),
        "faults": faults,
        "stopped": list(stopped),
        "services_down": list(services_down),
        "startup_s": startup_s,
        "p99": p99,
        "rss_growth": {f"{names[pid]} ({pid})": r for pid, r in sorted(ratios.items())},
        "state_keys": state_keys,
        "redis_keys": redis_keys,
        "result_keys": result_keys,
        "checks": checks,
        "samples": [x.as_dict() for x in samples],
    }


def _at_reference_and_after(
    samples: Sequence[Sample], field: str, reference_s: float
) -> dict[str, int | None]:
    """A count's first sample at the reference moment and its highest after it."""
    after = [
        value for x in samples if x.t_s >= reference_s and (value := getattr(x, field)) is not None
    ]
    return {"reference": after[0] if after else None, "max_after": max(after, default=None)}


def _flat(counts: Mapping[str, int | None], factor: float, slack: int) -> bool:
    """Whether a count never rose above ``factor`` x its reference (or the reference plus
    ``slack``) after it."""
    reference, highest = counts["reference"], counts["max_after"]
    if reference is None or highest is None:
        return False
    return highest <= max(factor * reference, reference + slack)


def verdicts(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Each check of the soak with its outcome, as the results page words them."""
    checks = data["checks"]
    grown = ", ".join(f"{name} {ratio:.3f}x" for name, ratio in checks["rss_grown"].items())
    reference = f"{data['seconds'] * REFERENCE:.0f} s in"
    lag = f"lag back to its level before each fault within {LAG_RECOVERY_SECONDS:g} s"
    return [
        ("every (key, window) count exact, both runs", _yes(checks["exact"])),
        ("records produced = applied = planned", _yes(checks["nothing_lost_or_doubled"])),
        ("no stage or service left stopped", _yes(checks["no_stage_left_stopped"])),
        (
            f"RSS of every process at the end within {RSS_FACTOR:.2f}x of its RSS {reference}",
            "yes" if not grown else f"NO: {grown}",
        ),
        (
            "partial-state keys flat (closed windows' deleted)",
            _counted(checks["state_keys_flat"], data["state_keys"]),
        ),
        (
            f"Redis keys flat (at most {RSS_FACTOR:.2f}x the count {reference})",
            _counted(checks.get("redis_keys_flat"), data.get("redis_keys")),
        ),
        (
            "results of closed windows leave Redis once checked (`--keep-results`; outside "
            "the faults)",
            _counted(checks.get("result_keys_flat"), data.get("result_keys")),
        ),
        (lag, _yes(checks["lag_recovered"])),
        (
            f"p99 outside the faults within {P99_FACTOR}x of the first part's"
            + (
                f" (from {data['startup_s']:.0f} s in, the start-up's backlog applied)"
                if data.get("startup_s") is not None
                else ""
            ),
            _yes(checks["p99_within"]),
        ),
    ]


def _yes(value: bool) -> str:
    return "yes" if value else "NO"


def _counted(flat: bool | None, counts: Mapping[str, int | None] | None) -> str:
    if flat is None or counts is None:  # a page written before the check existed
        return "-"
    return f"{_yes(flat)} ({counts['reference']}, then at most {counts['max_after']})"


def markdown(data: dict[str, Any]) -> str:
    checks = data["checks"]
    lines = [
        f"Two runs side by side on the cluster services for {data['seconds'] / 60:g} minutes: "
        f"{', '.join(f'`{s}`' for s in data['schemes'])} on the drifting stream "
        f"`{data['workload']}`, each at {data['rate']:,.0f} records/s"
        + (
            f" ({data['load']:.0%} of the cluster's measured sustainable rate, "
            f"{data['capacity']:,.0f} records/s, shared by the two)"
            if data["capacity"]
            else ""
        )
        + f"; {checks['faults_struck']} faults from seed {data['seed']}.",
        "",
        "## Verdict",
        "",
        "| check | result |",
        "|---|---|",
        *(f"| {check} | {verdict} |" for check, verdict in verdicts(data)),
        "",
        "## Runs",
        "",
        "| run | scheme | records | produced | applied | exact | restarts |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for s in data["summaries"]:
        if "failed" in s:
            lines.append(f"| {s['run_id']} | - | - | - | - | FAILED: {s['failed']} | - |")
            continue
        lines.append(
            f"| {s['run_id']} | {s['scheme']} | {s['records']:,} | {s['produced']:,} | "
            f"{s['processed']:,} | {'yes' if s['exact'] else 'NO'} | "
            f"{', '.join(f'{k} {v}' for k, v in s['restarts'].items()) or '-'} |"
        )
    lines += ["", "p99 of the records applied outside the faults (ms):", ""]
    lines += ["| run | first part | the rest |", "|---|---:|---:|"]
    for run, p in zip(data["runs"], data["p99"], strict=True):
        lines.append(f"| {run} | {or_dash(p['first'], ',.0f')} | {or_dash(p['rest'], ',.0f')} |")
    lines += [
        "",
        "## Faults",
        "",
        "| at (s) | kind | what | killed (s) | restarted (s) | lag back after (s) | note |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for f in data["faults"]:
        note = f["skipped"] or f["error"] or ("mid-migration" if f.get("mid_migration") else "")
        if f.get("registered_s") is not None:  # restarted: its replacements' first tasks done
            note = f"replacements registered at {f['registered_s']:.1f} s"
            if f.get("worker_restarted_s") is not None:
                note = f"worker up at {f['worker_restarted_s']:.1f} s, {note}"
        lines.append(
            f"| {f['at_s']:.0f} | {f['kind']} | {f['target'] or '-'} | "
            f"{or_dash(f['killed_s'], '.1f')} | {or_dash(f['restarted_s'], '.1f')} | "
            f"{or_dash(f['recovery_s'], '.1f')} | {note} |"
        )
    if data["stopped"]:
        lines += ["", "Stages that exited on their own: " + "; ".join(data["stopped"]) + "."]
    return "\n".join(lines) + "\n"


def figure(data: dict[str, Any]) -> Any:
    """Every series of the soak against its minutes, the faults shaded from kill to recovery."""
    from matplotlib.figure import Figure

    from pipeline.runs.latency import latency_quantile

    samples = data["samples"]
    minutes = [s["t_s"] / 60 for s in samples]
    fig = Figure(figsize=(11, 13))
    axes = fig.subplots(5, 1, sharex=True)
    for run, scheme in enumerate(data["schemes"]):
        applied = [(s["t_s"], s["applied"][run]) for s in samples]
        rates = [None] + [
            (b - a) / max(t2 - t1, 1e-3) if a is not None and b is not None else None
            for (t1, a), (t2, b) in itertools.pairwise(applied)
        ]
        axes[0].plot(minutes, rates, lw=0.6, label=f"{scheme} applied/s")
        lags = [
            s["produced"][run] - s["applied"][run]
            if s["produced"][run] is not None and s["applied"][run] is not None
            else None
            for s in samples
        ]
        axes[1].plot(minutes, lags, lw=0.6, label=f"{scheme} lag")
        p99s = [
            latency_quantile({int(k): v for k, v in s["latency"][run].items()}, 0.99)
            for s in samples
        ]
        axes[2].plot(minutes, p99s, lw=0.6, label=f"{scheme} p99 (ms)")
    by_pid: dict[str, list[tuple[float, float]]] = {}
    for s, m in zip(samples, minutes, strict=True):
        for pid, (label, mb) in s["rss_mb"].items():
            by_pid.setdefault(f"{label} ({pid})", []).append((m, mb))
    for _label, points in sorted(by_pid.items()):
        axes[3].plot([p[0] for p in points], [p[1] for p in points], lw=0.5)
    axes[4].plot(minutes, [s["redis_memory_mb"] for s in samples], label="Redis used (MB)")
    axes[4].plot(minutes, [s["kafka_log_mb"] for s in samples], label="Kafka logs (MB)")
    keys = axes[4].twinx()
    keys.plot(
        minutes,
        [s["state_keys"] for s in samples],
        color="black",
        lw=0.6,
        label="partial-state keys",
    )
    keys.set_ylabel("keys")
    titles = [
        "records applied per second",
        "lag (records produced, not applied)",
        "p99 per second (ms)",
        "RSS per process (MB)",
        "Redis and Kafka",
    ]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=9, loc="left")
        for f in data["faults"]:
            if f["killed_s"] is not None:
                end = (f["restarted_s"] or f["killed_s"]) + (f["recovery_s"] or 0)
                ax.axvspan(
                    f["killed_s"] / 60, max(end, f["killed_s"] + 1) / 60, color="red", alpha=0.15
                )
    for f in data["faults"]:
        if f["killed_s"] is not None:
            axes[0].annotate(
                f["kind"],
                (f["killed_s"] / 60, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=6,
                rotation=90,
                va="top",
            )
    axes[2].set_yscale("log")
    for ax in (axes[0], axes[1], axes[2], axes[4]):
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("minutes")
    fig.tight_layout()
    return fig

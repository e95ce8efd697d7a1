"""`skewer advise`'s predictions against live runs: three streams, key grouping and the top two.

What it measures and how: :data:`METHOD`, the prose of bench/results/advise.md. Needs a
running broker and Redis (``skewer services up``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from bench.experiment import ExperimentResult, method_markdown, or_dash, ratio_or_none
from operators.advice import (
    DEFAULT_BATCH_MS,
    MAX_AVG_TOLERANCE,
    P99_FACTOR,
    SOURCE_ORDER_SCHEMES,
    THROUGHPUT_TOLERANCE,
    advise,
    live_candidates,
)
from pipeline.io import config, extractors, kafka_io
from pipeline.runs.advise import StreamSample, topic_sample, workload_sample
from pipeline.runs.advise_live import Feed, run_live, topic_stream, workload_stream
from pipeline.stages.controller import table_schemes
from pipeline.stages.user_topic import UserTopic
from producers.workloads import parse

METHOD = """\
``skewer bench advise`` writes ``bench/results/advise.md`` (and ``.json``), headed by the
command and the machine. Needs a running broker and Redis (``skewer services up``);
``--only`` runs some of the streams, ``--records`` sets their length.

Three streams of ``--records`` records each, W = 8 workers, C = 500 µs per record, the model's
micro-batch cycle D = 250 ms (docs/advise.md#the-micro-batch):

- **zipf**: ``zipf:z=1.2,keys=100000,seed=7``, dealt to 2 sources as ``skewer produce`` deals
  it, offered at ``--rate`` R;
- **drift**: ``drift:mode=switch,z=1.2,keys=100000,seed=7`` (the hot keys move after 80 % of
  the stream), the same way;
- **json**: a topic of 2 partitions written by a plain confluent-kafka producer (not skewer's):
  values ``{"user": KEY, "ts": MS}`` with the keys of ``zipf:z=1.2,keys=100000,seed=11``,
  record i in partition i mod 2, event times 1 / R s apart; read with ``--key json:user
  --time json:ts``, the whole topic sampled.

For each, ``advise`` ranks every scheme for throughput, then key grouping and the top two live
schemes run live one after another as ``skewer advise --validate 2`` runs them
(``pipeline/runs/advise_live.py``): a workload paced at R by skewer's producer; for the JSON
stream, the sample is read from the topic as it stands, and each live run gets a fresh topic
that the plain producer writes at R while the run reads it (``skewer group --ending-offsets``
tells the run where the stream ends). Each live run is compared with the model's prediction
at the rate that run was offered (its summary's ``offered_rate``). Tolerances as
``skewer advise --check``'s (docs/advise.md#checking-the-prediction-live): the predicted steady
rate within ±15 % of the live one (both: records applied after the first 20 % over the time
from then to the last), the live steady p99 within 2× of the predicted one,
loads equal record for record for source-order schemes. The ranking of the three agrees with
live when no setting the model ranks above another runs live more than 15 % slower than it.

Why R = 14,000 records/s: it is 0.875 of the even split's capacity W / C = 16,000, so key
grouping, whose busiest worker holds a hot key, is far past its capacity and its throughput is
set by that worker's queue, while the best schemes run just below theirs, where their latency
is the batch cycle plus a queue. It is also the pace ``skewer bench latency`` shows this
machine's pipeline sustains.

Then the loads record for record: every live scheme whose routing depends only on each
source's records in order (``SOURCE_ORDER_SCHEMES``), at its best setting, runs live on the
zipf stream's first ``--loads-records`` records; its per-worker loads must equal advise's.
And every live routing-table scheme, at its best setting, runs live on the drift stream with
its rounds counted in records as the model counts them (``--control-every``), at 7,000
records/s: there its busiest worker stays below capacity, so each migration drains within a
round (past capacity a migration can outlast the next round, which the live controller then
does not plan and the model does). Its final max/avg must be within 5 % of advise's
(``--loads-records 0`` skips both).

Last, ``advise``'s own wall time: ``--timed-records`` records of the zipf stream, every
registered scheme and setting, from generating the sample to the ranking (target: 60 s).
"""

WORKERS = 8
CPU_COST_US = 500.0
SOURCES = 2
RATE = 14_000.0
RECORDS = 300_000
TIMED_RECORDS = 1_000_000
#: Records of the zipf stream each source-order scheme runs live for the loads check.
LOADS_RECORDS = 40_000
#: records/s of the routing-table schemes' live runs: their busiest worker (max/avg up to
#: about 1.7 on the drift stream) stays below capacity, 1.7 · R / W · C < 1, so a migration
#: drains within a round and no round is skipped live (docs/advise.md#checking-the-prediction-live).
TABLE_RATE = 7_000.0
TARGET_ADVISE_SECONDS = 60.0
#: Schemes run live besides key grouping: the top of the ranking.
TOP = 2
WINDOW_MS = 10_000
STREAMS = {
    "zipf": "zipf:z=1.2,keys=100000,seed=7",
    "drift": "drift:mode=switch,z=1.2,keys=100000,seed=7",
    "json": "zipf:z=1.2,keys=100000,seed=11",
}
JSON_KEY = "json:user"
JSON_TIME = "json:ts"
#: The JSON stream's first event time, a day ago on a minute boundary.
START_MS = (int(time.time() * 1000) - 86_400_000) // 60_000 * 60_000
#: Records the paced JSON writer sends between two looks at the clock.
PACE_STEP = 50
#: Seconds between a live run's progress lines in the log.
PROGRESS_SECONDS = 10.0

Log = Callable[[str], None]


def ranking_agrees(order: Sequence[str], live_rates: dict[str, float | None]) -> bool | None:
    """Whether the model's ``order`` (best first) holds live: no setting runs live more than
    :data:`THROUGHPUT_TOLERANCE` slower than one the model ranks below it (closer than that,
    two rates do not tell settings apart); None if a live rate is missing.

    >>> ranking_agrees(["fish", "pkg", "key"], {"fish": 13_900.0, "pkg": 14_000.0, "key": 6_400.0})
    True
    >>> ranking_agrees(["pkg", "key"], {"pkg": 5_000.0, "key": 6_400.0})
    False
    """
    rates = [rate for label in order if (rate := live_rates.get(label)) is not None]
    if len(rates) < len(order):
        return None
    return all(
        rates[i] >= (1 - THROUGHPUT_TOLERANCE) * rates[j]
        for i in range(len(rates))
        for j in range(i + 1, len(rates))
    )


def _write_json_topic(
    bootstrap: str, topic: str, keys: list[bytes], rate: float, *, paced: bool = False
) -> None:
    """The JSON stream, by a plain confluent-kafka producer (none of skewer's settings); with
    ``paced``, record i is sent i / ``rate`` s after the first, as a live source would."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5 if paced else 20})
    began = time.monotonic()
    for i, key in enumerate(keys):
        if paced and i % PACE_STEP == 0:
            ahead = began + i / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            producer.poll(0)
        value = json.dumps({"user": key.decode(), "ts": START_MS + int(i * 1000 / rate)})
        while True:
            try:
                producer.produce(topic, value.encode(), partition=i % SOURCES)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise kafka_io.KafkaIOError(f"kafka: the JSON topic {topic} was not all written")


def _json_feed(bootstrap: str, keys: list[bytes], rate: float) -> Feed:
    """Each live run of the JSON stream on a topic of its own, which the plain producer writes
    at ``rate`` once the run's stages have started; the run ends at the offsets it will reach.
    The rest of the run's stream is the sampled topic's, which holds the same records."""
    ends = tuple(len(range(p, len(keys), SOURCES)) for p in range(SOURCES))

    @contextlib.contextmanager
    def feed() -> Iterator[tuple[dict[str, Any], Callable[[Any], None]]]:
        topic = f"bench-advise-{uuid.uuid4().hex[:8]}-json-live"
        kafka_io.ensure_topic(bootstrap, topic, SOURCES)
        failed: list[BaseException] = []

        def write() -> None:
            try:
                _write_json_topic(bootstrap, topic, keys, rate, paced=True)
            except BaseException as error:
                failed.append(error)

        writer = threading.Thread(target=write, name=f"write-{topic}", daemon=True)
        try:
            yield {"input_topic": topic, "ending_offsets": ends}, lambda _pipeline: writer.start()
        finally:
            if writer.ident is not None:  # started
                writer.join()
            kafka_io.delete_topics(bootstrap, [topic])
        if failed:
            raise failed[0]

    return feed


def _stream(
    name: str, records: int, rate: float, bootstrap: str, topic: str
) -> tuple[StreamSample, dict[str, Any], Feed | None]:
    """The sample of stream ``name``, the :class:`RunPlan` fields of its live runs, and for the
    JSON stream the feed that writes each live run's topic at the stream's pace."""
    workload = parse(STREAMS[name])
    if name != "json":
        taken = workload_sample(workload, records, SOURCES, rate)
        fields = workload_stream(taken.origin, taken.read, SOURCES, rate)
        return taken, {**fields, "window_ms": WINDOW_MS}, None
    keys = replace(workload, n=records).keys().to_list()  # type: ignore[type-var]
    kafka_io.ensure_topic(bootstrap, topic, SOURCES)
    _write_json_topic(bootstrap, topic, keys, rate)
    extractor = extractors.Extractor(
        key=extractors.parse_key(JSON_KEY), time=extractors.parse_time(JSON_TIME)
    )
    spec = UserTopic(topic=topic, extractor=extractor, window_ms=WINDOW_MS)
    taken = topic_sample(bootstrap, spec, records)
    return taken, topic_stream(bootstrap, spec, taken.read), _json_feed(bootstrap, keys, rate)


def _throttled(log: Log) -> Log:
    """``log``, passing on at most one line every :data:`PROGRESS_SECONDS`."""
    last = [0.0]

    def say(line: str) -> None:
        if time.monotonic() - last[0] >= PROGRESS_SECONDS:
            last[0] = time.monotonic()
            log(line)

    return say


def measure_stream(
    name: str, records: int, rate: float, settings: config.Settings, log: Log
) -> dict[str, Any]:
    """Advise on stream ``name``, run key grouping and the top two live, compare."""
    bootstrap = settings.kafka_bootstrap
    topic = f"bench-advise-{uuid.uuid4().hex[:8]}-json"
    try:
        taken, stream, feed = _stream(name, records, rate, bootstrap, topic)
        sample_rate = taken.rate or rate
        advice = advise(taken.sample, WORKERS, CPU_COST_US, sample_rate, batch_ms=DEFAULT_BATCH_MS)
        chosen = live_candidates(advice.ranking, TOP)
        log(f"{name}: advise ranks {', '.join(c.label for c in chosen)}; running them live")
        run_live(
            advice,
            chosen,
            taken.sample,
            stream,
            settings,
            say=log,
            progress=_throttled(log),
            feed=feed,
        )
    finally:
        if name == "json":
            kafka_io.delete_topics(bootstrap, [topic])
    runs = []
    for candidate in chosen:
        measured = candidate.measured or {}
        figures = candidate.live_prediction
        checks = candidate.checks()
        runs.append(
            {
                "label": candidate.label,
                "scheme": candidate.scheme,
                "rank": advice.ranking.index(candidate) + 1,
                "predicted": figures,
                "predicted_at_rate": candidate.figures(),
                "measured": measured,
                "checks": [check.summary() for check in checks],
            }
        )
    order = [c.label for c in chosen]
    live_rates = {run["label"]: run["measured"].get("steady_rate") for run in runs}
    return {
        "name": name,
        "sample": taken.summary(),
        "rate": sample_rate,
        "ranking": [c.label for c in advice.ranking],
        "recommendation": advice.recommendation,
        "runs": runs,
        "ranking_agrees": ranking_agrees(order, live_rates),
    }


def time_advise(records: int, rate: float) -> dict[str, Any]:
    """``advise``'s wall time on ``records`` of the zipf stream, every scheme and setting."""
    began = time.perf_counter()
    taken = workload_sample(parse(STREAMS["zipf"]), records, SOURCES, rate)
    advice = advise(taken.sample, WORKERS, CPU_COST_US, rate, batch_ms=DEFAULT_BATCH_MS)
    seconds = time.perf_counter() - began
    return {
        "records": records,
        "schemes": len({c.scheme for c in advice.candidates}),
        "settings": len(advice.candidates),
        "seconds": seconds,
        "model_seconds": advice.seconds,
        "within": seconds <= TARGET_ADVISE_SECONDS,
    }


def measure_schemes(
    schemes: Sequence[str],
    workload: str,
    records: int,
    rate: float,
    settings: config.Settings,
    log: Log,
) -> list[dict[str, Any]]:
    """Each of ``schemes`` at advise's best setting, run live on ``workload``'s first
    ``records`` at ``rate``: its per-worker loads and final max/avg against advise's."""
    taken = workload_sample(parse(workload), records, SOURCES, rate)
    advice = advise(taken.sample, WORKERS, CPU_COST_US, rate, batch_ms=DEFAULT_BATCH_MS)
    chosen = [next(c for c in advice.ranking if c.scheme == scheme) for scheme in schemes]
    log(f"{len(chosen)} schemes live on {records:,} records of {workload}")
    stream = {**workload_stream(taken.origin, taken.read, SOURCES, rate), "window_ms": WINDOW_MS}
    run_live(advice, chosen, taken.sample, stream, settings, say=log, progress=_throttled(log))
    rows = []
    for candidate in chosen:
        measured = candidate.measured or {}
        # The page shows the predictions the verdicts were made on (at the run's offered rate).
        checks = {c.figure: c for c in candidate.checks()}
        rows.append(
            {
                "label": candidate.label,
                "predicted": [int(load) for load in candidate.live_prediction["loads"]],
                "live": measured.get("loads"),
                "max_avg_predicted": checks["max/avg"].predicted,
                "max_avg_live": measured.get("max_avg_final"),
                "max_avg_within": checks["max/avg"].within,
                "exact": measured.get("exact"),
            }
        )
    return rows


def run(
    records: int = RECORDS,
    rate: float = RATE,
    timed_records: int = TIMED_RECORDS,
    streams: Sequence[str] = tuple(STREAMS),
    log: Log = print,
    loads_records: int = LOADS_RECORDS,
) -> ExperimentResult:
    """Every stream of ``streams`` measured, the source-order schemes' loads checked live
    (none with ``loads_records`` 0), then advise timed; the page and its data."""
    settings = config.load()
    kafka_io.require_kafka(settings.kafka_bootstrap)
    measured = [measure_stream(name, records, rate, settings, log) for name in streams]
    loads, tables = [], []
    if loads_records:
        ordered = sorted(SOURCE_ORDER_SCHEMES)
        loads = measure_schemes(ordered, STREAMS["zipf"], loads_records, rate, settings, log)
        live_tables = sorted(table_schemes())
        tables = measure_schemes(live_tables, STREAMS["drift"], records, TABLE_RATE, settings, log)
    log(f"timing advise on {timed_records:,} records")
    data = {
        "workers": WORKERS,
        "cpu_cost_us": CPU_COST_US,
        "batch_ms": DEFAULT_BATCH_MS,
        "sources": SOURCES,
        "rate": rate,
        "records": records,
        "streams": measured,
        "loads_records": loads_records,
        "loads": loads,
        "tables": tables,
        "table_rate": TABLE_RATE,
        "advise_time": time_advise(timed_records, rate),
    }
    return ExperimentResult(
        name="advise",
        title="skewer advise: predicted against live",
        markdown=body(data),
        data=data,
    )


def _check(run: dict[str, Any], figure: str) -> dict[str, Any]:
    return next(c for c in run["checks"] if c["figure"] == figure)


def _verdict(within: bool | None) -> str:
    return "-" if within is None else ("yes" if within else "**no**")


def table(stream: dict[str, Any]) -> str:
    """One stream's runs, best first: each figure predicted, live, live / predicted, within?

    >>> run = {"label": "key", "rank": 9, "checks": [
    ...     {"figure": "throughput", "predicted": 6500.0, "measured": 6400.0, "within": True},
    ...     {"figure": "p99", "predicted": 900.0, "measured": 2000.0, "within": False},
    ...     {"figure": "max/avg", "predicted": 2.46, "measured": 2.46, "within": True},
    ...     {"figure": "loads", "predicted": [1], "measured": [1], "within": True}]}
    >>> print(table({"runs": [run]}).splitlines()[-1])
    | key | 9 | 6,500 | 6,400 | 0.98 | yes | 900 | 2,000 | 2.22 | **no** | 2.46 | 2.46 | yes |
    """
    within_rate, within_p99 = f"±{THROUGHPUT_TOLERANCE:.0%}?", f"{P99_FACTOR:g}×?"
    lines = [
        f"| setting | rank | rate/s predicted | live | ratio | {within_rate} | p99 ms predicted "
        f"| live | ratio | {within_p99} | max/avg predicted | live | loads equal? |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for run in stream["runs"]:
        rate, p99 = _check(run, "throughput"), _check(run, "p99")
        spread, loads = _check(run, "max/avg"), _check(run, "loads")
        equal = loads["measured"] == loads["predicted"] if loads["measured"] is not None else None
        cells = [
            run["label"],
            str(run["rank"]),
            or_dash(rate["predicted"], ",.0f"),
            or_dash(rate["measured"], ",.0f"),
            or_dash(ratio_or_none(rate["measured"], rate["predicted"]), ".2f"),
            _verdict(rate["within"]),
            or_dash(p99["predicted"], ",.0f"),
            or_dash(p99["measured"], ",.0f"),
            or_dash(ratio_or_none(p99["measured"], p99["predicted"]), ".2f"),
            _verdict(p99["within"]),
            or_dash(spread["predicted"], ".2f"),
            or_dash(spread["measured"], ".2f"),
            _verdict(equal),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def body(data: dict[str, Any]) -> str:
    """The results page below its header."""
    parts = [
        method_markdown(METHOD),
        f"{data['records']:,} records per stream, R = {data['rate']:,.0f} records/s, "
        f"W = {data['workers']}, C = {data['cpu_cost_us']:g} µs, D = {data['batch_ms']:g} ms. "
        "Rank: the setting's place in advise's ranking for throughput; rate/s = the steady rate, "
        "predicted by the model's applied times and measured live; p99 live = steady state; "
        "ratio = live / predicted.",
    ]
    for stream in data["streams"]:
        agrees = stream["ranking_agrees"]
        parts.append(
            f"### {stream['name']}: {stream['sample']['origin']}\n\n"
            f"{table(stream)}\n\n"
            f"Ranking of the three agrees with live: {_verdict(agrees)}. "
            f"advise: {stream['recommendation']}."
        )
    if data["loads"]:
        rows = [
            f"| {run['label']} | {_verdict(run['predicted'] == run['live'])} | "
            f"{' '.join(map(str, run['predicted']))} | {_verdict(run['exact'])} |"
            for run in data["loads"]
        ]
        parts.append(
            f"### Loads, record for record\n\nEvery live scheme whose routing depends only on "
            f"each source's records in order, run live on the zipf stream's first "
            f"{data['loads_records']:,} records: advise's per-worker loads against the live "
            "run's.\n\n| setting | loads equal? | predicted loads | live run exact? |\n"
            "|---|---|---|---|\n" + "\n".join(rows)
        )
    if data.get("tables"):
        rows = [
            f"| {run['label']} | {run['max_avg_predicted']:.3f} | "
            f"{or_dash(run['max_avg_live'], '.3f')} | "
            f"{or_dash(ratio_or_none(run['max_avg_live'], run['max_avg_predicted']), '.3f')} | "
            f"{_verdict(run['max_avg_within'])} | {_verdict(run['exact'])} |"
            for run in data["tables"]
        ]
        parts.append(
            "### The routing-table schemes' balance\n\nEvery live routing-table scheme at "
            f"advise's best setting, run live on the drift stream's first {data['records']:,} "
            f"records at {data['table_rate']:,.0f} records/s: the final max/avg advise "
            "predicts against the live run's (within "
            f"{MAX_AVG_TOLERANCE:.0%}). Live, the rounds are counted in records as the "
            "model's (`--control-every`): the same statistics, planned at the same point; "
            "their loads are still not equal record for record, as the sources switch tables "
            "at their next look at the control plane, not at once "
            "(docs/advise.md#checking-the-prediction-live).\n\n"
            "| setting | max/avg predicted | live | ratio | within? | live run exact? |\n"
            "|---|---:|---:|---:|---|---|\n" + "\n".join(rows)
        )
    timed = data["advise_time"]
    parts.append(
        f"### advise's wall time\n\n{timed['records']:,} records of the zipf stream, "
        f"{timed['schemes']} schemes in {timed['settings']} settings: {timed['seconds']:.1f} s "
        f"from the sample's generation to the ranking ({timed['model_seconds']:.1f} s of it "
        f"replaying and ranking); target {TARGET_ADVISE_SECONDS:g} s: "
        f"{_verdict(timed['within'])}."
    )
    return "\n\n".join(parts) + "\n"

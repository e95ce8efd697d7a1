"""A short live run with every stage's exporter on, scraped by the native Prometheus.

One run of the real ``skewer`` stages (pkg, 20,000 records, W = 4, S = 2: the grouping stage's
two sources are child processes, so its multiprocess mode is exercised). While it runs, a
thread reads every exporter of the run it finds in the file_sd target folder, the way
Prometheus discovers them. Afterwards the run's series are read back from Prometheus with
``/api/v1/query_range`` over the run's time span (the exporters are gone by then, so an
instant query would find only stale series) and compared with what Redis says the run did:
the idempotent counters the stages keep there are the independent truth.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
from live_runs import wait_for_stages
from prometheus_client.parser import text_string_to_metric_families

from operators.metrics import imbalance, max_avg_ratio
from pipeline.io import config
from pipeline.io.grouping_store import GroupingStore
from pipeline.runs.orchestrator import Pipeline
from pipeline.runs.plan import RunPlan, new_run_id
from pipeline.services import manager
from pipeline.stages import grouping

pytestmark = pytest.mark.integration

WORKERS = 4
SOURCES = 2
RECORDS = 20_000
#: The series each stage's endpoint must serve for the run while it runs.
STAGE_SERIES = {
    "produce": {"skewer_producer_records_total"},
    "group": {
        "skewer_grouping_records_total",
        "skewer_grouping_routed_total",
        "skewer_grouping_dead_letters_total",
        "skewer_grouping_batch_seconds_count",
        "skewer_routing_table_version",
        "skewer_routing_table_entries",
    },
    "work": {
        "skewer_worker_records_total",
        "skewer_worker_latency_seconds_bucket",
        "skewer_worker_lag_records",
        "skewer_worker_state_entries",
        "skewer_worker_held_records_total",
        "skewer_worker_late_records_total",
        "skewer_worker_rejected_total",
        "skewer_worker_batches_total",
        "skewer_imbalance_records",
        "skewer_imbalance_fraction",
        "skewer_load_max_over_avg",
    },
    "aggregate": {
        "skewer_aggregator_windows_final_total",
        "skewer_aggregator_records_final_total",
        "skewer_replication",
    },
}


class EndpointReader(threading.Thread):
    """Reads every exporter of one run (found like Prometheus finds them) until stopped."""

    def __init__(self, settings: config.Settings, run_id: str) -> None:
        super().__init__(name="endpoint-reader", daemon=True)
        self.targets = settings.prometheus_targets_dir
        self.run_id = run_id
        self.served: dict[str, set[str]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for path in self.targets.glob(f"*-{self.run_id}-*.json"):
                try:
                    [target] = json.loads(path.read_text())
                    url = f"http://{target['targets'][0]}/metrics"
                    with urllib.request.urlopen(url, timeout=2) as response:
                        text = response.read().decode()
                except (OSError, ValueError):
                    continue  # the stage just ended
                names = self.served.setdefault(target["labels"]["stage"], set())
                for family in text_string_to_metric_families(text):
                    names.update(
                        s.name
                        for s in family.samples
                        if s.labels.get("run") == self.run_id and s.labels.get("scheme") == "pkg"
                    )
            time.sleep(0.1)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]


def _last_values(prometheus: str, query: str, start: float, end: float) -> list[tuple[dict, float]]:
    """(labels, last value) of every series of ``query`` over [start, end] at 1 s steps."""
    arguments = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": "1"})
    data = _get_json(f"{prometheus}/api/v1/query_range?{arguments}")
    return [(series["metric"], float(series["values"][-1][1])) for series in data["result"]]


def _scraped_names(prometheus: str, run: str, stage: str, start: float) -> set[str]:
    """The names of the series Prometheus scraped from ``stage`` of ``run`` since ``start``."""
    selector = f'{{run="{run}",stage="{stage}",scheme="pkg"}}'
    arguments = urllib.parse.urlencode({"match[]": selector, "start": start, "end": time.time()})
    series = _get_json(f"{prometheus}/api/v1/series?{arguments}")
    return {labels["__name__"] for labels in series}


def _by(values: list[tuple[dict, float]], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in values:
        out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


@pytest.mark.native_only("the native Prometheus finds the stages' exporters through file_sd")
def test_every_stage_exports_and_prometheus_agrees_with_redis(
    settings: config.Settings, prometheus: str
) -> None:
    # The native Prometheus runs this checkout's configuration (services reloads a stale one).
    loaded = _get_json(f"{prometheus}/api/v1/status/config")["yaml"]
    assert "job_name: skewer" in loaded and str(settings.prometheus_targets_dir) in loaded
    groups = {g["name"]: g for g in _get_json(f"{prometheus}/api/v1/rules")["groups"]}
    assert len(groups["skewer"]["rules"]) == 7
    assert {rule["health"] for rule in groups["skewer"]["rules"]} <= {"ok", "unknown"}

    plan = RunPlan("pkg", RECORDS, workers=WORKERS, sources=SOURCES, run_id=new_run_id())
    run = plan.run_id
    reader = EndpointReader(settings, run)
    pipeline = Pipeline(plan, settings)
    passed = False
    try:
        began = time.time()
        pipeline.prepare()
        reader.start()
        pipeline.start_all()
        wait_for_stages(pipeline)
        ended = time.time()
        reader.stopping.set()
        reader.join(5)
        store = pipeline.store
        loads = store.processed_per_worker(WORKERS).tolist()
        counters = GroupingStore(store.client, plan.run_id)
        routed = {str(w): count for w, count in counters.routed_per_worker().items()}
        sent = [int(store.client.get(store.keys.producer_sent(p))) for p in range(SOURCES)]
        consumed = [  # records each source consumed from keys, DATA and watermarks
            counters.source_counts(s)["records"] for s in range(SOURCES)
        ]
        dead = counters.dead_letters_by_reason()
        totals = store.window_totals()
        windows_final = len(store.final_windows())
        passed = True
    finally:
        reader.stopping.set()
        pipeline.stop()
        pipeline.cleanup(logs=passed)
        pipeline.close()

    # Each stage's endpoint served the contract's series of this run while it ran: read by the
    # reader, or by Prometheus's last scrape, which a stage that ended waits for
    # (Exporter.close) and the reader, polling every endpoint in turn, can miss.
    for stage, names in STAGE_SERIES.items():
        served = reader.served.get(stage, set()) | _scraped_names(prometheus, run, stage, began)
        assert names <= served, (stage, served)
    # The run did what it should (the independent facts the series are compared with).
    assert sum(loads) == RECORDS and sent == [RECORDS // SOURCES] * SOURCES and not dead

    def last(query: str) -> list[tuple[dict, float]]:
        values = _last_values(prometheus, query, began - 2, ended + 2)
        assert values, f"Prometheus has no {query}"
        return values

    workers = [str(w) for w in range(WORKERS)]
    records = last(f'skewer_worker_records_total{{run="{run}"}}')
    assert _by(records, "worker") == {w: float(loads[int(w)]) for w in workers}
    assert {labels["stage"] for labels, _ in records} == {"work"}
    # Named by host, stage and run, not by the stage's free port: one started again after a
    # crash goes on with the same series.
    assert {labels["instance"] for labels, _ in records} == {f"127.0.0.1/work/{run}"}
    assert _by(last(f'skewer_grouping_routed_total{{run="{run}"}}'), "worker") == {
        w: float(routed[w]) for w in workers
    }
    assert _by(last(f'skewer_grouping_records_total{{run="{run}"}}'), "source") == {
        str(s): float(consumed[s]) for s in range(SOURCES)
    }
    assert _by(last(f'skewer_producer_records_total{{run="{run}"}}'), "producer") == {
        str(p): float(sent[p]) for p in range(SOURCES)
    }
    dead_letters = last(f'skewer_grouping_dead_letters_total{{run="{run}"}}')
    assert len(dead_letters) == len(grouping.REASONS) * SOURCES
    assert {value for _, value in dead_letters} == {0.0}

    total = sum(loads)
    gauges = {
        "skewer_imbalance_records": float(imbalance(loads)),
        "skewer_imbalance_fraction": float(imbalance(loads)) / total,
        "skewer_load_max_over_avg": float(max_avg_ratio(loads)),
    }
    for name, expected in gauges.items():
        assert [value for _, value in last(f'{name}{{run="{run}"}}')] == [expected], name
    latency_count = last(f'skewer_worker_latency_seconds_count{{run="{run}"}}')
    assert _by(latency_count, "worker") == {w: float(loads[int(w)]) for w in workers}
    for name in ("skewer_worker_lag_records", "skewer_worker_state_entries"):
        assert _by(last(f'{name}{{run="{run}"}}'), "worker") == dict.fromkeys(workers, 0.0)
    assert [v for _, v in last(f'skewer_aggregator_windows_final_total{{run="{run}"}}')] == [
        float(windows_final)
    ]
    assert [v for _, v in last(f'skewer_aggregator_records_final_total{{run="{run}"}}')] == [
        float(RECORDS)
    ]
    assert [v for _, v in last(f'skewer_replication{{run="{run}"}}')] == [
        totals["state_entries"] / totals["distinct_keys"]
    ]
    # The recording rules ran over the live series too: by one evaluation after the run's end at
    # the latest (a short run may fall between two evaluations; a rate over its last minute
    # still sees its counters rise after their series went stale).
    evaluated = ended + float(groups["skewer"]["interval"]) + 1
    time.sleep(max(0.0, evaluated - time.time()))
    throughput = _last_values(
        prometheus,
        f'max_over_time(skewer:throughput:rate1m{{run="{run}"}}[2m])',
        evaluated,
        evaluated,
    )
    assert throughput and throughput[0][1] > 0


# --- the collectors against real Redis and Kafka, with hand-written state ---------------------


def _collected(collector: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in collector.collect():
        for sample in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in sample.labels.items() if k not in ("run", "scheme"))
            )
            out[(sample.name, labels)] = sample.value
    return out


def test_worker_and_aggregator_collectors_read_the_runs_redis_state(
    settings: config.Settings, redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import redis as redis_module
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from pipeline.io.records import END_OF_STREAM
    from pipeline.io.redis_layout import RunKeys
    from pipeline.observe import aggregator as aggregator_metrics
    from pipeline.observe import series
    from pipeline.observe import workers as worker_metrics

    run = new_run_id()
    keys = RunKeys(run)
    labels = series.RunLabels(run, "key")
    redis.hset(keys.stats("records"), mapping={0: 40, 2: 10})  # worker 1: nothing yet
    redis.hset(keys.stats("batches"), mapping={0: 2, 1: 1, 2: 1})
    redis.hset(keys.stats("late"), mapping={2: 3})
    redis.hset(keys.stats("held"), mapping={1: 6})
    redis.hset(keys.latency(0), mapping={0: 30, 25: 10})
    redis.sadd(keys.windows_open, 0, 10_000)
    redis.hset(keys.state(0, 0), mapping={b"a": 1, b"b": 2})
    redis.hset(keys.state(0, 10_000), mapping={b"a": 1})
    redis.hset(keys.state(2, 0), mapping={b"c": 5})
    # A query's two state fields: worker 0 keeps both for "a" in window 0, one for "b".
    redis.hset(keys.config, "fields", '[["count(ms)","count"],["max(ms)","max"]]')
    redis.hset(keys.field(0, 0, 0), mapping={b"a": 1, b"b": 0})
    redis.hset(keys.field(1, 0, 0), mapping={b"a": 7})
    totals = {"windows": 2, "records": 50, "state_entries": 9, "distinct_keys": 6}
    redis.hset(keys.stats("windows"), mapping=totals)
    redis.mset({keys.wm(0): 19_999, keys.wm(1): 29_999, keys.wm(2): 9_999})
    workers = worker_metrics.WorkerCollector(labels, 3, settings.redis_url, lag=lambda: [0, 2, 1])
    aggregator = aggregator_metrics.AggregatorCollector(labels, 3, settings.redis_url)
    try:
        got = _collected(workers)
        w = [(("worker", str(i)),) for i in range(3)]
        assert [got[("skewer_worker_records_total", w[i])] for i in range(3)] == [40, 0, 10]
        assert [got[("skewer_worker_batches_total", w[i])] for i in range(3)] == [2, 1, 1]
        assert [got[("skewer_worker_late_records_total", w[i])] for i in range(3)] == [0, 0, 3]
        assert [got[("skewer_worker_held_records_total", w[i])] for i in range(3)] == [0, 6, 0]
        assert [got[("skewer_worker_state_entries", w[i])] for i in range(3)] == [3, 0, 1]
        entries = "skewer_worker_field_entries"
        assert [got[(entries, (("field", "count(ms)"),) + w[i])] for i in range(3)] == [2, 0, 0]
        assert [got[(entries, (("field", "max(ms)"),) + w[i])] for i in range(3)] == [1, 0, 0]
        assert [got[("skewer_worker_lag_records", w[i])] for i in range(3)] == [0, 2, 1]
        bucket = "skewer_worker_latency_seconds_bucket"
        assert got[(bucket, (("le", "0.01779"), ("worker", "0")))] == 40
        assert got[(bucket, (("le", "0.01"), ("worker", "0")))] == 30
        assert got[("skewer_imbalance_records", ())] == 40 - 50 / 3
        assert got[("skewer_imbalance_fraction", ())] == (40 - 50 / 3) / 50
        assert got[("skewer_load_max_over_avg", ())] == 40 * 3 / 50
        assert _collected(aggregator) == {
            ("skewer_aggregator_windows_final_total", ()): 2,
            ("skewer_aggregator_records_final_total", ()): 50,
            ("skewer_replication", ()): 1.5,
            ("skewer_watermark_seconds", ()): 9.999,
        }
        # END_OF_STREAM is no time to plot: the last real watermark stays.
        redis.mset({keys.wm(w): int(END_OF_STREAM) for w in range(3)})
        assert _collected(aggregator)[("skewer_watermark_seconds", ())] == 9.999

        # Redis gone: one line on stderr and a counter, no exception into the scrape.
        no_retries = Retry(NoBackoff(), 0)  # redis-py would retry for seconds
        workers.client = redis_module.Redis(port=1, socket_connect_timeout=0.5, retry=no_retries)
        assert list(workers.collect()) == []
        assert list(workers.collect()) == []
        errors = series.EXPORTER_ERRORS.labels(**labels.of(stage="work"))._value.get()
        assert errors == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "skewer work: metrics: cannot read the workers' Redis counters: ConnectionError"
        )
    finally:
        workers.close()
        aggregator.close()
        for key in redis.scan_iter(match=f"{keys.prefix}*"):
            redis.delete(key)


def test_work_topic_lag_is_end_offset_minus_committed(
    kafka: str, create_topic: Any, topic_name: str, tmp_path: Any
) -> None:
    from confluent_kafka import Producer

    from pipeline.io import kafka_io
    from pipeline.observe import workers as worker_metrics

    topic = create_topic(topic_name, 3)
    producer = Producer(kafka_io.producer_config(kafka))
    for partition, count in enumerate((5, 3, 0)):
        for i in range(count):
            producer.produce(topic, value=b"v%d" % i, partition=partition)
    assert producer.flush(30) == 0
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    lag = worker_metrics.WorkTopicLag(kafka, topic, 3, checkpoint)
    try:
        assert lag() == [5, 3, 0]  # nothing committed: everything is behind
        (checkpoint / "offsets" / "4").write_text(f'v1\n{{}}\n{{"{topic}":{{"0":2,"1":3}}}}')
        (checkpoint / "commits" / "4").write_text("v1\n{}")
        assert lag() == [3, 0, 0]
    finally:
        lag.close()


@pytest.mark.native_only("tests the native Prometheus service of skewer services")
def test_services_up_reloads_a_running_prometheus_with_a_stale_configuration(
    tmp_path: Any,
) -> None:
    """A Prometheus of ours started by an older checkout (here: made to load an older config)
    gets this checkout's configuration and rules on the next ``skewer services up``."""
    import signal

    from live_runs import free_port

    port = free_port()
    settings = config.load(
        {
            "SKEWER_RUN_DIR": str(tmp_path / "run"),
            "SKEWER_PROMETHEUS_URL": f"http://127.0.0.1:{port}",
        }
    )
    url = settings.prometheus_url
    try:
        [state] = manager.up(settings, ["prometheus"])
        assert state.state == "started"
        [prometheus] = manager.native_services(settings, ["prometheus"])
        old = "global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: old\n"
        prometheus.config_path.write_text(old)
        os.kill(state.pid, signal.SIGHUP)  # type: ignore[arg-type]
        deadline = time.monotonic() + 15
        while "job_name: old" not in _get_json(f"{url}/api/v1/status/config")["yaml"]:
            assert time.monotonic() < deadline, "the old configuration was never loaded"
            time.sleep(0.2)
        assert _get_json(f"{url}/api/v1/rules")["groups"] == []

        [again] = manager.up(settings, ["prometheus"])
        assert (again.state, again.pid) == ("running", state.pid)  # the same process, reloaded
        loaded = _get_json(f"{url}/api/v1/status/config")["yaml"]
        assert "job_name: skewer" in loaded and "job_name: old" not in loaded
        assert prometheus.config_path.read_text() == prometheus.prometheus_config()
        [group] = _get_json(f"{url}/api/v1/rules")["groups"]
        assert (group["name"], len(group["rules"])) == ("skewer", 7)
        assert prometheus.write_config() is False  # up to date: the next `up` reloads nothing
    finally:
        manager.down(settings, ["prometheus"])

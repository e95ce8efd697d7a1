"""The soak's samples (``skewer bench soak``, :mod:`bench.soak`): once a second, per run the
records produced, grouped and applied and the latency of the last second's applies; the RSS of
every process of the services and the runs; Redis's memory and keys; the Kafka logs' size.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Sample:
    """One second of the soak: per run, records produced, grouped and applied, and the latency
    histogram of the records applied since the last sample; the processes' RSS (every
    :data:`RSS_EVERY_SECONDS`, else empty); Redis and Kafka. A figure that could not be read
    (Redis failing over, say) is None."""

    t_s: float
    produced: list[int | None]
    grouped: list[int | None]
    applied: list[int | None]
    latency: list[dict[int, int]]
    rss_mb: dict[int, tuple[str, float]]
    redis_memory_mb: float | None
    redis_keys: int | None
    state_keys: int | None
    kafka_log_mb: float | None
    #: Keys of final windows' results (``result:*``, ``resultsum:*``, ``topk:*``).
    result_keys: int | None = None

    def lag(self, run: int) -> int | None:
        """Records produced but not yet applied by ``run``'s workers."""
        produced, applied = self.produced[run], self.applied[run]
        return None if produced is None or applied is None else produced - applied

    def as_dict(self) -> dict[str, Any]:
        return {
            "t_s": self.t_s,
            "produced": self.produced,
            "grouped": self.grouped,
            "applied": self.applied,
            "latency": [{str(k): v for k, v in h.items()} for h in self.latency],
            "rss_mb": {str(pid): list(value) for pid, value in self.rss_mb.items()},
            "redis_memory_mb": self.redis_memory_mb,
            "redis_keys": self.redis_keys,
            "state_keys": self.state_keys,
            "kafka_log_mb": self.kafka_log_mb,
            "result_keys": self.result_keys,
        }

    @classmethod
    def from_dict(cls, recorded: dict[str, Any]) -> Sample:
        """The sample :meth:`as_dict` recorded (JSON's string keys back to numbers)."""
        return cls(
            **{
                **recorded,
                "latency": [{int(k): v for k, v in h.items()} for h in recorded["latency"]],
                "rss_mb": {int(pid): (name, mb) for pid, (name, mb) in recorded["rss_mb"].items()},
            }
        )


#: Seconds between two samples of every process's RSS (each pid's RSS every second made most
#: of an hour's samples, and memory moves slower than that).
RSS_EVERY_SECONDS = 10


@dataclass
class Sampler:
    """Samples the pipelines and their processes once a second, on a thread of its own."""

    settings: Any
    #: The native services' settings (their pid files, ports and folders).
    services: Any
    pipelines: Sequence[Any]
    origin: float
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        from pipeline.io.redis_client import connect_redis
        from pipeline.io.state_store import StateStore

        client = connect_redis(self.settings.redis_url)
        stores = [StateStore(client, p.plan.run_id) for p in self.pipelines]
        previous: list[dict[int, int]] = [{} for _ in self.pipelines]
        next_at = time.monotonic()
        for second in itertools.count():
            if self._stop.is_set():
                break
            next_at += 1.0
            with_rss = second % RSS_EVERY_SECONDS == 0
            with contextlib.suppress(Exception):  # a second lost, not the soak
                self.samples.append(self._sample(client, stores, previous, with_rss))
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        client.close()

    def _sample(
        self, client: Any, stores: Sequence[Any], previous: list[dict[int, int]], with_rss: bool
    ) -> Sample:
        from pipeline.runs.latency import histogram_difference

        t_s = round(time.monotonic() - self.origin, 3)
        produced: list[int | None] = []
        grouped: list[int | None] = []
        applied: list[int | None] = []
        latency: list[dict[int, int]] = []
        for run, (pipeline, store) in enumerate(zip(self.pipelines, stores, strict=True)):
            try:
                # Only this thread reads the pipelines' progress (their Kafka consumer).
                progress = pipeline.progress()
                histogram = store.latency_histogram(pipeline.plan.workers)
            except Exception:
                produced.append(None)
                grouped.append(None)
                applied.append(None)
                latency.append({})
                continue
            produced.append(progress.produced)
            grouped.append(progress.grouped)
            applied.append(progress.processed)
            latency.append(histogram_difference(histogram, previous[run]))
            previous[run] = histogram
        redis_memory = redis_keys = state_keys = result_keys = None

        def count(pattern: str) -> int:
            return sum(1 for _ in client.scan_iter(match=pattern, count=1000))

        with contextlib.suppress(Exception):
            redis_memory = round(int(client.info("memory")["used_memory"]) / 2**20, 3)
            redis_keys = int(client.dbsize())
            state_keys = sum(
                count(store.keys.state_family(kind))
                for store in stores
                for kind in ("state", "held")
            )
            result_keys = sum(
                count(pattern)
                for store in stores
                for pattern in (
                    store.keys.result("*"),
                    store.keys.result_sums("*"),
                    store.keys.topk("*"),
                )
            )
        return Sample(
            t_s,
            produced,
            grouped,
            applied,
            latency,
            process_rss(self.services, self.pipelines) if with_rss else {},
            redis_memory,
            redis_keys,
            state_keys,
            kafka_log_mb(self.services),
            result_keys,
        )


def process_rss(settings: Any, pipelines: Sequence[Any]) -> dict[int, tuple[str, float]]:
    """pid -> (what it is, RSS in MB) of every process of the services and the runs: a service
    (its name), a stage of a run (``{scheme} {stage}``), or a process one of those started
    (``{parent's label} / {program}``: an executor under its Spark worker, a grouping source)."""
    from pipeline.services import manager, process

    roots: dict[int, str] = {}
    for service in manager.native_services(settings):
        record = process.read_pid_file(service.pid_path)
        if record is not None:
            roots[record.pid] = service.name
    for pipeline in pipelines:
        for stage, running in pipeline.stages.items():
            if running.exit_code() is None:
                roots[running.process.pid] = f"{pipeline.plan.scheme} {stage}"
    table: dict[int, tuple[int, str, float]] = {}
    page_mb = os.sysconf("SC_PAGE_SIZE") / 2**20
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = process.stat_fields(int(entry.name))  # [1]: the parent
        try:
            resident = int((entry / "statm").read_text().split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if fields is not None:
            table[int(entry.name)] = (int(fields[1]), program(command), resident * page_mb)

    def label(pid: int, depth: int = 0) -> str | None:
        if pid in roots:
            return roots[pid]
        parent = table.get(pid, (0, "", 0.0))[0]
        if depth > 8 or parent <= 1:
            return None
        above = label(parent, depth + 1)
        return None if above is None else f"{above} / {table[pid][1]}"

    found = {}
    for pid, (_, _, rss) in table.items():
        name = label(pid)
        if name is not None:
            found[pid] = (name, round(rss, 2))
    return found


def program(command: Sequence[bytes]) -> str:
    """A short name of a process from its command line: a JVM's main class, a Python module.

    >>> executor = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"
    >>> program([b"java", b"-Dspark.ui.enabled=false", executor, b"--hostname", b"127.0.0.1"])
    'CoarseGrainedExecutorBackend'
    >>> program([b"python", b"-m", b"pyspark.daemon"]), program([b"/usr/bin/redis-server", b"x"])
    ('pyspark.daemon', 'redis-server')
    """
    words = [w.decode(errors="replace") for w in command if w]
    if not words:
        return "?"
    if words[0].endswith("java"):
        main = next((w for w in words[1:] if JAVA_CLASS.fullmatch(w)), None)
        return main.rsplit(".", 1)[-1] if main else "java"
    if "-m" in words[:-1]:
        return words[words.index("-m") + 1]
    return Path(words[0]).name


#: A Java class's full name (package in lower case, class capitalized).
JAVA_CLASS = re.compile(r"[a-z_]\w*(\.[a-z_]\w*)*\.[A-Z][\w$]*")


def kafka_log_mb(settings: Any) -> float | None:
    """The size of every native Kafka node's log directory together, in MB."""
    from pipeline.io import config
    from pipeline.services.kafka_broker import KafkaNodeService

    total = 0
    for node in range(1, config.KAFKA_CLUSTER_NODES + 1):
        for root, _dirs, files in os.walk(KafkaNodeService(settings, node).data_dir / "data"):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.stat(os.path.join(root, name)).st_size
    return round(total / 2**20, 3) if total else None

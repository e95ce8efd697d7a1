"""The run's timeline: per-worker loads sampled into Redis about once a second.

Layer: observe.

:class:`TimelineSampler` runs in the aggregator's loop (the one stage that lives for the whole
run): about once a second, and once more when the aggregator ends, it appends one JSON sample
to the run's ``stats:timeline`` list::

    {"t_ms": <wall clock, ms>, "records": [L_0, ..., L_W-1], "routed": [R_0, ..., R_W-1]}

``records`` are the workers' cumulative processed records (``stats:records``) and ``routed``
the grouping stage's cumulative records per worker (``stats:routed``). Samples are cumulative,
so a duplicate sample only adds an empty interval, and nothing is counted twice. The list keeps
the latest :data:`MAX_SAMPLES`. The run report (:mod:`pipeline.runs.report`) draws from them.

Example:
    >>> Sample(1000, (30, 10), (31, 10)).to_json()
    '{"t_ms": 1000, "records": [30, 10], "routed": [31, 10]}'
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.io.redis_layout import RunKeys
from pipeline.io.state_store import StateStore

if TYPE_CHECKING:
    import redis as redis_module

#: Seconds between two timeline samples.
SAMPLE_SECONDS = 1.0
#: Samples kept per run (the list is trimmed to the newest ones).
MAX_SAMPLES = 100_000


def timeline_key(run_id: str) -> str:
    """``skewer:{run}:stats:timeline``: the Redis list of samples."""
    return RunKeys(run_id).stats("timeline")


# --- the timeline -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """Cumulative per-worker counters at one wall-clock instant."""

    t_ms: int
    records: tuple[int, ...]
    routed: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps(
            {"t_ms": self.t_ms, "records": list(self.records), "routed": list(self.routed)}
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Sample:
        """ValueError (or KeyError/TypeError) unless ``raw`` is a sample's JSON."""
        value = json.loads(raw)
        records = tuple(int(v) for v in value["records"])
        routed = tuple(int(v) for v in value["routed"])
        if not records or len(routed) != len(records):
            raise ValueError("records and routed must be equally long lists")
        return cls(int(value["t_ms"]), records, routed)


def take_sample(store: StateStore, n_workers: int, t_ms: int) -> Sample:
    """Read the run's cumulative counters now; ``t_ms`` is the wall clock of the reading."""
    records = store.processed_per_worker(n_workers)
    routed = store.per_worker("routed", n_workers)
    return Sample(t_ms, tuple(records.tolist()), tuple(routed.tolist()))


def append_sample(client: redis_module.Redis, run_id: str, sample: Sample) -> None:
    key = timeline_key(run_id)
    pipe = client.pipeline(transaction=True)
    pipe.rpush(key, sample.to_json())
    pipe.ltrim(key, -MAX_SAMPLES, -1)
    pipe.execute()


class TimelineSampler:
    """Appends a sample when :meth:`tick` finds one due (every ``every_seconds``), and one
    more at :meth:`close`. The aggregator calls both from its loop."""

    def __init__(
        self,
        store: StateStore,
        n_workers: int,
        every_seconds: float = SAMPLE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.n_workers = n_workers
        self.every_seconds = every_seconds
        self.clock = clock
        self._last: float | None = None

    def sample(self) -> Sample:
        now = self.clock()
        sample = take_sample(self.store, self.n_workers, round(now * 1000))
        append_sample(self.store.client, self.store.keys.run_id, sample)
        self._last = now
        return sample

    def tick(self) -> Sample | None:
        """Sample if ``every_seconds`` passed since the last sample (or none was taken)."""
        if self._last is not None and self.clock() - self._last < self.every_seconds:
            return None
        return self.sample()

    def close(self) -> None:
        """The final sample. Called on the way out, also after an error: a Redis that does not
        answer gets one line on stderr instead of hiding the error that ended the loop."""
        import redis as redis_module

        try:
            self.sample()
        except redis_module.RedisError as error:
            print(f"timeline: final sample not written: {error}", file=sys.stderr)


# --- figures from the samples -----------------------------------------------------------------

"""Golden vectors of a worker's apply: ``work`` rows in, the apply script's ARGV and the Redis
state it leaves out (``tests/vectors/apply_args.tsv``).

The ARGV is declared once (:data:`pipeline.io.redis_layout.APPLY_SCRIPT`) and built on two
sides: :meth:`pipeline.io.state_store.WorkerBatch.script_args` for a micro-batch, and the
real-time writer's ``WorkBuffer.scriptArgs`` in the JVM. Both are checked on these vectors
(``tests/unit/test_apply_vectors.py``, ``jvm/realtime-writer``'s ``ApplyArgsTest``), and the
Lua script's state out by ``tests/integration/test_apply_script_vectors.py``. A micro-batch's
ARGV guards with its batch id twice where the writer's has its rows' first and last offsets,
and lists its (window, key) pairs in the order it grouped them where the writer's are in
(window, key bytes) order; the script's effect depends on neither. The vectors hold the
writer's; the Python check puts its pairs in that order and its batch id in the offsets'
place.

One line per item, tab-separated, bytes in hex:
``case NAME PREFIX WORKER SOURCES WINDOW_MS NOW_MS QUERY`` (QUERY ``-``: counts only, which
the real-time writer keeps; a case with a query is the micro-batch path's alone),
``row OFFSET KEY VALUE TIMESTAMP_MS`` (KEY ``-``: none), ``argv ITEM ...``,
``state KEY TYPE CONTENT`` (a hash's ``field=value`` pairs by ``,``; a string's value).

Regenerate (a Redis at the URL; the run's keys are deleted after): ``.venv/bin/python
tests/apply_vectors.py redis://127.0.0.1:16379/0``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.io import records

VECTORS = Path(__file__).resolve().parent / "vectors" / "apply_args.tsv"
#: The batch id a micro-batch's ARGV carries in place of the offsets.
BATCH_ID = 7


@dataclass
class Case:
    name: str
    prefix: str
    worker: int
    sources: int
    window_ms: int
    now_ms: int
    query: str | None
    #: (offset, key, value, timestamp_ms)
    rows: list[tuple[int, bytes | None, bytes, int]] = field(default_factory=list)
    argv: list[bytes] = field(default_factory=list)
    #: (key, type, content): a hash as sorted (field, value) pairs, a string as its value.
    state: list[tuple[str, str, list[tuple[bytes, bytes]] | bytes]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.prefix.split(":")[1]


def micro_batch_argv(case: Case) -> list[bytes]:
    """The ARGV :mod:`pipeline.stages.worker_task` builds for ``case``'s rows as one
    micro-batch, as bytes, the batch id in place of the first and last offsets."""
    from pipeline.stages.user_topic import topic_extractor
    from pipeline.stages.worker_task import RunFields, decode_partition, to_worker_batch

    fields = RunFields()
    if case.query is not None:
        from pipeline.io.query.parse import parse_query

        job = parse_query(case.query)
        extractor = topic_extractor(job.route_on.spec.text, job.time.text, None, case.query)
        fields = RunFields(job.state_fields, extractor)
    keys = [key for _, key, _, _ in case.rows]
    values = [value for _, _, value, _ in case.rows]
    decoded = decode_partition(keys, values, fields)
    batch = to_worker_batch(
        decoded,
        np.array([t for *_, t in case.rows], dtype=np.int64),
        worker=case.worker,
        batch_id=BATCH_ID,
        now_ms=case.now_ms,
        window_ms=case.window_ms,
        n_sources=case.sources,
        fields=fields,
    )
    return in_pair_order([_bytes(item) for item in batch.script_args(case.prefix, case.sources)])


def in_pair_order(argv: list[bytes]) -> list[bytes]:
    """``argv`` with its (window, key, count, field values) pairs in (window, key bytes)
    order, the real-time writer's."""
    declared = argv[5]
    width = 3 + (len(json.loads(declared)) if declared else 0)
    count, first = int(argv[6]), 7
    pairs = [argv[first + i * width : first + (i + 1) * width] for i in range(count)]
    pairs.sort(key=lambda pair: (int(pair[0]), pair[1]))
    return [
        *argv[:first],
        *(item for pair in pairs for item in pair),
        *argv[first + count * width :],
    ]


def _bytes(item: bytes | str | int) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode()


def read(path: Path = VECTORS) -> list[Case]:
    cases: list[Case] = []
    for line in path.read_text().splitlines():
        kind, *parts = line.split("\t")
        if kind == "case":
            name, prefix, worker, sources, window_ms, now_ms, query = parts
            cases.append(
                Case(name, prefix, int(worker), int(sources), int(window_ms), int(now_ms),
                     None if query == "-" else query)
            )  # fmt: skip
        elif kind == "row":
            offset, key, value, timestamp = parts
            key_bytes = None if key == "-" else bytes.fromhex(key)
            cases[-1].rows.append((int(offset), key_bytes, bytes.fromhex(value), int(timestamp)))
        elif kind == "argv":
            cases[-1].argv = [bytes.fromhex(item) for item in parts]
        elif kind == "state":
            key, type_, content = parts
            items = [item for item in content.split(",") if item]
            if type_ == "hash":
                pairs = [pair.split("=") for pair in items]
                value: object = [(bytes.fromhex(f), bytes.fromhex(v)) for f, v in pairs]
            elif type_ == "set":
                value = [bytes.fromhex(member) for member in items]
            else:
                value = bytes.fromhex(content)
            cases[-1].state.append((key, type_, value))  # type: ignore[arg-type]
    return cases


def redis_state(client: object, prefix: str) -> list[tuple[str, str, object]]:
    """Every key under ``prefix`` as ``(key, type, content)``, sorted."""
    out: list[tuple[str, str, object]] = []
    for key in sorted(client.scan_iter(match=prefix + "*")):  # type: ignore[attr-defined]
        type_ = client.type(key).decode()  # type: ignore[attr-defined]
        if type_ == "hash":
            content: object = sorted(client.hgetall(key).items())  # type: ignore[attr-defined]
        elif type_ == "string":
            content = client.get(key)  # type: ignore[attr-defined]
        else:
            content = sorted(client.smembers(key))  # type: ignore[attr-defined]
        out.append((key.decode(), type_, content))
    return out


def _content_text(type_: str, content: object) -> str:
    if type_ == "hash":
        return ",".join(f"{f.hex()}={v.hex()}" for f, v in content)  # type: ignore[attr-defined]
    if type_ == "set":
        return ",".join(member.hex() for member in content)  # type: ignore[attr-defined]
    return content.hex()  # type: ignore[attr-defined]


def _cases() -> list[Case]:
    """The cases, rows only."""
    counts = Case("counts", "skewer:golden-counts:", 1, 2, 10_000, 1_000_050, None)
    data = [  # key, event time, Kafka timestamp
        (b"b", 5_000, 1_000_000),
        (b"a", 5_001, 1_000_010),
        (b"\xff\x00", 12_000, 1_000_020),  # after "é" unsigned, before "a" signed
        ("é".encode(), 12_001, 1_000_030),
        (b"a", 5_002, 999_000),
        (b"b", 19_999, 1_000_050),
    ]
    inputs, _ = records.decode_input(
        records.encode_input(
            np.array([t for _, t, _ in data]), np.zeros(len(data)), np.arange(len(data))
        )
    )
    work = records.encode_work(inputs, source=0, table_version=2)
    rows: list[tuple[bytes | None, bytes, int]] = [
        (key, value, stamp) for (key, _, stamp), value in zip(data, work, strict=True)
    ]
    rows.insert(2, (None, work[0], 1_000_000))  # DATA without a key: rejected
    rows.insert(3, (b"x", b"not skewer's", 1_000_000))  # no header: rejected
    rows += [
        (None, records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=9_999), 0),
        (b"m", records.encode_marker(records.Kind.WATERMARK, source=1, time_ms=4_000), 0),
        (None, records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=8_000), 0),
        (None, records.encode_marker(records.Kind.TABLE_SWITCH, source=1, table_version=3), 0),
    ]
    counts.rows = [(100 + i, key, value, stamp) for i, (key, value, stamp) in enumerate(rows)]

    query = (
        "SELECT user, count(*), avg(ms), min(ms), max(ms), count(ms) FROM clicks "
        "GROUP BY user, window(timestamp_millis(t), '10 seconds')"
    )
    fields = Case("fields", "skewer:golden-fields:", 0, 1, 10_000, 50_000, query)
    # user, event time, the user's value: numbers beyond a double's 53 bits in millionths,
    # a missing and a text ms (NULLs)
    user_values = [
        (b"u1", 1_000, '{"user": "u1", "t": 1000, "ms": 2.5}'),
        (b"u1", 2_000, '{"user": "u1", "t": 2000, "ms": -999999999999.999999}'),
        (b"u1", 3_000, '{"user": "u1", "t": 3000, "ms": -999999999999.999998}'),
        (b"u1", 3_500, '{"user": "u1", "t": 3500}'),
        (b"u2", 4_000, '{"user": "u2", "t": 4000, "ms": "slow"}'),
        (b"u2", 11_000, '{"user": "u2", "t": 11000, "ms": 999999999999.999999}'),
    ]
    headers = records.work_headers(
        np.array([t for _, t, _ in user_values]),
        partition=0,
        offsets=np.arange(len(user_values)),
        source=0,
        table_version=0,
    )
    fields.rows = [
        (i, key, header + doc.encode(), 40_000)
        for i, ((key, _, doc), header) in enumerate(zip(user_values, headers, strict=True))
    ]
    fields.rows.append(
        (6, None, records.encode_marker(records.Kind.WATERMARK, source=0, time_ms=10_999), 0)
    )
    return [counts, fields]


def write(redis_url: str, path: Path = VECTORS) -> None:
    """Build every case's ARGV on the micro-batch side, apply it once to the Redis at
    ``redis_url`` and record the state it leaves; write the vectors."""
    import redis

    from pipeline.io.redis_client import register_script
    from pipeline.io.redis_layout import APPLY_SCRIPT

    client = redis.Redis.from_url(redis_url)
    apply = register_script(client, APPLY_SCRIPT)
    lines = []
    for case in _cases():
        argv = micro_batch_argv(case)
        argv[2], argv[3] = str(case.rows[0][0]).encode(), str(case.rows[-1][0]).encode()
        if stale := list(client.scan_iter(match=case.prefix + "*")):
            client.delete(*stale)
        apply(args=argv)
        state = redis_state(client, case.prefix)
        client.delete(*(key.encode() for key, _, _ in state))
        lines.append(
            "\t".join(
                [
                    "case",
                    case.name,
                    case.prefix,
                    str(case.worker),
                    str(case.sources),
                    str(case.window_ms),
                    str(case.now_ms),
                    case.query or "-",
                ]
            )
        )
        for offset, key, value, stamp in case.rows:
            key_text = "-" if key is None else key.hex()
            lines.append(f"row\t{offset}\t{key_text}\t{value.hex()}\t{stamp}")
        lines.append("\t".join(["argv", *(item.hex() for item in argv)]))
        for key, type_, content in state:
            lines.append(f"state\t{key}\t{type_}\t{_content_text(type_, content)}")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write(sys.argv[1])
    print(f"wrote {VECTORS}")

"""`skewer route` and `skewer sim`: the command-line contract, run in-process."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import mmh3
import numpy as np
import pytest

from operators import registry
from operators.base import KeyStatistics, Plan, RoutingTable, Scheme, TableScheme
from operators.keys import KeyBatch, choice_from_hash
from operators.params import parse_value
from operators.selection import least_loaded
from pipeline.cli import app
from pipeline.cli import route as route_command

STAND_IN = "tests_cli_two"


def kg(key: bytes, n_workers: int) -> int:
    return abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers


def two_choices(keys: list[bytes], n_workers: int, n_sources: int) -> list[int]:
    """PKG's rule from its definition, per source, record by record."""
    loads = [[0] * n_workers for _ in range(n_sources)]
    out = []
    for i, key in enumerate(keys):
        own = loads[i % n_sources]
        a = abs(mmh3.hash64(key, 13, signed=True)[0]) % n_workers
        b = abs(mmh3.hash64(key, 17, signed=True)[0]) % n_workers
        chosen = b if own[b] < own[a] else a
        own[chosen] += 1
        out.append(chosen)
    return out


class TwoChoices(Scheme):
    """A local two-choices stand-in (so these tests need no other helper's scheme module)."""

    name = STAND_IN

    def __init__(
        self,
        n_workers: int,
        *,
        source: int = 0,
        n_sources: int = 1,
        seed: int = 0,
        shift: int = 0,
    ):
        super().__init__(n_workers, source=source, n_sources=n_sources, seed=seed)
        self.loads = np.zeros(self.n_workers, dtype=np.int64)
        self.shift = shift

    def route(self, keys: KeyBatch) -> np.ndarray:
        candidates = np.column_stack(
            [
                choice_from_hash(keys.hash64(13), self.n_workers),
                choice_from_hash(keys.hash64(17), self.n_workers),
            ]
        )
        workers = least_loaded(candidates.astype(np.int32), self.loads)
        return ((workers + self.shift) % self.n_workers).astype(np.int32)


@pytest.fixture(autouse=True)
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    schemes = dict(registry._SCHEMES)
    schemes[STAND_IN] = f"{__name__}:TwoChoices"
    monkeypatch.setattr(registry, "_SCHEMES", schemes)


def run_cli(
    argv: list[str],
    stdin: bytes,
    capsysbinary: pytest.CaptureFixture[bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, bytes, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = app.main(argv)
    captured = capsysbinary.readouterr()
    return code, captured.out, captured.err.decode()


def workers_of(output: bytes) -> list[int]:
    return [int(line) for line in output.decode().splitlines()]


def test_route_key_grouping_matches_the_hash_definition(capsysbinary, monkeypatch) -> None:
    keys = [b"apple", b"pear", b"", b"apple", b"fig\r", "ключ".encode()]
    code, out, _ = run_cli(
        ["route", "--scheme", "key", "--workers", "5"],
        b"\n".join(keys) + b"\n",
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    assert workers_of(out) == [kg(k, 5) for k in keys]


def test_route_sources_take_the_input_round_robin(capsysbinary, monkeypatch) -> None:
    keys = [f"k{i % 4}".encode() for i in range(41)]
    for sources in (1, 3):
        code, out, _ = run_cli(
            ["route", "--scheme", STAND_IN, "--workers", "4", "--sources", str(sources)],
            b"\n".join(keys),  # no final newline: the last line still counts
            capsysbinary,
            monkeypatch,
        )
        assert code == 0
        assert workers_of(out) == two_choices(keys, 4, sources)


def test_route_shuffle_per_source(capsysbinary, monkeypatch) -> None:
    code, out, _ = run_cli(
        ["route", "--scheme", "shuffle", "--workers", "3", "--sources", "2"],
        b"a\n" * 7,
        capsysbinary,
        monkeypatch,
    )
    # source 0 starts at worker 0, source 1 at worker 1; each goes round robin
    assert code == 0
    assert workers_of(out) == [0, 1, 1, 2, 2, 0, 0]


def test_route_streams_in_chunks_with_the_same_answer(capsysbinary, monkeypatch) -> None:
    keys = [f"key-{i % 13}".encode() for i in range(500)]
    monkeypatch.setattr(route_command, "READ_SIZE", 7)  # lines split across reads
    code, out, _ = run_cli(
        ["route", "--scheme", STAND_IN, "--workers", "6", "--sources", "4"],
        b"\n".join(keys) + b"\n",
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    assert workers_of(out) == two_choices(keys, 6, 4)


def test_route_params_are_typed(capsysbinary, monkeypatch) -> None:
    keys = [b"a", b"b", b"c"]
    code, out, _ = run_cli(
        ["route", "--scheme", STAND_IN, "--workers", "4", "--param", "shift=1"],
        b"\n".join(keys),
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    assert workers_of(out) == [(w + 1) % 4 for w in two_choices(keys, 4, 1)]
    assert parse_value("3") == 3
    assert parse_value("2.5") == 2.5
    assert parse_value("True") is True and parse_value("false") is False
    assert parse_value("1,2.5,x") == [1, 2.5, "x"]
    assert parse_value("abc") == "abc"


def test_route_empty_input_prints_nothing(capsysbinary, monkeypatch) -> None:
    code, out, _ = run_cli(
        ["route", "--scheme", "key", "--workers", "2"], b"", capsysbinary, monkeypatch
    )
    assert code == 0 and out == b""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["route", "--scheme", "nope", "--workers", "2"],
            "unknown scheme 'nope'; valid schemes: key, shuffle, pkg",
        ),
        (["route", "--scheme", "key", "--workers", "0"], "number of workers must be >= 1, got 0"),
        (
            ["route", "--scheme", "key", "--workers", "2", "--sources", "0"],
            "--sources must be >= 1",
        ),
        (
            ["route", "--scheme", "key", "--workers", "2", "--param", "d"],
            "--param: expected NAME=V",
        ),
        (
            ["route", "--scheme", "key", "--workers", "2", "--param", "d=2"],
            "unknown parameter(s) d",
        ),
        (["sim", "--scheme", "nope", "--workers", "2", "--workload", "zipf:n=10"], "valid schemes"),
        (
            ["sim", "--scheme", "key", "--workers", "0", "--workload", "zipf:n=10"],
            "workers must be",
        ),
        (["sim", "--scheme", "key", "--workers", "2", "--workload", "zipf:z=-1"], "z must be >= 0"),
        (
            ["sim", "--scheme", "key", "--workers", "2", "--workload", "pareto:a=1"],
            "unknown workload 'pareto'; valid workloads: zipf",
        ),
        (["sim", "--scheme", "key", "--workers", "2", "--input", "/no/such"], "no such file"),
        (
            [
                "sim",
                "--scheme",
                "key",
                "--workers",
                "2",
                "--workload",
                "zipf:n=9",
                "--worker-speeds",
                "1,x",
            ],
            "--worker-speeds expects numbers",
        ),
        (
            [
                "sim",
                "--scheme",
                "key",
                "--workers",
                "2",
                "--workload",
                "zipf:n=9",
                "--worker-speeds",
                "1,2,3",
            ],
            "--worker-speeds needs 2 positive numbers",
        ),
    ],
)
def test_errors_are_one_line_with_exit_code_2(argv, message, capsysbinary, monkeypatch) -> None:
    code, out, err = run_cli(argv, b"a\n", capsysbinary, monkeypatch)
    assert code == 2
    assert out == b""
    assert err.count("\n") == 1 and err.startswith(f"skewer {argv[0]}: error: ")
    assert message in err


def test_sim_json_on_a_file_by_hand(tmp_path: Path, capsysbinary, monkeypatch) -> None:
    words = [b"x", b"y", b"x", b"z", b"x", b"x"]
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\n".join(words) + b"\n")
    code, out, _ = run_cli(
        [
            "sim",
            "--scheme",
            "key",
            "--workers",
            "3",
            "--sources",
            "2",
            "--input",
            str(path),
            "--json",
        ],
        b"",
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    result = json.loads(out)
    workers = [kg(w, 3) for w in words]
    # 6 records < 100 checkpoints: I(t) is sampled after every record
    series = [np.bincount(workers[:t], minlength=3).max() - t / 3 for t in range(1, len(words) + 1)]
    assert result["records"] == 6 and result["distinct_keys"] == 3
    assert result["imbalance_final"] == pytest.approx(series[-1] / 6)
    assert result["imbalance_avg_fraction"] == pytest.approx(np.mean(series) / 6)
    assert result["max_avg_ratio"] == pytest.approx(np.bincount(workers).max() / 2)
    assert result["replication"] == 1.0
    assert result["table_entries"] == 0 and result["migrated_fraction"] == 0.0
    assert result["p1"] == pytest.approx(4 / 6)
    assert result["exec_time_vs_shuffle"] > 0 and result["routing_rate"] > 0
    assert result["checkpoints"] == 6


def test_sim_json_on_a_workload(capsysbinary, monkeypatch) -> None:
    code, out, _ = run_cli(
        [
            "sim",
            "--scheme",
            STAND_IN,
            "--workers",
            "4",
            "--sources",
            "2",
            "--workload",
            "zipf:z=1.2,keys=1000,n=20000,seed=7",
            "--json",
        ],
        b"",
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    result = json.loads(out)
    assert result["workload"] == "zipf:z=1.2,keys=1000,n=20000,seed=7"
    assert result["records"] == 20000 and result["checkpoints"] == 100
    assert 1.0 <= result["replication"] <= 2.0
    from producers.workloads import parse

    keys = parse(result["workload"]).keys().to_list()
    workers = two_choices(keys, 4, 2)
    assert result["imbalance_final"] == pytest.approx((np.bincount(workers).max() - 5000) / 20000)


def test_sim_table_prints_a_readable_table(capsysbinary, monkeypatch) -> None:
    code, out, _ = run_cli(
        ["sim", "--scheme", "shuffle", "--workers", "2", "--workload", "zipf:n=100"],
        b"",
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    lines = dict(line.split(None, 1) for line in out.decode().splitlines())
    assert lines["records"] == "100" and lines["imbalance_final"] == "0"
    assert lines["exec_time_vs_shuffle"] == "1"


class EmptyPlans(TableScheme):
    """Key grouping whose controller rounds always publish an empty table."""

    name = "tests_cli_table"

    def base_workers(self, keys: KeyBatch) -> np.ndarray:
        return choice_from_hash(keys.hash64(13), self.n_workers)

    def route(self, keys: KeyBatch) -> np.ndarray:
        return self.table.apply(keys.key_ids(), self.base_workers(keys))

    def statistics(self, reset: bool = True) -> KeyStatistics:
        empty = np.empty(0)
        loads = np.zeros(self.n_workers)
        return KeyStatistics(empty.astype(np.int64), empty, empty, empty, loads, 0)

    def plan(self, stats: KeyStatistics) -> Plan:
        return Plan(RoutingTable(), np.empty(0, dtype=np.int64), 0.0, True, 0.0)


@pytest.mark.parametrize(
    ("option", "rounds"),
    [([], 9), (["--rebalance-interval", "0"], 0), (["--rebalance-interval", "300"], 3)],
)
def test_sim_table_schemes_rebalance_ten_times_by_default(
    option, rounds, capsysbinary, monkeypatch
) -> None:
    schemes = dict(registry._SCHEMES)
    schemes["tests_cli_table"] = f"{__name__}:EmptyPlans"
    monkeypatch.setattr(registry, "_SCHEMES", schemes)
    code, out, _ = run_cli(
        [
            "sim",
            "--scheme",
            "tests_cli_table",
            "--workers",
            "3",
            "--workload",
            "zipf:n=1000",
            "--json",
            *option,
        ],
        b"",
        capsysbinary,
        monkeypatch,
    )
    assert code == 0
    assert json.loads(out)["rebalances"] == rounds

"""`skewer demo` routes with a real scheme into real Kafka partitions and reads them back."""

from __future__ import annotations

import json
from collections import Counter

import mmh3
import pytest

from pipeline import cli

pytestmark = pytest.mark.integration


def test_demo_json_counts_per_partition_match_an_independent_reference(
    kafka: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from producers import workloads

    monkeypatch.setenv("SKEWER_KAFKA_BOOTSTRAP", kafka)
    spec = "zipf:z=1.1,keys=200,seed=3"
    exit_code = cli.main(
        ["demo", "--records", "20000", "--workers", "8", "--workload", spec, "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert exit_code == 0

    # Key grouping, written out from its definition: worker = |MurmurHash3_x64_128(key, 13)[0]|
    # mod W, the first 64 bits read as a signed integer (DESIGN.md).
    keys = workloads.parse(f"{spec},n=20000").keys().to_list()
    workers = Counter(abs(mmh3.hash64(key, 13, signed=True)[0]) % 8 for key in keys)
    expected = [workers[w] for w in range(8)]

    assert report["records"] == 20_000
    assert report["produced"] == expected
    assert report["consumed"] == expected
    assert report["exact"] is True
    assert report["imbalance"] == max(expected) - 20_000 / 8
    assert report["max_avg_ratio"] == max(expected) / (20_000 / 8)


def test_demo_without_kafka_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Port 1 on the loopback address: nothing listens there.
    monkeypatch.setenv("SKEWER_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    assert cli.main(["demo", "--records", "10"]) == 1
    error = capsys.readouterr().err
    assert error == (
        "skewer demo: Kafka does not answer at 127.0.0.1:1; run `skewer services up` first\n"
    )


def test_demo_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--workers", "0"]) == 2
    assert capsys.readouterr().err == "skewer demo: error: --workers must be >= 1, got 0\n"

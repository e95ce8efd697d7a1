"""Redis and Prometheus answer and keep what they are given, with exact numbers."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections import Counter

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.live_path]


def test_redis_round_trip(redis, redis_prefix: str) -> None:
    # 1,000 records of 7 keys: key k(i mod 7); counts known by hand: 143 for k0..k5, 142 for k6.
    keys = [f"k{record % 7}" for record in range(1_000)]
    counts_key = f"{redis_prefix}counts"
    pipe = redis.pipeline()
    for key in keys:
        pipe.hincrby(counts_key, key, 1)
    pipe.execute()

    stored = {field.decode(): int(value) for field, value in redis.hgetall(counts_key).items()}
    assert stored == {"k0": 143, "k1": 143, "k2": 143, "k3": 143, "k4": 143, "k5": 143, "k6": 142}
    assert stored == dict(Counter(keys))

    blob = bytes(range(256))
    assert redis.set(f"{redis_prefix}blob", blob) is True
    assert redis.get(f"{redis_prefix}blob") == blob
    assert redis.delete(f"{redis_prefix}blob", counts_key) == 2
    assert redis.exists(counts_key) == 0


def test_tests_use_their_own_redis_database(redis, redis_prefix: str) -> None:
    import redis as redis_module

    # Database 0 holds the sessions' claims (one database each, when sessions run side by side).
    assert redis.connection_pool.connection_kwargs["db"] >= 1
    kwargs = redis.connection_pool.connection_kwargs
    database_zero = redis_module.Redis(host=kwargs["host"], port=kwargs["port"], db=0)
    try:
        redis.set(f"{redis_prefix}marker", b"1")
        assert database_zero.exists(f"{redis_prefix}marker") == 0
        assert redis.exists(f"{redis_prefix}marker") == 1
    finally:
        redis.delete(f"{redis_prefix}marker")
        database_zero.close()


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return json.load(response)


def test_prometheus_ready_and_answers_queries(prometheus: str) -> None:
    with urllib.request.urlopen(f"{prometheus}/-/ready", timeout=10) as response:
        assert response.status == 200
    query = urllib.parse.urlencode({"query": "1 + 2"})
    answer = _get_json(f"{prometheus}/api/v1/query?{query}")
    assert answer["status"] == "success"
    assert answer["data"]["resultType"] == "scalar"
    assert float(answer["data"]["result"][1]) == 3.0

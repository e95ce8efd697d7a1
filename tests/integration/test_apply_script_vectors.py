"""The apply script leaves, for each golden vector's ARGV, the Redis state the vector holds
(tests/apply_vectors.py): the same keys, types and values, nothing else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from apply_vectors import Case, read, redis_state

from pipeline.io import config
from pipeline.io.redis_client import register_script
from pipeline.io.redis_layout import APPLY_SCRIPT

pytestmark = pytest.mark.integration

CASES = read()


@pytest.fixture
def client(settings: config.Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    for case in CASES:
        if stale := list(client.scan_iter(match=case.prefix + "*")):
            client.delete(*stale)
    client.close()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_apply_leaves_the_vectors_state(client: redis.Redis, case: Case) -> None:
    if stale := list(client.scan_iter(match=case.prefix + "*")):
        client.delete(*stale)
    apply = register_script(client, APPLY_SCRIPT)
    assert apply(args=case.argv) == 1
    assert redis_state(client, case.prefix) == case.state
    assert apply(args=case.argv) == 0  # applied before: nothing changes
    assert redis_state(client, case.prefix) == case.state

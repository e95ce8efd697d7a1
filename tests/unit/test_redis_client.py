"""``redis+sentinel://`` URLs and the clients built from URLs (pipeline/io/redis_client.py),
and the native Sentinel set's layout; no Redis needed (nothing connects)."""

from __future__ import annotations

import pytest

from pipeline.io import config, kafka_io, redis_client
from pipeline.io.redis_client import SentinelAddress, sentinel_address
from pipeline.io.state_store import StateStore
from pipeline.services import manager, redis_sentinel


def test_a_sentinel_url_names_its_sentinels_service_database_and_credentials() -> None:
    address = sentinel_address("redis+sentinel://alice:s%40cret@s1:26379,[::1]:26380/prod-state/3")
    assert address == SentinelAddress(
        (("s1", 26379), ("::1", 26380)), "prod-state", 3, username="alice", password="s@cret"
    )
    assert "s@cret" not in repr(address)
    assert sentinel_address("redis+sentinel://s1:26379/mymaster") == SentinelAddress(
        (("s1", 26379),), "mymaster", 0
    )
    assert sentinel_address("redis+sentinel://s1:1/m/").db == 0  # a trailing slash is fine
    assert sentinel_address("redis://127.0.0.1:16379/0") is None
    assert sentinel_address("unix:///tmp/redis.sock") is None


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1:26379",  # no service
        "redis+sentinel://s1:26379/",
        "redis+sentinel://s1/mymaster",  # no port
        "redis+sentinel://s1:26379,/mymaster",
        "redis+sentinel://s1:26379/mymaster/x",  # the database is a number
        "redis+sentinel://s1:26379/mymaster/0/extra",
        "redis+sentinel://:pw@s1:0/mymaster",
    ],
)
def test_a_malformed_sentinel_url_is_one_line_without_the_password(url: str) -> None:
    with pytest.raises(ValueError, match=r"is not redis\+sentinel://\[\[USER\]") as raised:
        sentinel_address(url)
    assert "pw" not in str(raised.value) and "\n" not in str(raised.value)
    # Where a stage connects, it is a setting to fix: exit 2 (KafkaIOError), naming the variable.
    with pytest.raises(kafka_io.KafkaIOError, match=r"^SKEWER_REDIS_URL: ") as refused:
        redis_client.connect_redis(url)
    assert not isinstance(refused.value, kafka_io.ServiceUnavailableError)


def test_sentinel_clients_are_redis_pys_master_for_and_plain_urls_are_unchanged() -> None:
    from redis.sentinel import SentinelConnectionPool

    url = "redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/skewer/4"
    client = redis_client.client_from_url(url, socket_timeout=3.0)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "skewer" and pool.is_master
    assert pool.connection_kwargs["db"] == 4 and pool.connection_kwargs["password"] == "pw"
    assert pool.connection_kwargs["socket_timeout"] == 3.0
    plain = redis_client.client_from_url("redis://127.0.0.1:16379/2")
    assert not isinstance(plain.connection_pool, SentinelConnectionPool)
    assert plain.connection_pool.connection_kwargs["db"] == 2


def test_only_a_store_behind_sentinel_waits_for_replicas() -> None:
    """A lone Redis has no replica to wait for: its applies stay one script call."""
    assert StateStore.from_url("redis://127.0.0.1:1/0", "r").replicas == 0
    assert StateStore.from_url("redis+sentinel://127.0.0.1:1/skewer", "r").replicas == 1


def test_the_native_sentinel_set_has_its_own_ports_and_url() -> None:
    settings = config.load({config.ENV_REDIS_SENTINEL: "127.0.0.1:46000"})
    assert settings.redis_sentinel_url == (
        "redis+sentinel://127.0.0.1:46000,127.0.0.1:46001,127.0.0.1:46002/skewer/0"
    )
    assert sentinel_address(settings.redis_sentinel_url).service == "skewer"
    # With the Sentinel URL exported, the native primary keeps the default Redis port.
    exported = config.load({config.ENV_REDIS_URL: settings.redis_sentinel_url})
    assert (exported.redis_host, exported.redis_port) == ("127.0.0.1", 16379)
    services = manager.native_services(settings, ["redis"], redis_sentinel_set=True)
    assert [(s.name, s.address) for s in services] == [
        ("redis", "redis://127.0.0.1:16379/0"),
        ("redis-replica-1", "redis://127.0.0.1:16380/0"),
        ("redis-replica-2", "redis://127.0.0.1:16381/0"),
        ("redis-sentinel-1", "127.0.0.1:46000"),
        ("redis-sentinel-2", "127.0.0.1:46001"),
        ("redis-sentinel-3", "127.0.0.1:46002"),
    ]
    with pytest.raises(ValueError, match="SKEWER_REDIS_SENTINEL"):
        config.load({config.ENV_REDIS_SENTINEL: "127.0.0.1"})


def test_a_sentinel_configuration_names_the_primary_replicas_and_other_sentinels(
    tmp_path: object,
) -> None:
    settings = config.load({config.ENV_RUN_DIR: str(tmp_path)})
    sentinel = redis_sentinel.RedisSentinelService(settings, 2)
    sentinel.prepare()
    lines = sentinel.config_path.read_text().splitlines()
    assert "port 36380" in lines and "bind 127.0.0.1" in lines
    assert "sentinel monitor skewer 127.0.0.1 16379 2" in lines
    assert "sentinel down-after-milliseconds skewer 5000" in lines
    known = [line.split()[3:5] for line in lines if line.startswith("sentinel known-")]
    assert known == [
        ["127.0.0.1", "16380"],
        ["127.0.0.1", "16381"],
        ["127.0.0.1", "36379"],
        ["127.0.0.1", "36381"],
    ]
    assert sentinel.command() == ["redis-server", str(sentinel.config_path), "--sentinel"]

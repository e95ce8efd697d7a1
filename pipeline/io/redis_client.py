"""The one way skewer builds a Redis client from a URL, Redis Sentinel included.

Layer: io.

``SKEWER_REDIS_URL`` takes what redis-py's ``Redis.from_url`` takes, and
``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` for a primary that
Sentinel fails over (HOST:PORT the sentinels, SERVICE the name they monitor it by). The client
is redis-py's ``Sentinel(...).master_for(SERVICE)``, with one fix (each connect asks the
sentinels: redis/redis-py#3874). :func:`connect_redis` is every stage's client: it answered
PING and rides out a Redis restart or a failover (:func:`retry_through_restarts`); behind
Sentinel a state write waits for a replica (:func:`replicas_to_wait`). Why:
docs/design.md#redis-pitfalls.

Example:
    >>> sentinel_address("redis+sentinel://:pw@127.0.0.1:36379,127.0.0.1:36380/skewer/2")
    SentinelAddress(sentinels=(('127.0.0.1', 36379), ('127.0.0.1', 36380)), service='skewer', db=2)
    >>> sentinel_address("redis://127.0.0.1:16379/0") is None
    True
    >>> replicas_to_wait("redis+sentinel://h:1/skewer"), replicas_to_wait("redis://h:1/0")
    (1, 0)
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pipeline.io.config import ENV_REDIS_URL, host_ports, redacted_url
from pipeline.io.errors import KafkaIOError, ServiceUnavailableError

if TYPE_CHECKING:
    import redis
    from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_URL_FORM = "redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]"


class NoPrimaryError(Exception):
    """Sentinels answer, but none names a primary that is up for the service: a failover in
    progress, or (:class:`UnknownServiceError`) a wrong service name. The message is one line."""


class UnknownServiceError(NoPrimaryError):
    """Sentinels answer, but none monitors the service: a setting to fix, not a failover to
    wait for."""


class NoSentinelAnswersError(Exception):
    """No sentinel of the URL answers; the message is one line."""


@dataclass(frozen=True)
class SentinelAddress:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def hosts(self) -> str:
        """The sentinels as ``HOST:PORT,...``, for messages."""
        return ",".join(f"{host}:{port}" for host, port in self.sentinels)

    def manager(self, timeout: float) -> Sentinel:
        """redis-py's Sentinel of these sentinels: each asked once, ``timeout`` each, so a dead
        sentinel costs one refused connection, not a retry loop."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        from redis.sentinel import Sentinel

        sentinel_kwargs = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        return Sentinel(list(self.sentinels), sentinel_kwargs=sentinel_kwargs)


@functools.cache
def _sentinel_connection_class() -> type:
    """redis-py's ``SentinelManagedConnection``, asking the sentinels for the primary on every
    connect (a class made on first use: redis is imported lazily, as everywhere in skewer)."""
    from redis.sentinel import SentinelManagedConnection

    class SentinelConnection(SentinelManagedConnection):
        # Command retries reconnect through connect_check_health, which redis-py 8.1 sends to
        # the old address (redis/redis-py#3874): ask the sentinels first, and try once, so the
        # next retry asks them again instead of knocking at a dead primary 30 times.
        def connect_check_health(
            self, check_health: bool = True, retry_socket_connect: bool = True
        ) -> None:
            if not self._sock and self.connection_pool.is_master:
                self.host, self.port = self.connection_pool.get_master_address()
            super().connect_check_health(check_health, retry_socket_connect=False)

    return SentinelConnection


def sentinel_address(url: str) -> SentinelAddress | None:
    """The parts of a ``redis+sentinel://`` URL; None for any other scheme, a ValueError (one
    line, password hidden) for a Sentinel URL that is not of :data:`SENTINEL_URL_FORM`.

    >>> sentinel_address("redis+sentinel://h:1")
    Traceback (most recent call last):
    ...
    ValueError: 'redis+sentinel://h:1' is not redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]
    """
    parts = urlsplit(url.strip())
    if parts.scheme != SENTINEL_SCHEME:
        return None
    path = parts.path.strip("/").split("/")
    try:
        sentinels = host_ports(parts.netloc.rpartition("@")[2], "sentinels")
        valid = path[0] != "" and len(path) <= 2 and (len(path) == 1 or path[1].isdigit())
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"{redacted_url(url)!r} is not {SENTINEL_URL_FORM}")
    return SentinelAddress(
        sentinels=tuple(sentinels),
        service=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


def is_sentinel_url(url: str) -> bool:
    """True for a ``redis+sentinel://`` URL (well formed or not).

    >>> is_sentinel_url("redis+sentinel://h:1/skewer"), is_sentinel_url("redis://h:1/0")
    (True, False)
    """
    return urlsplit(url.strip()).scheme == SENTINEL_SCHEME


def replicas_to_wait(url: str) -> int:
    """How many replicas must acknowledge a state write before it counts as done: 1 behind
    Sentinel (a failover then loses nothing acknowledged), 0 for a lone Redis."""
    return 1 if is_sentinel_url(url) else 0


def client_from_url(url: str, *, sentinel_timeout: float = 5.0, **kwargs: Any) -> redis.Redis:
    """A client of ``url``: ``Redis.from_url(url, **kwargs)``, or for ``redis+sentinel://`` the
    client of the sentinels' current primary (``master_for``; ``kwargs`` are its connection
    options). Nothing is connected yet."""
    import redis as redis_module

    address = sentinel_address(url)
    if address is None:
        return redis_module.Redis.from_url(url, **kwargs)
    credentials = {"username": address.username, "password": address.password}
    return address.manager(sentinel_timeout).master_for(
        address.service,
        db=address.db,
        connection_class=_sentinel_connection_class(),
        **credentials,
        **kwargs,
    )


def require_primary(url: str, timeout: float = 5.0) -> tuple[str, int]:
    """The (host, port) of the primary the sentinels of ``url`` name now.

    Raises :class:`NoSentinelAnswersError` when no sentinel answers, :class:`UnknownServiceError`
    when some answer but none monitors the service, and :class:`NoPrimaryError` when they
    monitor it but name no primary that is up (a failover in progress). ``url`` must be a
    ``redis+sentinel://`` URL.
    """
    from redis.exceptions import RedisError
    from redis.sentinel import MasterNotFoundError

    address = sentinel_address(url)
    if address is None:
        raise ValueError(f"{redacted_url(url)!r} is not a {SENTINEL_SCHEME}:// URL")
    manager = address.manager(timeout)
    try:
        answering = 0
        monitoring = 0
        for sentinel in manager.sentinels:
            try:
                answering += bool(sentinel.ping())
                monitoring += bool(sentinel.sentinel_master(address.service))
            except RedisError:  # down, or "No such master with that name"
                continue
        if not answering:
            raise NoSentinelAnswersError(f"no Redis Sentinel answers at {address.hosts}")
        if not monitoring:
            raise UnknownServiceError(
                f"the Redis Sentinels at {address.hosts} name no primary for service "
                f"{address.service!r} (check the service name of {redacted_url(url)})"
            )
        try:
            host, port = manager.discover_master(address.service)
        except MasterNotFoundError:
            raise NoPrimaryError(
                f"the Redis Sentinels at {address.hosts} name no primary that is up for "
                f"service {address.service!r}"
            ) from None
        return str(host), int(port)
    finally:
        manager.close()


#: A stage's Redis client retries a command this often, backing off up to 1 s: ~25 s in all,
#: long enough for a killed Redis to restart and reload its append-only file.
REDIS_RETRIES = 30


def retry_through_restarts(client: redis.Redis) -> redis.Redis:
    """``client``, retrying a command that met a lost connection, a timeout or a Redis still
    loading its data, instead of failing the stage.

    A retried command may run twice when Redis executed it but the reply was lost; the
    commands exactness rests on are guarded Lua scripts (the worker's apply per batch id, the
    aggregator's finalize, a migration step), so only a counter of the metrics may count one
    batch twice.
    """
    import socket

    from redis.backoff import ExponentialBackoff
    from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError
    from redis.retry import Retry

    errors = (ConnectionError, TimeoutError, socket.timeout, BusyLoadingError)
    client.set_retry(Retry(ExponentialBackoff(cap=1.0, base=0.05), REDIS_RETRIES, errors))
    return client


#: Times a Lua script is run again after Redis said it does not know it (a restarted Redis
#: forgets every loaded script, and can forget one loaded while it still read its data).
SCRIPT_ATTEMPTS = 5


def register_script(client: redis.Redis, text: str) -> Any:
    """``client.register_script(text)`` whose calls load the script again and re-run it while
    Redis answers NOSCRIPT (:data:`SCRIPT_ATTEMPTS`): redis-py reloads it once only, and a
    Redis restarted between that load and the run forgets it again. Re-running is safe: the
    scripts exactness rests on are guarded (:func:`retry_through_restarts`)."""
    return _reloaded_script_class()(client, text)


@functools.cache
def _reloaded_script_class() -> type:
    """redis-py's ``Script``, run again on NOSCRIPT (a class made on first use, as
    :func:`_sentinel_connection_class`)."""
    from redis.commands.core import Script
    from redis.exceptions import NoScriptError

    class ReloadedScript(Script):
        def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
            for attempt in range(1, SCRIPT_ATTEMPTS):
                try:
                    return super().__call__(keys, args, client)
                except NoScriptError:
                    time.sleep(0.1 * attempt)
            return super().__call__(keys, args, client)

    return ReloadedScript


#: How long a stage that starts behind Sentinel waits for a failover in progress: about as long
#: as a running stage's client rides one out (:data:`REDIS_RETRIES`).
FAILOVER_WAIT_SECONDS = 30.0


def connect_redis(
    url: str, timeout: float = 5.0, failover_wait: float = FAILOVER_WAIT_SECONDS
) -> redis.Redis:
    """A Redis client of ``url`` (also ``redis+sentinel://``)
    that answered PING and from then on rides out a Redis restart or a Sentinel failover
    (:func:`retry_through_restarts`).

    A Redis that does not answer is :class:`ServiceUnavailableError` at once, as are sentinels
    of which none answers. Sentinels that monitor the service but name no primary that answers
    are a failover in progress: wait for it, ``failover_wait`` seconds at most. A malformed URL,
    and sentinels that answer but do not monitor the service (a wrong service name), are
    settings to fix: :class:`KafkaIOError`, exit 2, one line.
    """
    import redis as redis_module
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    try:
        sentinel = sentinel_address(url)
        client = client_from_url(
            url,
            sentinel_timeout=timeout,
            socket_timeout=30.0,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
    except ValueError as error:
        raise KafkaIOError(f"{ENV_REDIS_URL}: {error}") from None
    deadline = time.monotonic() + failover_wait
    try:
        while True:
            try:
                client.ping()  # behind Sentinel each connect asks the sentinels again
                return retry_through_restarts(client)
            except redis_module.AuthenticationError as error:
                raise ServiceUnavailableError(
                    f"redis at {redacted_url(url)} refused the credentials: {error}"
                ) from None
            except redis_module.RedisError as error:
                if sentinel is None:
                    if url.startswith("rediss://"):  # over TLS: the reason (a certificate ...)
                        reason = " ".join(str(error).split())
                        raise ServiceUnavailableError(
                            f"redis does not answer at {redacted_url(url)} over TLS: {reason}"
                        ) from None
                    raise ServiceUnavailableError(
                        f"redis does not answer at {redacted_url(url)} (start it: skewer "
                        "services up)"
                    ) from None
            _explain_sentinel_failure(url, timeout)
            if time.monotonic() >= deadline:
                raise ServiceUnavailableError(
                    f"the Redis Sentinels at {sentinel.hosts} named no primary that answers for "
                    f"service {sentinel.service!r} within {failover_wait:.0f} s"
                )
            time.sleep(0.5)
    except BaseException:
        client.close()
        raise


def _explain_sentinel_failure(url: str, timeout: float) -> None:
    """Raise the one-line reason a Sentinel URL gave no primary that answers when it is not a
    failover to wait for: no sentinel answers (:class:`ServiceUnavailableError`) or none
    monitors the service (:class:`KafkaIOError`)."""
    try:
        require_primary(url, timeout)
    except NoSentinelAnswersError as error:
        raise ServiceUnavailableError(
            f"{error} (start them: skewer services up --redis-sentinel)"
        ) from None
    except UnknownServiceError as error:
        raise KafkaIOError(str(error)) from None
    except NoPrimaryError:  # a failover in progress
        return

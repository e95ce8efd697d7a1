"""The services a run needs, Kafka and Redis: answering, or started natively for the run.

Layer: runs.

:func:`ensure_services` is what ``skewer demo`` does before a run: a service that does not
answer on a loopback address is started (under a lease that stops it again at the end, unless
someone else uses it); anything else that does not answer is the user's to start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.io import config, kafka_io, kafka_security, probes, redis_client
from pipeline.io.redis_client import connect_redis
from pipeline.runs.orchestrator import PipelineError
from pipeline.services import manager, native

#: The services a run needs (Prometheus is not on the data path).
RUN_SERVICES = ("kafka", "redis")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass
class ServiceLease:
    """The services a run made sure of; :meth:`release` stops the ones it had to start."""

    settings: config.Settings
    leased: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)

    def release(self) -> None:
        if self.leased:
            manager.release(self.settings, self.leased)
            self.leased = []


def ensure_services(settings: config.Settings, *, start: bool, keep: bool = False) -> ServiceLease:
    """Kafka and Redis answering, natively started if needed (and allowed); else PipelineError.

    Services are only started for loopback addresses (a remote broker is not ours to start),
    and Kafka only for a bootstrap list of one address (a cluster is not ours either).
    Started ones are held by a lease (:func:`pipeline.services.manager.acquire`): the lease's
    release stops them unless someone else (``skewer services up``, a test session) holds them.
    With ``keep`` they are started like ``skewer services up`` and keep running.
    """
    lease = ServiceLease(settings)
    sentinel = redis_client.is_sentinel_url(settings.redis_url)
    if sentinel:
        # Sentinel is never started for a run: before anything starts, its sentinels name a
        # primary, or the run stops (none answers: exit 1; none names a primary: exit 2).
        connect_redis(settings.redis_url).close()
    kafka_host = settings.kafka_host if len(settings.kafka_hosts) == 1 else "(a cluster)"
    redis_host = "(sentinel)" if sentinel else settings.redis_host
    where = {
        "kafka": (kafka_host, settings.kafka_bootstrap, probes.kafka_answers),
        "redis": (redis_host, settings.redis_url, probes.redis_answers),
    }
    down = [name for name in RUN_SERVICES if not where[name][2](where[name][1], timeout=5.0)]
    # Skewer's own broker and Redis speak plaintext, so starting one cannot help a client that
    # asks for TLS or a login: say why the service it asks does not answer (a login refused, a
    # certificate not trusted ...).
    if "kafka" in down and not kafka_security.from_environ().plaintext:
        kafka_io.require_kafka(settings.kafka_bootstrap)
        down.remove("kafka")
    if "redis" in down and settings.redis_url.startswith("rediss://"):
        connect_redis(settings.redis_url).close()
        down.remove("redis")
    if not down:
        return lease
    for name in down:
        host, address, _ = where[name]
        if not start or host not in LOOPBACK_HOSTS:
            why = "" if start else " (--no-start)"
            raise PipelineError(
                f"{name} does not answer at {address}{why}; start it: skewer services up"
            )
    try:
        if keep:
            states = manager.up(settings, down)
        else:
            states = manager.acquire(settings, down)
            lease.leased = list(down)
    except native.ServiceError as error:
        raise PipelineError(str(error)) from None
    lease.started = [s.name for s in states if s.state == "started"]
    return lease

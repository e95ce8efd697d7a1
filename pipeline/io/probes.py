"""Health probes: does the Kafka, Redis, Prometheus, Spark master or Docker engine at an address
answer? (layer: io)

The native services' health checks, the test fixtures (against native services and
containers alike) and the stages' start-up checks all ask these. Each probe returns a bool
within its timeout and never raises: a refused connection answers at once.

Example:
    >>> accepts_connections("127.0.0.1:1", timeout=0.2)
    False
    >>> kafka_answers("127.0.0.1:1", timeout=0.2), redis_answers("redis://127.0.0.1:1/0", 0.2)
    (False, False)
    >>> docker_answers("/nonexistent/docker.sock", timeout=0.2)
    False
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pipeline.io.kafka_security import KafkaSecurity, admin_config


def accepts_connections(address: str, timeout: float) -> bool:
    host, _, port = address.strip().rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


#: :func:`kafka_refusal`'s reason when no address of the bootstrap list takes a connection.
CONNECTION_REFUSED = "connection refused"


def kafka_answers(
    bootstrap: str, timeout: float = 2.0, security: KafkaSecurity | None = None
) -> bool:
    """A metadata request to ``bootstrap`` returns at least one broker within ``timeout``
    (through ``security``, by default the environment's: :mod:`pipeline.io.kafka_security`)."""
    return kafka_refusal(bootstrap, timeout, security) is None


def kafka_refusal(
    bootstrap: str, timeout: float = 2.0, security: KafkaSecurity | None = None
) -> str | None:
    """Why a metadata request to ``bootstrap`` returns no broker within ``timeout``, in a few
    words (the client's last error: a login refused, a certificate not trusted ...); None when
    one answers."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    # A refused connection is an answer at once; librdkafka would retry until the timeout.
    if not any(accepts_connections(address, timeout) for address in bootstrap.split(",")):
        return CONNECTION_REFUSED
    errors: list[KafkaError] = []
    admin = AdminClient({**admin_config(bootstrap, security), "error_cb": errors.append})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as error:
        admin.poll(0)  # serves the error callbacks queued meanwhile
        # "N/N brokers are down" says nothing of why; an error before it may (a login refused).
        causes = [e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
        return (causes or errors or [error.args[0]])[-1].str()
    return None if metadata.brokers else "it names no broker"


def redis_answers(url: str, timeout: float = 2.0) -> bool:
    """PING answered; for a ``redis+sentinel://`` URL, by the primary the sentinels name."""
    import redis

    from pipeline.io.redis_client import client_from_url

    try:
        client = client_from_url(
            url,
            sentinel_timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
    except ValueError:  # a malformed URL answers nothing; connect_redis says why
        return False
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def redis_replica_synced(url: str, timeout: float = 2.0) -> bool:
    """The Redis at ``url`` answers and is a replica whose link to its primary is up (past
    its first sync), or a primary."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        info = client.info("replication")
    except redis.RedisError:
        return False
    finally:
        client.close()
    return info.get("role") == "master" or info.get("master_link_status") == "up"


def prometheus_answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def spark_status(web_url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """A Spark standalone daemon's state from its web UI's ``/json/`` (a master's: ``status``,
    ``workers`` with their ``webuiaddress``, ``state`` and ``cores``), None when it does not
    answer."""
    try:
        with urllib.request.urlopen(f"{web_url}/json/", timeout=timeout) as response:
            status = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def docker_answers(socket_path: Path | str, timeout: float = 2.0) -> bool:
    """A Docker engine on the unix socket ``socket_path`` answers ``GET /_ping`` with 200 OK.

    Plain HTTP/1.0 on the socket rather than Docker's SDK: the probe runs before anything is
    installed (``skewer services up --docker`` asks it whether an engine answers already), and
    HTTP/1.0 makes the engine close the connection after its reply, so reading to the end is
    reading the reply.
    """
    reply = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(str(socket_path))
            connection.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            while chunk := connection.recv(4096):
                reply += chunk
                if len(reply) > 65536:  # not an engine: /_ping's reply is a few hundred bytes
                    return False
    except OSError:
        return False
    status = reply.split(b"\r\n", 1)[0].split()
    return len(status) >= 2 and status[1] == b"200" and reply.endswith(b"\r\n\r\nOK")


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (of a text of BMP characters), as a signed 32-bit int.

    >>> java_string_hash("hello"), java_string_hash("skewer-source-0") < 0
    (99162322, False)
    """
    value = 0
    for character in text:
        value = (31 * value + ord(character)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def transaction_coordinator(bootstrap: str, transactional_id: str) -> int:
    """The node id that coordinates ``transactional_id``: the leader of its partition of
    ``__transaction_state``, ``abs(hashCode) % partitions`` (Kafka's
    TransactionStateManager.partitionFor, where abs clears the sign bit)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(bootstrap))
    topic = admin.list_topics(topic="__transaction_state", timeout=10).topics["__transaction_state"]
    partition = (java_string_hash(transactional_id) & 0x7FFFFFFF) % len(topic.partitions)
    return topic.partitions[partition].leader

"""skewer on services that ask for TLS and a login: Kafka over SASL_SSL
(pipeline.io.kafka_security) and Redis over TLS (``rediss://``).

The module runs a Kafka broker and a Redis of its own, with a CA made here
(tests/certificates.py): the broker (the native service's jars) has one client listener,
``SASL_SSL``, with PLAIN (users in its JAAS line) and SCRAM-SHA-512 (a user created through the
admin API), inter-broker and controller traffic on plaintext listeners no client is pointed
at; Redis (Debian's ``redis-server``, built with TLS) listens on a TLS port only, with a
password. What is checked (docs/security.md):

- the demo through SCRAM-SHA-512, the CA file and ``rediss://...?ssl_ca_certs=``, every stage
  included (Spark's Kafka source through the Java client's JAAS line and PEM trust store):
  every (key, window) count exact, the Kafka password in no stage's log;
- test_end_to_end's fault test (kill -9 of the grouping stage and the Spark job) on them: exact;
- a topic of one's own, grouped by the demo and recounted by Spark's batch Kafka source: exact;
- a wrong password, a CA that did not sign the broker's certificate, plaintext against the TLS
  listener, and an untrusted Redis certificate: each one line and exit 1 from
  ``skewer produce``, saying which protocol and why (settings that cannot work at all:
  tests/unit/test_kafka_security_settings.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from certificates import KEYSTORE_PASSWORD, ServerCertificates, write_server_certificates
from live_runs import free_ports, kill_group_and_work_mid_run, skewer

from pipeline.io import config, kafka_io, kafka_security, probes
from pipeline.runs.plan import new_run_id
from pipeline.services import process
from pipeline.services.kafka_broker import KafkaService

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("runs a Kafka broker and a Redis of its own, with TLS"),
]

SCRAM_USER, SCRAM_PASSWORD = "skewer", 'scram "pass" \\ word'
PLAIN_USER, PLAIN_PASSWORD = "plain-user", "plain-password"
REDIS_PASSWORD = "redis-password"


class SaslSslBroker(KafkaService):
    """The native broker with its client listener on SASL_SSL, plus a plaintext listener of its
    own for inter-broker traffic (and for this module's setup: the SCRAM user)."""

    name = "kafka-sasl-ssl"

    def __init__(self, settings: config.Settings, internal_port: int, keystore: Path) -> None:
        super().__init__(settings)
        self.internal_address = f"127.0.0.1:{internal_port}"
        self.keystore = keystore

    def server_properties(self) -> str:
        plain_users = f'user_{PLAIN_USER}="{PLAIN_PASSWORD}"'
        # Later keys win in a Java properties file: these replace the template's listeners.
        return super().server_properties() + "\n".join(
            [
                "",
                f"listeners=SASL_SSL://{self.address},CONTROLLER://{self.controller_address},"
                f"INTERNAL://{self.internal_address}",
                f"advertised.listeners=SASL_SSL://{self.address},INTERNAL://{self.internal_address}",
                "inter.broker.listener.name=INTERNAL",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,"
                "SASL_SSL:SASL_SSL",
                "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
                "listener.name.sasl_ssl.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "ssl.keystore.type=PKCS12",
                f"ssl.keystore.location={self.keystore}",
                f"ssl.keystore.password={KEYSTORE_PASSWORD}",
                f"ssl.key.password={KEYSTORE_PASSWORD}",
                "",
            ]
        )


def add_scram_user(internal_bootstrap: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": internal_bootstrap, "log_level": 0})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    upsert = UserScramCredentialUpsertion(SCRAM_USER, info, SCRAM_PASSWORD.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)


def redis_tls_command(port: int, files: ServerCertificates, folder: Path) -> list[str]:
    """Debian's redis-server on a TLS port only, with a password and no persistence."""
    return [
        "redis-server",
        "--bind", "127.0.0.1",
        "--port", "0",
        "--tls-port", str(port),
        "--tls-cert-file", str(files.certificate),
        "--tls-key-file", str(files.key),
        "--tls-ca-cert-file", str(files.ca),
        "--tls-auth-clients", "no",
        "--requirepass", REDIS_PASSWORD,
        "--save", "",
        "--appendonly", "no",
        "--dir", str(folder),
    ]  # fmt: skip


def rediss_url(port: int, ca: Path) -> str:
    return f"rediss://:{REDIS_PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={quote(str(ca))}"


@dataclass(frozen=True)
class SecuredServices:
    environ: dict[str, str]  # skewer's: SCRAM-SHA-512 over TLS to Kafka, rediss:// to Redis
    bootstrap: str
    redis_port: int
    run_dir: Path
    certificates: ServerCertificates


def wait_until(answers: Callable[[], bool], log: Path, timeout: float) -> None:
    """Until ``answers()``; a failure shows the end of the service's ``log``."""
    deadline = time.monotonic() + timeout
    while not answers():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredServices]:
    folder = tmp_path_factory.mktemp("secured-services")
    files = write_server_certificates(folder)
    base = free_ports(4)
    redis_port = base + 3
    environ = {
        **os.environ,
        config.ENV_REDIS_URL: rediss_url(redis_port, files.ca),
        config.ENV_RUN_DIR: str(folder / "run"),
        config.ENV_KAFKA_BOOTSTRAP: f"127.0.0.1:{base}",
        config.ENV_KAFKA_CONTROLLER: f"127.0.0.1:{base + 1}",
    }
    broker = SaslSslBroker(config.load(environ), base + 2, files.keystore)
    broker.install()
    broker.prepare()
    records = []
    try:
        records.append(
            process.spawn(
                broker.name, broker.command(), log_path=broker.log_path, cwd=broker.data_dir
            )
        )
        redis_log = folder / "redis-tls.log"
        command = redis_tls_command(redis_port, files, folder)
        records.append(process.spawn("redis-tls", command, log_path=redis_log, cwd=folder))
        assert None not in records, broker.log_path.read_text()[-2000:] + redis_log.read_text()
        plaintext = kafka_security.KafkaSecurity()
        wait_until(
            lambda: probes.kafka_answers(broker.internal_address, 1.0, plaintext),
            broker.log_path,
            broker.start_timeout,
        )
        wait_until(lambda: probes.redis_answers(environ[config.ENV_REDIS_URL]), redis_log, 30)
        add_scram_user(broker.internal_address)
        logins = {
            kafka_security.ENV_SECURITY_PROTOCOL: "SASL_SSL",
            kafka_security.ENV_SASL_MECHANISM: "SCRAM-SHA-512",
            kafka_security.ENV_SASL_USERNAME: SCRAM_USER,
            kafka_security.ENV_SASL_PASSWORD: SCRAM_PASSWORD,
            kafka_security.ENV_SSL_CA_LOCATION: str(files.ca),
        }
        yield SecuredServices(
            {**environ, **logins}, broker.address, redis_port, broker.settings.run_dir, files
        )
    finally:
        process.terminate_all([r for r in records if r is not None], broker.stop_timeout)


def test_the_demo_in_real_time_mode_is_exact_over_tls_and_logins(
    secured: SecuredServices,
) -> None:
    """The whole pipeline through SCRAM-SHA-512 over TLS and Redis over TLS, skewer's producers
    writing, the workers in Spark's Real-Time Mode: exact, and the Kafka password in no log.
    The writer in Spark's JVM reaches Redis over TLS with the URL's CA file (``ssl_ca_certs``).
    (The micro-batch workers over TLS: the two tests below.)"""
    trigger = config.REAL_TIME
    run_id = f"tls-{new_run_id()[5:]}"
    demo = skewer(
        secured.environ,
        "demo", "--scheme", "pkg", "--records", "20000", "--workers", "4",
        "--run-id", run_id, "--keep", "--verify", "--json", "--trigger", trigger,
        timeout=600,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    report = json.loads(demo.stdout)
    assert report["exact"] is True
    assert report["records_produced"] == report["records_processed"] == 20_000
    # Spark redacts the JAAS line; librdkafka never logs a password.
    logs = sorted((secured.run_dir / "demo" / run_id).iterdir())
    assert {log.name for log in logs} >= {"group.err", "work.err", "aggregate.err"}
    for log in logs:
        assert SCRAM_PASSWORD not in log.read_text(errors="replace"), log.name


def test_kill_9_of_the_grouping_stage_and_of_the_spark_job_over_tls_keeps_counts_exact(
    secured: SecuredServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """test_end_to_end's fault test on the secured services: ``kill -9`` of ``skewer group`` a
    quarter through and of ``skewer work`` half way, both restarted
    (:func:`live_runs.kill_group_and_work_mid_run`). A restarted source logs in again and
    fences its predecessor's transaction over SASL_SSL; a restarted job reads its checkpoint's
    offsets over it. Exact."""
    for name, value in secured.environ.items():
        if name.startswith("SKEWER_KAFKA_"):  # the run's clients in this process: progress
            monkeypatch.setenv(name, value)
    run_id = f"tls-faults-{new_run_id()[5:]}"
    kill_group_and_work_mid_run(config.load(secured.environ), run_id, 40_000)


def test_a_topic_of_ones_own_is_exact_against_sparks_recount(
    secured: SecuredServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic written here, through this process's clients with the same settings, grouped
    by the demo and recounted by a Spark batch query over SASL_SSL (``--verify``)."""
    for name, value in secured.environ.items():
        if name.startswith("SKEWER_KAFKA_"):
            monkeypatch.setenv(name, value)
    topic = f"clicks-{new_run_id()[5:]}"
    assert kafka_io.ensure_topic(secured.bootstrap, topic, 2, replication=1)
    from confluent_kafka import Producer

    producer = Producer(kafka_io.producer_config(secured.bootstrap))
    start_ms = int(time.time() * 1000) - 60_000
    records = 12_000
    for i in range(records):
        key = f"page-{(i * i) % 97 if i % 3 else 0}".encode()
        producer.produce(topic, b"", key, partition=i % 2, timestamp=start_ms + 2 * i)
        if i % 2_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    done = skewer(
        secured.environ,
        "demo", "--input-topic", topic, "--run-id", f"tls-own-{new_run_id()[5:]}",
        "--verify", "--json",
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["exact"] is True
    assert report["records_processed"] == records


def test_a_plain_login_over_tls_answers(secured: SecuredServices) -> None:
    plain = {
        **secured.environ,
        kafka_security.ENV_SASL_MECHANISM: "PLAIN",
        kafka_security.ENV_SASL_USERNAME: PLAIN_USER,
        kafka_security.ENV_SASL_PASSWORD: PLAIN_PASSWORD,
    }
    security = kafka_security.from_environ(plain)
    assert probes.kafka_refusal(secured.bootstrap, 10.0, security) is None


PLAINTEXT = {
    kafka_security.ENV_SECURITY_PROTOCOL: "PLAINTEXT",
    kafka_security.ENV_SASL_MECHANISM: "",
    kafka_security.ENV_SASL_USERNAME: "",
    kafka_security.ENV_SASL_PASSWORD: "",
    kafka_security.ENV_SSL_CA_LOCATION: "",
}


@pytest.mark.parametrize(
    ("refusal", "expected"),
    [
        ("wrong-password", "kafka does not answer at {kafka} over SASL_SSL: "),
        ("untrusted-certificate", "kafka does not answer at {kafka} over SASL_SSL: "),
        ("plaintext", "kafka does not answer at {kafka} over PLAINTEXT ("),
        ("untrusted-redis", "redis does not answer at {redis} over TLS: "),
    ],
)
def test_a_refused_connection_is_one_line_and_exit_1(
    secured: SecuredServices, refusal: str, expected: str
) -> None:
    other_ca = str(secured.certificates.other_ca)
    changes, reason = {
        "wrong-password": ({kafka_security.ENV_SASL_PASSWORD: "wrong"}, "Authentication failed"),
        "untrusted-certificate": (
            {kafka_security.ENV_SSL_CA_LOCATION: other_ca},
            "certificate verify failed",
        ),
        "plaintext": (
            PLAINTEXT,
            "; if it asks for TLS or a login, set SKEWER_KAFKA_SECURITY_PROTOCOL",
        ),
        "untrusted-redis": (
            {config.ENV_REDIS_URL: rediss_url(secured.redis_port, Path(other_ca))},
            "certificate verify failed",
        ),
    }[refusal]
    environ = {**secured.environ, **changes}
    done = skewer(environ, "produce", "--records", "10", "--run-id", "refused", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    redis = rediss_url(secured.redis_port, Path(other_ca)).replace(REDIS_PASSWORD, "***")
    prefix = "skewer produce: error: " + expected.format(kafka=secured.bootstrap, redis=redis)
    assert line.startswith(prefix), line
    assert reason in line, line

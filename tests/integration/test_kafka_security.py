"""skewer on a Kafka cluster that demands a login over TLS (pipeline.io.kafka_security).

The module runs a broker of its own, Apache Kafka's jars as the native service runs them, whose
only client listener is ``SASL_SSL``: a certificate signed by a CA made here for 127.0.0.1, and
two SASL mechanisms, PLAIN (users in the broker's JAAS line) and SCRAM-SHA-512 (a user created
through the admin API). Inter-broker and controller traffic stay on plaintext listeners of their
own, which no skewer client is pointed at.

- The demo runs on it through SCRAM-SHA-512 and the CA file: producers, the grouping stage's
  transactions, Spark's Kafka source in the worker job (the Java client's JAAS line and PEM
  trust store), the aggregator and the metrics consumers. Every (key, window) count is exact,
  and the password is in no stage's log.
- A topic of one's own, written here through the same settings, is grouped by the demo and
  recounted by Spark's batch Kafka source (``--verify``): exact.
- A wrong password, a CA that did not sign the broker's certificate, and plaintext against the
  TLS listener are each one line and exit 1 from ``skewer produce``, saying which protocol and
  why. (Settings that cannot work at all are refused before anything connects:
  tests/unit/test_kafka_security_settings.py.)
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from live_runs import free_ports

from pipeline.io import config, kafka_io, kafka_security, probes
from pipeline.runs.plan import new_run_id
from pipeline.services import process
from pipeline.services.kafka_broker import KafkaService

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.native_only("runs a native Kafka broker of its own with a SASL_SSL listener"),
]

SCRAM_USER, SCRAM_PASSWORD = "skewer", 'scram "pass" \\ word'
PLAIN_USER, PLAIN_PASSWORD = "plain-user", "plain-password"
KEYSTORE_PASSWORD = "keystore-password"


def certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None = None,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
) -> x509.Certificate:
    """A day's certificate: a CA's when self-signed (no ``issuer``), else a server's for
    127.0.0.1 and localhost, signed by ``issuer``."""
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    signer = key if issuer_key is None else issuer_key
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name if issuer is None else issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
        )
    )
    if issuer is None:
        usage = x509.KeyUsage(True, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    else:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def write_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, the broker's certificate signed by it (in a PKCS#12 key store, as the broker reads
    it), and a second CA that signed nothing: (ca.pem, broker.p12, other-ca.pem)."""
    ca_key, other_key, broker_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = certificate("skewer test CA", ca_key)
    broker = certificate("127.0.0.1", broker_key, ca, ca_key)
    paths = folder / "ca.pem", folder / "broker.p12", folder / "other-ca.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker",
            broker_key,
            broker,
            [ca],
            serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode()),
        )
    )
    other_ca = certificate("another CA", other_key)
    paths[2].write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
    return paths


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


@dataclass(frozen=True)
class SecuredKafka:
    environ: dict[str, str]  # skewer's environment for this broker: SCRAM-SHA-512 over TLS
    bootstrap: str
    run_dir: Path
    other_ca_file: Path


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


@pytest.fixture(scope="module")
def secured_kafka(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecuredKafka]:
    folder = tmp_path_factory.mktemp("kafka-security")
    ca_file, keystore, other_ca_file = write_certificates(folder)
    base = free_ports(3)
    environ = {
        **os.environ,
        config.ENV_REDIS_URL: redis_url,
        config.ENV_RUN_DIR: str(folder / "run"),
        config.ENV_KAFKA_BOOTSTRAP: f"127.0.0.1:{base}",
        config.ENV_KAFKA_CONTROLLER: f"127.0.0.1:{base + 1}",
    }
    broker = SaslSslBroker(config.load(environ), base + 2, keystore)
    broker.install()
    broker.prepare()
    record = process.spawn(
        broker.name, broker.command(), log_path=broker.log_path, cwd=broker.data_dir
    )
    assert record is not None, broker.log_path.read_text()[-2000:]
    try:
        deadline = time.monotonic() + broker.start_timeout
        plaintext = kafka_security.KafkaSecurity()
        while not probes.kafka_answers(broker.internal_address, 1.0, plaintext):
            assert time.monotonic() < deadline, broker.log_path.read_text()[-2000:]
            time.sleep(0.5)
        add_scram_user(broker.internal_address)
        secured = {
            kafka_security.ENV_SECURITY_PROTOCOL: "SASL_SSL",
            kafka_security.ENV_SASL_MECHANISM: "SCRAM-SHA-512",
            kafka_security.ENV_SASL_USERNAME: SCRAM_USER,
            kafka_security.ENV_SASL_PASSWORD: SCRAM_PASSWORD,
            kafka_security.ENV_SSL_CA_LOCATION: str(ca_file),
        }
        yield SecuredKafka(
            {**environ, **secured}, broker.address, broker.settings.run_dir, other_ca_file
        )
    finally:
        process.terminate(record, grace_seconds=broker.stop_timeout)


def skewer(environ: dict[str, str], *argv: str, timeout: float) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pipeline.cli", *argv]
    return subprocess.run(
        command, env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_demo_is_exact_over_scram_and_tls(secured_kafka: SecuredKafka) -> None:
    """The whole pipeline through SCRAM-SHA-512 over TLS, skewer's producers writing: exact,
    and the password in no log."""
    run_id = f"sasl-{new_run_id()[5:]}"
    environ = secured_kafka.environ
    demo = skewer(
        environ,
        "demo",
        "--scheme",
        "pkg",
        "--records",
        "20000",
        "--workers",
        "4",
        "--run-id",
        run_id,
        "--keep",
        "--verify",
        "--json",
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr
    report = json.loads(demo.stdout)
    assert report["exact"] is True
    assert report["records_produced"] == report["records_processed"] == 20_000
    # The password is in no stage's log (Spark redacts the JAAS line; librdkafka never logs it).
    logs = sorted((secured_kafka.run_dir / "demo" / run_id).iterdir())
    assert {log.name for log in logs} >= {"group.err", "work.err", "aggregate.err"}
    for log in logs:
        assert SCRAM_PASSWORD not in log.read_text(errors="replace"), log.name


def test_a_topic_of_ones_own_is_exact_against_sparks_recount(
    secured_kafka: SecuredKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic written here, through this process's clients with the same settings, grouped
    by the demo and recounted by a Spark batch query over SASL_SSL (``--verify``)."""
    for name, value in secured_kafka.environ.items():
        if name.startswith("SKEWER_KAFKA_"):
            monkeypatch.setenv(name, value)
    topic = f"clicks-{new_run_id()[5:]}"
    assert kafka_io.ensure_topic(secured_kafka.bootstrap, topic, 2, replication=1)
    from confluent_kafka import Producer

    producer = Producer(kafka_io.producer_config(secured_kafka.bootstrap))
    start_ms = int(time.time() * 1000) - 60_000
    records = 12_000
    for i in range(records):
        key = f"page-{(i * i) % 97 if i % 3 else 0}".encode()
        producer.produce(topic, b"", key, partition=i % 2, timestamp=start_ms + 2 * i)
        if i % 2_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    done = skewer(
        secured_kafka.environ,
        "demo",
        "--input-topic",
        topic,
        "--run-id",
        f"sasl-own-{new_run_id()[5:]}",
        "--verify",
        "--json",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["exact"] is True
    assert report["records_processed"] == records


def test_plain_login_over_tls_answers(secured_kafka: SecuredKafka) -> None:
    plain = {
        **secured_kafka.environ,
        kafka_security.ENV_SASL_MECHANISM: "PLAIN",
        kafka_security.ENV_SASL_USERNAME: PLAIN_USER,
        kafka_security.ENV_SASL_PASSWORD: PLAIN_PASSWORD,
    }
    security = kafka_security.from_environ(plain)
    assert probes.kafka_refusal(secured_kafka.bootstrap, 10.0, security) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({kafka_security.ENV_SASL_PASSWORD: "wrong"}, "Authentication failed"),
        ("other CA", "certificate verify failed"),
        (
            {
                kafka_security.ENV_SECURITY_PROTOCOL: "PLAINTEXT",
                kafka_security.ENV_SASL_MECHANISM: "",
                kafka_security.ENV_SASL_USERNAME: "",
                kafka_security.ENV_SASL_PASSWORD: "",
                kafka_security.ENV_SSL_CA_LOCATION: "",
            },
            "",
        ),
    ],
    ids=["wrong-password", "untrusted-certificate", "plaintext"],
)
def test_a_refused_connection_is_one_line_and_exit_1(
    secured_kafka: SecuredKafka, change: dict[str, str] | str, reason: str
) -> None:
    if change == "other CA":
        change = {kafka_security.ENV_SSL_CA_LOCATION: str(secured_kafka.other_ca_file)}
    environ = {**secured_kafka.environ, **change}
    done = skewer(environ, "produce", "--records", "10", "--run-id", "refused", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    protocol = environ[kafka_security.ENV_SECURITY_PROTOCOL]
    if protocol == "PLAINTEXT":
        assert line.startswith(
            f"skewer produce: error: kafka does not answer at {secured_kafka.bootstrap}"
        )
    else:
        assert line.startswith(
            f"skewer produce: error: kafka does not answer at {secured_kafka.bootstrap} over "
            f"{protocol}: "
        )
        assert reason in line

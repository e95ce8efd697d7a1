"""The Kafka clients' security settings (pipeline.io.kafka_security): what each client is
given, settings that cannot work refused by :func:`from_environ` with one line, and every
command turning that line into exit 2 before anything connects. The clients on a broker that
demands them: tests/integration/test_secured_services.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import app
from pipeline.io import config, kafka_io, kafka_security
from pipeline.io.kafka_security import (
    ENV_SASL_MECHANISM,
    ENV_SASL_PASSWORD,
    ENV_SASL_USERNAME,
    ENV_SECURITY_PROTOCOL,
    ENV_SSL_CA_LOCATION,
)

SCRAM_OVER_TLS = {
    ENV_SECURITY_PROTOCOL: "SASL_SSL",
    ENV_SASL_MECHANISM: "SCRAM-SHA-256",
    ENV_SASL_USERNAME: "skewer",
    ENV_SASL_PASSWORD: "secret",
}


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_plaintext_changes_no_client_configuration() -> None:
    plaintext = kafka_security.from_environ({})
    assert plaintext == kafka_security.KafkaSecurity() and plaintext.plaintext
    assert plaintext.client_config() == plaintext.spark_options() == {}
    assert plaintext.environ() == {ENV_SECURITY_PROTOCOL: "PLAINTEXT"}


def test_each_client_gets_its_own_spelling(ca_file: Path) -> None:
    security = kafka_security.from_environ({**SCRAM_OVER_TLS, ENV_SSL_CA_LOCATION: str(ca_file)})
    assert not security.plaintext and security.uses_sasl and security.uses_tls
    assert security.client_config() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "skewer",
        "sasl.password": "secret",
        "ssl.ca.location": str(ca_file),
    }
    assert security.spark_options() == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="skewer" password="secret";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(ca_file),
    }
    plain = kafka_security.from_environ({**SCRAM_OVER_TLS, ENV_SASL_MECHANISM: "plain"})
    assert plain.spark_options()["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
    )


def test_the_settings_survive_a_round_trip_through_the_environment(ca_file: Path) -> None:
    environ = {**SCRAM_OVER_TLS, ENV_SSL_CA_LOCATION: str(ca_file)}
    settings = config.load(environ)
    assert settings.kafka_security == kafka_security.from_environ(environ)
    assert config.load(settings.environ()) == settings


def test_a_relative_ca_file_is_made_absolute(
    ca_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ca_file.parent)
    security = kafka_security.from_environ(
        {ENV_SECURITY_PROTOCOL: "ssl", ENV_SSL_CA_LOCATION: "ca.pem"}
    )
    assert security.ssl_ca_location == str(ca_file.resolve())


def test_every_client_builder_carries_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SCRAM_OVER_TLS.items():
        monkeypatch.setenv(name, value)
    expected = kafka_security.from_environ().client_config()
    for built in (
        kafka_io.producer_config("h:1"),
        kafka_io.transactional_producer_config("h:1", "t"),
        kafka_io.consumer_config("h:1", "g"),
        kafka_security.admin_config("h:1"),
    ):
        assert expected.items() <= built.items()
    plaintext = kafka_security.KafkaSecurity()
    assert "security.protocol" not in kafka_security.admin_config("h:1", plaintext)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {ENV_SECURITY_PROTOCOL: "SASL_TLS"},
            "SKEWER_KAFKA_SECURITY_PROTOCOL='SASL_TLS' is not one of PLAINTEXT, SSL, "
            "SASL_PLAINTEXT, SASL_SSL",
        ),
        (
            {**SCRAM_OVER_TLS, ENV_SASL_MECHANISM: ""},
            "SKEWER_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs SKEWER_KAFKA_SASL_MECHANISM (PLAIN, "
            "SCRAM-SHA-256, SCRAM-SHA-512)",
        ),
        (
            {**SCRAM_OVER_TLS, ENV_SASL_MECHANISM: "GSSAPI"},
            "SKEWER_KAFKA_SASL_MECHANISM='GSSAPI' is not one of PLAIN, SCRAM-SHA-256, "
            "SCRAM-SHA-512 (GSSAPI and OAUTHBEARER are not offered)",
        ),
        (
            {**SCRAM_OVER_TLS, ENV_SASL_PASSWORD: ""},
            "SKEWER_KAFKA_SECURITY_PROTOCOL=SASL_SSL needs SKEWER_KAFKA_SASL_PASSWORD",
        ),
        (
            {ENV_SASL_USERNAME: "skewer", ENV_SASL_PASSWORD: "secret"},
            "SKEWER_KAFKA_SASL_USERNAME is set, but SKEWER_KAFKA_SECURITY_PROTOCOL=PLAINTEXT "
            "sends no credentials (SASL_PLAINTEXT or SASL_SSL does)",
        ),
        (
            {**SCRAM_OVER_TLS, ENV_SECURITY_PROTOCOL: "SASL_PLAINTEXT", ENV_SSL_CA_LOCATION: "/x"},
            "SKEWER_KAFKA_SSL_CA_LOCATION is set, but SKEWER_KAFKA_SECURITY_PROTOCOL="
            "SASL_PLAINTEXT does not use TLS (SSL or SASL_SSL does)",
        ),
        (
            {**SCRAM_OVER_TLS, ENV_SSL_CA_LOCATION: "/nonexistent/ca.pem"},
            "SKEWER_KAFKA_SSL_CA_LOCATION='/nonexistent/ca.pem' is not a readable file",
        ),
    ],
    ids=[
        "protocol",
        "no-mechanism",
        "mechanism",
        "password",
        "login-without-sasl",
        "ca-without-tls",
        "ca-file",
    ],
)
def test_settings_that_cannot_work_are_refused_with_one_line(
    variables: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        kafka_security.from_environ(variables)
    assert str(refused.value) == message


@pytest.mark.parametrize("command", [["demo", "--records", "10"], ["services", "up"]])
def test_a_command_refuses_them_with_exit_2_before_anything_connects(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (*SCRAM_OVER_TLS, ENV_SSL_CA_LOCATION):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV_SASL_USERNAME, "skewer")
    assert app.main(command) == 2
    assert capsys.readouterr().err == (
        f"skewer {command[0]}: error: SKEWER_KAFKA_SASL_USERNAME is set, but "
        "SKEWER_KAFKA_SECURITY_PROTOCOL=PLAINTEXT sends no credentials (SASL_PLAINTEXT or "
        "SASL_SSL does)\n"
    )

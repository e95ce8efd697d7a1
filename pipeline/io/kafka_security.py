"""How skewer's Kafka clients authenticate and encrypt: SASL (PLAIN, SCRAM) and TLS.

Layer: io.

Five variables, read by every Kafka client skewer makes (librdkafka's through confluent-kafka,
and the Java client of Spark's Kafka source): ``SKEWER_KAFKA_SECURITY_PROTOCOL`` (``PLAINTEXT``,
the default, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``), ``SKEWER_KAFKA_SASL_MECHANISM``
(``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``), ``SKEWER_KAFKA_SASL_USERNAME``,
``SKEWER_KAFKA_SASL_PASSWORD`` and ``SKEWER_KAFKA_SSL_CA_LOCATION`` (a PEM file of the CAs to
trust). Settings that cannot work are refused with one line naming the variable
(:func:`from_environ`). How to use them: docs/security.md.

Example:
    >>> security = from_environ({
    ...     "SKEWER_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
    ...     "SKEWER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    ...     "SKEWER_KAFKA_SASL_USERNAME": "skewer",
    ...     "SKEWER_KAFKA_SASL_PASSWORD": 'pa"ss',
    ... })
    >>> security.protocol, security.plaintext, 'pa"ss' in repr(security)
    ('SASL_PLAINTEXT', False, False)
    >>> sorted(security.client_config())
    ['sasl.mechanism', 'sasl.password', 'sasl.username', 'security.protocol']
    >>> from_environ({}).plaintext, from_environ({}).client_config()
    (True, {})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_SECURITY_PROTOCOL = "SKEWER_KAFKA_SECURITY_PROTOCOL"
ENV_SASL_MECHANISM = "SKEWER_KAFKA_SASL_MECHANISM"
ENV_SASL_USERNAME = "SKEWER_KAFKA_SASL_USERNAME"
ENV_SASL_PASSWORD = "SKEWER_KAFKA_SASL_PASSWORD"
ENV_SSL_CA_LOCATION = "SKEWER_KAFKA_SSL_CA_LOCATION"

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: The Java client's login module of each mechanism skewer offers.
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class KafkaSecurity:
    """The security settings of skewer's Kafka clients; the default is plaintext, no SASL.

    The two clients spell the same settings differently, so this writes each client's own:
    librdkafka takes ``sasl.username``/``sasl.password`` and ``ssl.ca.location``; the Java
    client takes a JAAS line (``sasl.jaas.config``: the mechanism's login module, the user and
    password quoted as Kafka's JAAS parser reads them) and a PEM trust store. Both check the
    broker's host name against its certificate (their default).
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_ca_location: str = ""

    @property
    def plaintext(self) -> bool:
        """No TLS and no login: what skewer's own broker speaks."""
        return self.protocol == "PLAINTEXT"

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def client_config(self) -> dict[str, str]:
        """librdkafka's properties (confluent-kafka's producers, consumers, admin clients);
        empty for plaintext, so a plaintext client's configuration is what it always was."""
        if self.plaintext:
            return {}
        config = {"security.protocol": self.protocol}
        if self.uses_sasl:
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password
        if self.ssl_ca_location:
            config["ssl.ca.location"] = self.ssl_ca_location
        return config

    def spark_options(self) -> dict[str, str]:
        """The Java client's properties as options of Spark's Kafka source (``kafka.``-prefixed;
        the source redacts ``sasl.jaas.config`` when it logs its settings)."""
        if self.plaintext:
            return {}
        options = {"kafka.security.protocol": self.protocol}
        if self.uses_sasl:
            options["kafka.sasl.mechanism"] = self.sasl_mechanism
            options["kafka.sasl.jaas.config"] = (
                f"{LOGIN_MODULES[self.sasl_mechanism]} required "
                f"username={_jaas_quoted(self.sasl_username)} "
                f"password={_jaas_quoted(self.sasl_password)};"
            )
        if self.ssl_ca_location:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = self.ssl_ca_location
        return options

    def environ(self) -> dict[str, str]:
        """These settings as the variables :func:`from_environ` reads (unset ones left out)."""
        values = {
            ENV_SECURITY_PROTOCOL: self.protocol,
            ENV_SASL_MECHANISM: self.sasl_mechanism,
            ENV_SASL_USERNAME: self.sasl_username,
            ENV_SASL_PASSWORD: self.sasl_password,
            ENV_SSL_CA_LOCATION: self.ssl_ca_location,
        }
        return {name: value for name, value in values.items() if value}


def _jaas_quoted(value: str) -> str:
    """``value`` in double quotes, as Kafka's JAAS parser (a StreamTokenizer) reads it back."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def from_environ(environ: Mapping[str, str] | None = None) -> KafkaSecurity:
    """The settings in force (``environ``: default this process's environment).

    A ValueError with one line naming the variable for settings that cannot work: an unknown
    protocol or mechanism, a SASL protocol without its mechanism, user or password, a login or
    CA file given to a protocol that would not use it (a forgotten ``SASL_``), a CA file that is
    not there. GSSAPI (Kerberos) and OAUTHBEARER need more than a user and a password and are
    not offered. On a Spark cluster the executors read the CA file at the same path.

    >>> from_environ({"SKEWER_KAFKA_SASL_USERNAME": "skewer"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: SKEWER_KAFKA_SASL_USERNAME is set, but ...=PLAINTEXT sends no credentials ...
    """
    env = os.environ if environ is None else environ
    protocol = env.get(ENV_SECURITY_PROTOCOL, "").strip().upper() or "PLAINTEXT"
    mechanism = env.get(ENV_SASL_MECHANISM, "").strip().upper()
    username = env.get(ENV_SASL_USERNAME, "")
    password = env.get(ENV_SASL_PASSWORD, "")
    ca_location = env.get(ENV_SSL_CA_LOCATION, "").strip()
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"{ENV_SECURITY_PROTOCOL}={protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    sasl_settings = {
        ENV_SASL_MECHANISM: mechanism,
        ENV_SASL_USERNAME: username,
        ENV_SASL_PASSWORD: password,
    }
    if protocol.startswith("SASL_"):
        if not mechanism:
            raise ValueError(
                f"{ENV_SECURITY_PROTOCOL}={protocol} needs {ENV_SASL_MECHANISM} "
                f"({', '.join(LOGIN_MODULES)})"
            )
        if mechanism not in LOGIN_MODULES:
            raise ValueError(
                f"{ENV_SASL_MECHANISM}={mechanism!r} is not one of {', '.join(LOGIN_MODULES)} "
                "(GSSAPI and OAUTHBEARER are not offered)"
            )
        for name in (ENV_SASL_USERNAME, ENV_SASL_PASSWORD):
            if not sasl_settings[name]:
                raise ValueError(f"{ENV_SECURITY_PROTOCOL}={protocol} needs {name}")
    else:
        for name, value in sasl_settings.items():
            if value:
                raise ValueError(
                    f"{name} is set, but {ENV_SECURITY_PROTOCOL}={protocol} sends no credentials "
                    "(SASL_PLAINTEXT or SASL_SSL does)"
                )
    if ca_location:
        if protocol not in ("SSL", "SASL_SSL"):
            raise ValueError(
                f"{ENV_SSL_CA_LOCATION} is set, but {ENV_SECURITY_PROTOCOL}={protocol} does not "
                "use TLS (SSL or SASL_SSL does)"
            )
        ca_file = Path(ca_location).expanduser().resolve()
        if not ca_file.is_file() or not os.access(ca_file, os.R_OK):
            raise ValueError(f"{ENV_SSL_CA_LOCATION}={ca_location!r} is not a readable file")
        # Absolute, so the Java client in Spark's executors and librdkafka read the same file.
        ca_location = str(ca_file)
    return KafkaSecurity(protocol, mechanism, username, password, ca_location)


def admin_config(bootstrap: str, security: KafkaSecurity | None = None) -> dict[str, Any]:
    """An admin client's configuration: ``security`` (by default the environment's), and log
    level 0, which keeps librdkafka from printing "connection refused" while a broker boots."""
    if security is None:
        security = from_environ()
    return {"bootstrap.servers": bootstrap, "log_level": 0, **security.client_config()}

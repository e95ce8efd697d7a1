"""Apache Kafka as a local process: one KRaft node, broker and controller in one. (layer: services)

Apache's own jars from Maven Central (:func:`pipeline.io.artifacts.ensure_kafka_libs`) run as
``java -cp libs/* kafka.Kafka`` with deploy/kafka/server.properties; the storage is formatted
once with a fixed cluster id, so it stays valid across restarts. Healthy when a metadata
request returns a broker.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from string import Template

from pipeline.io import config
from pipeline.io.artifacts import ArtifactError, ensure_kafka_libs
from pipeline.io.probes import kafka_answers
from pipeline.services.native import NativeService, ServiceError


class KafkaService(NativeService):
    """Apache Kafka, single node, KRaft combined mode (deploy/kafka/server.properties)."""

    name = "kafka"
    start_timeout = 120.0

    @property
    def address(self) -> str:
        return self.settings.kafka_bootstrap

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    def install(self) -> None:
        self._require_binary("java")
        try:
            ensure_kafka_libs(self.settings)
        except ArtifactError as error:
            raise ServiceError(str(error)) from None

    def _classpath(self) -> str:
        return str(self.settings.kafka_libs_dir / "*")

    def server_properties(self) -> str:
        """deploy/kafka/server.properties with this machine's addresses and data folder."""
        controller_host, controller_port = config.host_ports(
            self.settings.kafka_controller, config.ENV_KAFKA_CONTROLLER
        )[0]
        template = Template((config.DEPLOY_DIR / "kafka" / "server.properties").read_text())
        return template.substitute(
            broker_host=_in_listener(self.settings.kafka_host),
            broker_port=self.settings.kafka_port,
            controller_host=_in_listener(controller_host),
            controller_port=controller_port,
            data_dir=self.data_dir / "data",
        )

    def prepare(self) -> None:
        super().prepare()
        self.config_path.write_text(self.server_properties())
        if not (self.data_dir / "data" / "meta.properties").exists():
            self._format_storage()

    def _format_storage(self) -> None:
        formatted = subprocess.run(
            [
                "java",
                "-cp",
                self._classpath(),
                *self._jvm_logging_options(),
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                config.KAFKA_CLUSTER_ID,
                "--config",
                str(self.config_path),
                "--ignore-formatted",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        with open(self.log_path, "a") as log:
            log.write(formatted.stdout + formatted.stderr)
        if formatted.returncode != 0:
            raise ServiceError(f"kafka failed to start; see {self.log_path}")

    @staticmethod
    def _jvm_logging_options() -> list[str]:
        return [f"-Dlog4j2.configurationFile={config.DEPLOY_DIR / 'kafka' / 'log4j2.properties'}"]

    def command(self) -> list[str]:
        return [
            "java",
            # A development broker beside Spark on a 2-core machine: a small, fixed heap.
            "-Xms256m",
            "-Xmx768m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            *self._jvm_logging_options(),
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self.config_path),
        ]

    def healthy(self, timeout: float = 2.0) -> bool:
        return kafka_answers(self.settings.kafka_bootstrap, timeout)


def _in_listener(host: str) -> str:
    """A host as Kafka's listener URLs write it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host

"""Apache Kafka as local processes: KRaft nodes, broker and controller in one. (layer: services)

Apache's own jars from Maven Central (:func:`pipeline.io.artifacts.ensure_kafka_libs`) run as
``java -cp libs/* kafka.Kafka`` with deploy/kafka/server.properties; the storage is formatted
once with a fixed cluster id, so it stays valid across restarts. Healthy when a metadata
request returns a broker.

:class:`KafkaService` is the one broker ``skewer services up`` runs; :class:`KafkaNodeService`
is node i of the cluster of three that ``up --kafka-brokers 3`` runs instead (one cluster id,
static voters, its own ports and data folder; node 1 takes the single broker's ports, so the
default bootstrap address reaches either). Topics on the cluster get three replicas, two in
sync (:func:`pipeline.io.kafka_io.topic_replication`), and so do the offsets and transaction
state, so the loss of any one node loses no committed record and no transaction.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from string import Template

from pipeline.io import config, kafka_security
from pipeline.io.artifacts import ArtifactError, ensure_kafka_libs
from pipeline.io.kafka_io import topic_replication
from pipeline.io.probes import kafka_answers
from pipeline.services.native import NativeService, ServiceError


class KafkaService(NativeService):
    """Apache Kafka, single node, KRaft combined mode (deploy/kafka/server.properties)."""

    name = "kafka"
    start_timeout = 120.0
    # Its controlled shutdown flushes logs and closes the quorum: give it time.
    stop_timeout = 30.0

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

    #: This node's id; node i of a cluster is ``kafka-i``.
    node_id: int = 1
    #: The voters of the metadata quorum (node ids), and so the brokers topics replicate over.
    voter_ids: tuple[int, ...] = (1,)

    @property
    def controller_address(self) -> str:
        return self.settings.kafka_controller

    def server_properties(self) -> str:
        """deploy/kafka/server.properties with this node's addresses, quorum and data folder."""
        broker_host, broker_port = _host_port(self.address, config.ENV_KAFKA_BOOTSTRAP)
        controller_host, controller_port = _host_port(
            self.controller_address, config.ENV_KAFKA_CONTROLLER
        )
        voters = ",".join(
            f"{node}@{_in_listener(host)}:{port}"
            for node in self.voter_ids
            for host, port in [_host_port(self._controller_of(node), config.ENV_KAFKA_CONTROLLER)]
        )
        replicas, min_insync = topic_replication(len(self.voter_ids))
        clustered = len(self.voter_ids) > 1
        template = Template((config.DEPLOY_DIR / "kafka" / "server.properties").read_text())
        return template.substitute(
            node_id=self.node_id,
            voters=voters,
            broker_host=_in_listener(broker_host),
            broker_port=broker_port,
            controller_host=_in_listener(controller_host),
            controller_port=controller_port,
            data_dir=self.data_dir / "data",
            replication=replicas,
            min_insync=min_insync,
            # A killed node's partitions and transactions move after this long (Kafka's
            # defaults, 9 s and 2 s, hold them 15 s); one node alone keeps the defaults.
            session_timeout_ms=6000 if clustered else 9000,
            heartbeat_interval_ms=1500 if clustered else 2000,
        )

    def _controller_of(self, node: int) -> str:
        return self.controller_address

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
            raise self.start_failure("formatting its storage failed")

    @staticmethod
    def _jvm_logging_options() -> list[str]:
        return [f"-Dlog4j2.configurationFile={config.DEPLOY_DIR / 'kafka' / 'log4j2.properties'}"]

    def command(self) -> list[str]:
        return [
            "java",
            # A development broker beside Spark on a 2-core machine: a small, fixed heap, all
            # of it touched at start, so its memory is what it will be (Kafka's own advice:
            # -Xms equal to -Xmx), and a broker whose RSS grows has a leak to look for.
            "-Xms768m",
            "-Xmx768m",
            "-XX:+AlwaysPreTouch",
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
        # Skewer's own broker speaks plaintext; a cluster of the user's that answers through the
        # environment's SASL or TLS settings (pipeline.io.kafka_security) is one too, external.
        security = kafka_security.from_environ()
        if not security.plaintext and kafka_answers(self.address, timeout, security):
            return True
        return kafka_answers(self.address, timeout, kafka_security.KafkaSecurity())


class KafkaNodeService(KafkaService):
    """Node ``node_id`` of the native cluster of :data:`~pipeline.io.config.KAFKA_CLUSTER_NODES`:
    broker and controller, with the others as fellow voters."""

    voter_ids = tuple(range(1, config.KAFKA_CLUSTER_NODES + 1))

    def __init__(self, settings: config.Settings, node_id: int) -> None:
        super().__init__(settings)
        self.node_id = node_id
        self.name = node_name(node_id)

    @property
    def address(self) -> str:
        return self.settings.kafka_node_address(self.node_id)

    @property
    def controller_address(self) -> str:
        return self.settings.kafka_node_controller(self.node_id)

    def _controller_of(self, node: int) -> str:
        return self.settings.kafka_node_controller(node)


#: The service name of a cluster node: ``kafka-1``, ``kafka-2``, ...
NODE_NAME = re.compile(r"kafka-([1-9]\d*)")


def node_name(node_id: int) -> str:
    return f"kafka-{node_id}"


def _host_port(address: str, variable: str) -> tuple[str, int]:
    return config.host_ports(address, variable)[0]


def _in_listener(host: str) -> str:
    """A host as Kafka's listener URLs write it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host

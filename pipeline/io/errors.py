"""The errors the services' plumbing raises for a command to say in one line.

Layer: io.

Raised by :mod:`pipeline.io.kafka_io` (topics, brokers) and :mod:`pipeline.io.redis_client`
(Redis); the commands exit 2 for a setting to fix, 1 for a service that does not answer.
"""


class KafkaIOError(Exception):
    """A topic or service is not as the run needs it; the message is one line for the user."""


class ServiceUnavailableError(KafkaIOError):
    """Kafka or Redis does not answer (the command exits 1)."""

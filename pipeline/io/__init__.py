"""Layer 6: adapters, everything that talks to something outside the process.

Settings from the environment (:mod:`~pipeline.io.config`), the wire format of records
(:mod:`~pipeline.io.records`), Kafka admin, clients and topic names (:mod:`~pipeline.io.kafka_io`),
the Redis state store and its Lua (:mod:`~pipeline.io.state_store`), the Spark session builder
(:mod:`~pipeline.io.spark_session`), the services' health probes (:mod:`~pipeline.io.probes`)
and the JVM artifacts from Maven Central (:mod:`~pipeline.io.artifacts`). Imports only
:mod:`operators` (and :mod:`producers.workloads`), never a stage.
"""

"""Layer 5: native service management, Kafka, Redis and Prometheus as local processes (and a
Docker engine when asked).

One module per service, one for the processes they run as, and :mod:`~pipeline.services.manager`
for ``up``/``down``/``status`` and the test sessions' leases. Imports :mod:`pipeline.io` (the
settings, the health probes, the Maven artifacts) and nothing above it.
"""

"""The live pipeline's wiring, in layers that import downward only.

``cli`` (the ``skewer`` command) > ``runs`` (a whole run: plan, orchestration, verification,
report) > ``stages`` (one module per stage process; :mod:`producers.kafka_producer` sits here
too) > ``observe`` (Prometheus) > ``services`` (native Kafka, Redis, Prometheus) > ``io``
(settings, wire format, Kafka, Redis, Spark session) > :mod:`producers.workloads` >
:mod:`operators` (the pure core). ``lint-imports`` checks the contracts in pyproject.toml;
docs/design.md#code-map follows one record through the modules.
"""

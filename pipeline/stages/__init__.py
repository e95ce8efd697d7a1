"""Layer 3: one module per stage process of the live pipeline.

:mod:`~pipeline.stages.grouping` (topic ``keys`` -> ``work`` by the grouping scheme),
:mod:`~pipeline.stages.worker_job` (the Spark workers, window state in Redis),
:mod:`~pipeline.stages.aggregator` (merges split keys' partial states when a window closes),
:mod:`~pipeline.stages.controller` with :mod:`~pipeline.stages.control_plane` (routing-table
schemes: statistics, new tables, state migration). The producer process,
:mod:`producers.kafka_producer`, sits in this layer too. Stages import
:mod:`pipeline.observe` and below, never :mod:`pipeline.runs` or :mod:`pipeline.cli`.
"""

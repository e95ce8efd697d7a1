"""Observability: the Prometheus series every stage exports and their exporters.

Layer: observe.

Imbalance math comes from :mod:`operators.metrics`; counters are read through the adapters
of :mod:`pipeline.io`. Imports :mod:`pipeline.services` and below.
"""

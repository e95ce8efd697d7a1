"""A user's own windowed job, written as a Spark SQL ``GROUP BY``: :mod:`.parse` reads the
query text into the typed :class:`.job.Job` every stage is handed, :mod:`.predicate` evaluates
its ``WHERE`` over a whole batch. The language: docs/query.md.

Layer: io.
"""

"""Layer 2: running a whole pipeline.

The demo and end-to-end orchestration of the stages as ``skewer`` subprocesses, the
verification of a run's final counts against its ground truth, and the run's report picture.
Imports :mod:`pipeline.stages` and below; imported only by :mod:`pipeline.cli` (and ``bench``).
"""

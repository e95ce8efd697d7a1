"""The compiled scanners behind :mod:`pipeline.io.extractors`, one module per job.

Layer: io.

:mod:`.specs` parses the ``--key``/``--time``/``--sum`` flags; :mod:`.json_scan` and
:mod:`.csv_scan` find each wanted field's span in a batch's bytes; :mod:`.spans` copies spans
out (escapes decoded); :mod:`.numbers_times` reads exact decimals and ISO-8601 times. Every
kernel is one numba pass over the whole batch. Design: docs/design.md#records-and-topics.

numba's on-disk cache (``cache=True``) notices edits to a kernel's own file only: after editing
a helper that kernels of another file inline, delete this package's ``__pycache__``.
"""

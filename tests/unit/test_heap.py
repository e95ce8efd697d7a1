"""A grouping source's allocator and heap trim (pipeline/io/heap.py): the memory of a backlog's
batches, freed but scattered among objects that live on, goes back to the OS only with both
glibc's malloc for Python's objects and ``malloc_trim``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.stages.grouping import SOURCE_ALLOCATOR

#: Allocates a backlog's worth of small objects (~45 MB), keeps one in a thousand, frees the
#: rest, trims or not; prints the RSS (kB) before, after the free, and at the end.
PROGRAM = """
import sys
from pipeline.io import heap

def rss():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1])

heap.release_freed_heap()
before = rss()
batch = [bytes(60) + i.to_bytes(4, "little") for i in range(400_000)]
kept = batch[::1000]
del batch
held = rss()
if sys.argv[1] == "trim":
    heap.release_freed_heap()
print(before, held, rss())
"""


def freed_and_kept(environment: dict[str, str], trim: bool) -> tuple[int, int]:
    """(kB the freed batch added to the RSS, kB of it still there at the end)."""
    output = subprocess.run(
        [sys.executable, "-c", PROGRAM, "trim" if trim else "keep"],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    before, held, end = map(int, output.split())
    return held - before, end - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_a_source_hands_back_what_a_backlog_s_batches_freed() -> None:
    grown, left = freed_and_kept(SOURCE_ALLOCATOR, trim=True)
    assert grown > 20_000
    assert left < grown / 4
    # Either part alone keeps it: Python's arenas are fragmented, and glibc keeps freed pages.
    _, left_untrimmed = freed_and_kept(SOURCE_ALLOCATOR, trim=False)
    assert left_untrimmed > grown / 2
    _, left_in_python_arenas = freed_and_kept({"PYTHONMALLOC": "pymalloc"}, trim=True)
    assert left_in_python_arenas > grown / 2

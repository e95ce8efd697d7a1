"""One process at a time, by a lock file in the run directory (layer: io).

Test sessions run side by side (pytest-xdist), and a CLI can run beside them: whoever builds
an artifact or starts the services holds the lock; the others wait, then find it done.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block; the
    kernel lets go of it if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)

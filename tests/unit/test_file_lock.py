"""The cache's lock: a second process waits for the first to let go."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from pipeline.io import file_lock

TAKE_AND_STAMP = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from pipeline.io import file_lock\n"
    "with file_lock.exclusive(Path(sys.argv[1])):\n"
    "    print(time.monotonic())\n"
)


def test_a_second_process_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    lock = tmp_path / "nested" / "build.lock"
    with file_lock.exclusive(lock):
        other = subprocess.Popen(
            [sys.executable, "-c", TAKE_AND_STAMP, str(lock)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(1.0)
        assert other.poll() is None  # still waiting for the lock
        released = time.monotonic()
    stamped, _ = other.communicate(timeout=30)
    assert other.returncode == 0
    assert float(stamped) >= released

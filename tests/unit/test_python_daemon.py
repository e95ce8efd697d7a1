"""The workers' Python daemon: Spark's own, with the tasks' kernels loaded before it forks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyspark

from pipeline.stages import worker_job
from pipeline.stages.python_daemon import without_spark_archives
from pipeline.stages.worker_task import load_kernels


def test_the_daemon_module_is_the_one_the_job_names() -> None:
    # Spark runs it as ``python -m MODULE``: a module that does not import fails every task.
    done = subprocess.run(
        [sys.executable, "-c", f"import {worker_job.PYTHON_DAEMON_MODULE}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_loading_the_kernels_runs_a_tasks_pure_part() -> None:
    # 64 made-up records, record i of key i mod 7 at i ms, in windows of 10 ms: each (window,
    # key) counted once.
    batch = load_kernels()
    expected = Counter((i // 10 * 10, b"%d" % (i % 7)) for i in range(64))
    counted = zip(batch.windows.tolist(), batch.keys.to_list(), batch.counts.tolist(), strict=True)
    assert {(window, key): count for window, key, count in counted} == expected
    assert batch.records == 64


def test_what_the_daemon_loads_is_frozen_out_of_the_collectors_sight() -> None:
    # A reused worker runs gc.collect() after every task: what the daemon loaded must not be
    # walked each time. In a subprocess, so this test's own collector stays as it is.
    script = (
        "import gc\n"
        "from pipeline.stages.python_daemon import load_and_freeze\n"
        "before = gc.get_freeze_count()\n"
        "load_and_freeze()\n"
        "import numba, pyarrow, redis\n"
        "print(before, gc.get_freeze_count(), len(gc.get_objects(generation=2)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    before, frozen, old = map(int, done.stdout.split())
    assert before == 0
    assert frozen > 50_000  # the loaded modules' objects: tens of thousands
    assert old < frozen // 10  # what a full collection still walks


def _spark_layout(home: Path) -> list[str]:
    """The archives Spark puts first on a Python worker's path, under Spark home ``home``."""
    (home / "python" / "lib").mkdir(parents=True)
    (home / "jars").mkdir()
    archives = [
        home / "python" / "lib" / "pyspark.zip",
        home / "python" / "lib" / "py4j-0.10.9.9-src.zip",
        home / "jars" / "spark-core_2.13-4.2.0.jar",
    ]
    for archive in archives:
        archive.write_bytes(b"")
    return [str(a) for a in archives]


def test_spark_archives_leave_the_path_only_when_spark_is_the_installed_pyspark(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site-packages"
    installed = site / "pyspark"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    archives = _spark_layout(installed)
    own = str(tmp_path / "users.zip")
    path = [*archives, own, str(site)]
    assert without_spark_archives(path, str(installed)) == [own, str(site)]
    # A Spark of its own: its archives are its pyspark, whatever else is installed.
    other = _spark_layout(tmp_path / "spark")
    assert without_spark_archives([*other, str(site)], str(tmp_path / "spark")) == [
        *other,
        str(site),
    ]
    assert without_spark_archives(path, None) == path
    # No pyspark besides the archives.
    assert without_spark_archives(archives, str(installed)) == archives


def test_the_daemon_imports_the_installed_pyspark_compiled_with_sparks_path_as_spark_sets_it() -> (
    None
):
    # The worker's environment as Spark's PythonWorkerFactory builds it: its archives first.
    home = Path(pyspark.__file__).parent
    archives = [
        *sorted((home / "python" / "lib").glob("*.zip")),
        *sorted((home / "jars").glob("spark-core_*.jar")),
    ]
    assert len(archives) == 3
    script = (
        "import os, sys, zipimport\n"
        "from pipeline.stages import python_daemon\n"
        "assert 'pyspark' not in sys.modules\n"
        "python_daemon.use_installed_pyspark()\n"
        "from pipeline.stages.worker_task import load_kernels\n"
        "load_kernels()\n"
        "threads = len(os.listdir('/proc/self/task'))\n"
        "python_daemon.load_and_freeze()\n"
        "import pyspark\n"
        "cache = sys.path_importer_cache.values()\n"
        "zips = [v for v in cache if isinstance(v, zipimport.zipimporter)]\n"
        "print(pyspark.__file__, 'pyspark.worker' in sys.modules, len(zips),\n"
        "      len(os.listdir('/proc/self/task')) - threads)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(a) for a in archives),
        "SPARK_HOME": str(home),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    origin, worker_loaded, zips, new_threads = done.stdout.split()
    assert origin == pyspark.__file__  # the installed, compiled files, not pyspark.zip's
    assert worker_loaded == "True"
    assert zips == "0"  # nothing left for each new worker's invalidate_caches() to read
    # pyspark's daemon imports the worker module after each fork lest an import start a
    # thread the fork would not copy: loading it first starts none.
    assert new_threads == "0"

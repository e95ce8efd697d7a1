"""What the test session's two pytest workers are handed, and in what order.

``--dist loadfile`` hands out a test module whole, or a group of modules that must not run
beside each other (:data:`ONE_WORKER_GROUPS`): first the modules outside tests/integration/,
which compile the numba kernels the live stages then load from numba's cache, then the rest
longest first by ``tests/module_durations.json`` (docs/testing.md says why).

Every session records what its units took in ``.cache/test-durations/PASS.json`` (a pass is
named by ``SKEWER_TEST_PASS``, else by its service backend); ``make test-durations`` writes them
into the committed table, and ``python tests/work_units.py report`` prints the slowest units and
the passes' times (the end of ``.ci/run``).

Example:
    >>> work_unit("tests/integration/test_soak.py::test_five_minutes")
    'tests/integration/test_kafka_cluster.py'
    >>> work_unit("tests/unit/test_heap.py::test_trim")
    'tests/unit/test_heap.py'
    >>> integration = "tests/integration/test_"
    >>> units = {"tests/unit/test_a.py": 30, integration + "b.py": 1, integration + "c.py": 5}
    >>> order_units(units, {integration + "b.py": 300.0, integration + "c.py": 20.0})
    ['tests/unit/test_a.py', 'tests/integration/test_b.py', 'tests/integration/test_c.py']
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
#: The committed table: pass -> work unit -> seconds (setup, call and teardown of its tests).
DURATIONS_TABLE = TESTS / "module_durations.json"
#: Where each session writes what its units took, one file per pass.
RECORDED = ROOT / ".cache" / "test-durations"

#: Modules that must run one after another on one pytest worker:
#: - the modules that run clusters of their own (three Kafka nodes, a Spark standalone cluster,
#:   a Redis Sentinel set): each takes some 10 GB, and two side by side on a 24 GB machine left
#:   the kernel reclaiming memory, every process stalled for minutes;
#: - the modules that each keep both cores busy on their own: the schemes' live runs side by
#:   side, and the compose stack (a broker, Redis, Prometheus, Grafana and the job's JVMs in
#:   containers). Side by side on two cores they starved each other's services past their
#:   deadlines (a new topic without a leader for 30 s, the first point of a panel after minutes).
#: A group is one unit: the worker that draws it runs its modules in turn while the other worker
#: takes the remaining units, instead of sitting on a lock.
ONE_WORKER_GROUPS = (
    (
        "tests/integration/test_kafka_cluster.py",
        "tests/integration/test_spark_cluster.py",
        "tests/integration/test_soak.py",
    ),
    ("tests/integration/test_end_to_end.py", "tests/integration/test_compose_stack.py"),
)


ENV_TEST_PASS = "SKEWER_TEST_PASS"


def pass_name(backend: str) -> str:
    """The name of this session's pass: ``SKEWER_TEST_PASS``, else its service backend."""
    return os.environ.get(ENV_TEST_PASS) or backend


def work_unit(nodeid: str) -> str:
    """What ``--dist loadfile`` hands out whole: a test's module, or its module's group in
    :data:`ONE_WORKER_GROUPS` (named by the group's first module)."""
    module = nodeid.split("::", 1)[0]
    return next((group[0] for group in ONE_WORKER_GROUPS if module in group), module)


INTEGRATION = "tests/integration/"


def order_units(tests: Mapping[str, int], seconds: Mapping[str, float]) -> list[str]:
    """Units (``tests``: unit -> number of tests) in the order they go out: those outside
    :data:`INTEGRATION` first; each kind longest first, those with ``seconds`` by them, then
    the others by number of tests."""

    def last_first(unit: str) -> tuple[bool, bool, float, int]:
        integration = unit.startswith(INTEGRATION)
        return (not integration, unit in seconds, seconds.get(unit, 0.0), tests[unit])

    return sorted(tests, key=last_first, reverse=True)


def load_table(name: str, path: Path = DURATIONS_TABLE) -> dict[str, float]:
    """The committed seconds of each unit of pass ``name`` (empty if none are recorded)."""
    try:
        return dict(json.loads(path.read_text()).get(name, {}))
    except (OSError, ValueError):
        return {}


def record(name: str, seconds: Mapping[str, float], wall: float, outcome: int) -> Path:
    """Write the seconds per unit of a session of pass ``name``, its wall time and status."""
    RECORDED.mkdir(parents=True, exist_ok=True)
    path = RECORDED / f"{name}.json"
    data = {
        "wall_seconds": round(wall, 1),
        "exit_status": outcome,
        "units": {unit: round(s, 1) for unit, s in sorted(seconds.items())},
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def recorded() -> dict[str, dict]:
    """The last session's record of each pass."""
    found = {}
    for path in sorted(RECORDED.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except ValueError:
            continue
    return found


def refresh_table() -> None:
    """Write the last recorded sessions' seconds into :data:`DURATIONS_TABLE`, unit by unit:
    a unit a session did not run keeps its committed figure."""
    table = json.loads(DURATIONS_TABLE.read_text()) if DURATIONS_TABLE.exists() else {}
    for name, data in recorded().items():
        table.setdefault(name, {}).update(data["units"])
        print(f"{name}: {len(data['units'])} units, {data['wall_seconds']:.0f} s of wall time")
    DURATIONS_TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DURATIONS_TABLE.relative_to(ROOT)}")


def report(slowest: int = 10) -> None:
    """Each recorded pass's wall time, and the slowest units over them."""
    passes = recorded()
    units = []
    for name, data in passes.items():
        status = "passed" if data["exit_status"] == 0 else f"exit {data['exit_status']}"
        print(f"{name} pass: {data['wall_seconds']:.0f} s ({status})")
        units += [(s, name, unit) for unit, s in data["units"].items()]
    print(f"the {slowest} slowest test modules (a group is named by its first module):")
    for seconds, name, unit in sorted(units, reverse=True)[:slowest]:
        print(f"  {seconds:7.1f} s  {name:13}  {unit}")


if __name__ == "__main__":
    commands = {"report": report, "refresh": refresh_table}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python {sys.argv[0]} {'|'.join(commands)}")
    commands[sys.argv[1]]()

"""Every registered scheme routes exactly as recorded: a digest of its routes, bit for bit.

The digests pin the routing of every scheme in operators/registry.py on two seeded workloads
(a Zipf stream and FISH's switching drift), through the simulator's Router with three sources,
uneven chunks and controller rounds, so a refactoring that changes any decision -- a hash, a
tie, a probe order, a planned table -- fails here. After an intended change of routing,
print the new digests with ``.venv/bin/python tests/unit/test_routing_golden.py`` and say in
the change why the routing moved.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from operators import registry
from operators.simulator import Router
from producers.workloads import parse

WORKLOADS = ("zipf:z=1.4,keys=2000,n=6000,seed=3", "drift:mode=switch,keys=2000,n=6000,seed=5")
#: Uneven speeds, passed to the schemes that take ``worker_speeds`` (FISH).
SPEEDS = np.array([1, 2, 1, 3, 1, 1, 0.5])
#: Parameters that make a scheme's own mechanism act within these short streams.
PARAMS: dict[str, dict[str, object]] = {
    "pkg-probing": {"probe_interval": 1000},
    **{
        fang: {"window": 2, "max_table_size": 8} for fang in ("llfd", "mintable", "minmig", "mixed")
    },
}

GOLDEN: dict[str, str] = {
    "key": "98af51923ce334bb",
    "shuffle": "3073aed3a4d7f10d",
    "pkg": "3bbf0f7fc2992628",
    "pkg-global": "a56291744379c6eb",
    "pkg-probing": "7df2e65a9af63f2e",
    "potc": "e57dd6553b54ee08",
    "greedy-online": "8442f095681bd61e",
    "greedy-offline": "13371641713c98e1",
    "d-choices": "1ad4a17735c5d830",
    "w-choices": "55b4156407e34e66",
    "fish": "a0ffc7bfbe19a0b3",
    "consistent": "382acaccac74d332",
    "scan": "84826caf22a09994",
    "redist": "15f0fd3ff8e073ca",
    "readj": "fc8f635c32d92d74",
    "llfd": "3e5e4bd30c49ac15",
    "mintable": "0345f5c2b56ef00e",
    "minmig": "91ae1808c2b5c219",
    "mixed": "6faa47037a421e9c",
}


def routing_digest(scheme: str) -> str:
    """SHA-256 (first 16 hex digits) of the routes, the controller rounds and the final tables."""
    digest = hashlib.sha256()
    for spec in WORKLOADS:
        keys = parse(spec).keys()
        router = Router(
            scheme,
            len(SPEEDS),
            3,
            params=PARAMS.get(scheme),
            seed=11,
            worker_speeds=SPEEDS,
            rebalance_interval=1500,
        )
        router.prepare(keys)
        for start in range(0, len(keys), 997):
            digest.update(router.route(keys.slice(start, min(start + 997, len(keys)))).tobytes())
        for migration in router.migrations:
            migration = {k: v for k, v in migration.items() if k != "planning_seconds"}
            digest.update(json.dumps(migration, sort_keys=True).encode())
        for source in router.objects:
            table = getattr(source, "table", None)
            if hasattr(table, "as_dict"):
                digest.update(json.dumps(sorted(table.as_dict().items())).encode())
    return digest.hexdigest()[:16]


def test_every_registered_scheme_has_a_golden_digest() -> None:
    assert sorted(GOLDEN) == sorted(registry.names())


@pytest.mark.parametrize("scheme", registry.names())
def test_routing_is_unchanged(scheme: str) -> None:
    assert routing_digest(scheme) == GOLDEN[scheme]


if __name__ == "__main__":
    print(json.dumps({name: routing_digest(name) for name in registry.names()}, indent=4))

"""`skewer sim`: run one grouping scheme over a workload in the simulator and print its metrics.

Layer: cli.

``--workload`` takes a spec such as ``zipf:z=1.2,keys=100000,n=1000000,seed=7`` (see
:mod:`producers.workloads`); ``--input FILE`` replays a file with one key per line. ``--json``
prints one JSON object (the fields of :meth:`SimulationResult.summary` plus the workload and
its top-key probability ``p1``); otherwise a readable table.

Routing-table schemes rebalance every ``--rebalance-interval`` records; without the option they
get ten controller rounds over the run (``records // 10``), so that ``skewer sim --scheme mixed``
shows the scheme rather than its base hash. ``--rebalance-interval 0`` disables rebalancing.
"""

from __future__ import annotations

import argparse
import json
import sys

from operators.params import parse_params
from pipeline.cli.arguments import UsageError, add_command
from pipeline.cli.route import add_scheme_arguments, parse_speeds

#: Controller rounds over the run when ``--rebalance-interval`` is not given.
DEFAULT_ROUNDS = 10


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "sim",
        help="simulate a grouping scheme on a workload and print the papers' metrics",
        doc=__doc__,
        paragraph=0,
    )
    add_scheme_arguments(parser)
    stream = parser.add_mutually_exclusive_group(required=True)
    stream.add_argument("--workload", metavar="SPEC", help="e.g. zipf:z=1.2,keys=100000,n=1e6")
    stream.add_argument("--input", metavar="FILE", help="one key per line")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--checkpoints", type=int, default=100, help="I(t) samples (default 100)")
    parser.add_argument("--batch-size", type=int, default=65536, help="records per routing call")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from operators import registry
    from operators.base import TableScheme
    from operators.simulator import simulate
    from producers.workloads import File, WorkloadError, parse

    params = parse_params(args.param)
    speeds = parse_speeds(args.worker_speeds, args.workers)
    if args.sources < 1:
        raise UsageError(f"--sources must be >= 1, got {args.sources}")
    if args.checkpoints < 1 or args.batch_size < 1:
        raise UsageError("--checkpoints and --batch-size must be >= 1")
    if args.rebalance_interval is not None and args.rebalance_interval < 0:
        raise UsageError(f"--rebalance-interval must be >= 0, got {args.rebalance_interval}")
    # Fail on a wrong scheme, W or parameter before generating a possibly long workload.
    cls = registry.scheme_class(args.scheme)
    registry.create(args.scheme, args.workers, n_sources=args.sources, seed=args.seed, **params)
    try:
        workload = parse(args.workload) if args.workload else File(path=args.input)
        keys = workload.keys()
    except WorkloadError as error:
        raise UsageError(str(error)) from None
    interval = args.rebalance_interval
    if interval is None and issubclass(cls, TableScheme):
        interval = max(1, len(keys) // DEFAULT_ROUNDS)
    result = simulate(
        args.scheme,
        keys,
        args.workers,
        args.sources,
        params=params,
        seed=args.seed,
        checkpoints=args.checkpoints,
        worker_speeds=speeds,
        rebalance_interval=interval or None,
        batch_size=args.batch_size,
    )
    summary = {"workload": workload.spec, "p1": workload.p1, **result.summary()}
    summary["rebalance_interval"] = interval or None
    if args.json:
        print(json.dumps(summary))
    else:
        width = max(len(name) for name in summary)
        for name, value in summary.items():
            shown = f"{value:.6g}" if isinstance(value, float) else value
            print(f"{name:<{width}}  {shown}")
    sys.stdout.flush()
    return 0

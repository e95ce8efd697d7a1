"""`skewer route`: keys on stdin, one per line; the worker of each on stdout, one per line.

Layer: cli.

The input is the interleaved stream of ``--sources`` sources: line ``i`` belongs to source
``i mod S``, each source has its own scheme object, and the hooks mean what they mean in the
simulator (both use :class:`operators.simulator.Router`). Input is read and answered in
chunks as it arrives, so the command works on an endless pipe; a scheme that needs the whole
stream in advance (``greedy-offline``) reads everything first.

Example::

    $ printf 'a\\nb\\na\\n' | skewer route --scheme pkg --workers 4 --sources 1
"""

from __future__ import annotations

import argparse
import sys
from typing import BinaryIO

import numpy as np

from operators.params import parse_params
from pipeline.cli.arguments import UsageError, add_command, add_param_argument

#: Bytes asked of stdin per read (a read returns what is available, up to this).
READ_SIZE = 1 << 20


def parse_speeds(text: str | None, n_workers: int) -> np.ndarray | None:
    """``--worker-speeds 1,2,1,2``: one positive number per worker."""
    if text is None:
        return None
    try:
        speeds = np.array([float(part) for part in text.split(",")], dtype=np.float64)
    except ValueError:
        raise UsageError(f"--worker-speeds expects numbers, got {text!r}") from None
    if speeds.shape != (n_workers,) or not np.all(np.isfinite(speeds) & (speeds > 0)):
        raise UsageError(f"--worker-speeds needs {n_workers} positive numbers, got {text!r}")
    return speeds


def add_scheme_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``route`` and ``sim`` share."""
    parser.add_argument("--scheme", required=True, help="grouping scheme (see the registry)")
    parser.add_argument("--workers", type=int, required=True, metavar="W")
    parser.add_argument("--sources", type=int, default=1, metavar="S")
    add_param_argument(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rebalance-interval",
        type=int,
        metavar="N",
        help="records between controller rounds (routing-table schemes)",
    )
    parser.add_argument(
        "--worker-speeds", metavar="V1,V2,...", help="relative worker service rates"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "route",
        help="route keys from stdin (one per line) and print each key's worker",
        doc=__doc__,
        paragraph=0,
    )
    add_scheme_arguments(parser)
    parser.set_defaults(handler=run)


def _write(out: BinaryIO, workers: np.ndarray) -> None:
    if workers.shape[0]:
        out.write(("\n".join(map(str, workers.tolist())) + "\n").encode("ascii"))
        out.flush()


def run(args: argparse.Namespace) -> int:
    from operators.simulator import Router
    from producers.workloads import split_lines

    if args.sources < 1:
        raise UsageError(f"--sources must be >= 1, got {args.sources}")
    router = Router(
        args.scheme,
        args.workers,
        args.sources,
        params=parse_params(args.param),
        seed=args.seed,
        worker_speeds=parse_speeds(args.worker_speeds, args.workers),
        rebalance_interval=args.rebalance_interval,
    )
    source: BinaryIO = sys.stdin.buffer
    out: BinaryIO = sys.stdout.buffer
    if router.needs_whole_stream:
        keys = split_lines(source.read())
        router.prepare(keys)
        _write(out, router.route(keys))
        return 0
    read = getattr(source, "read1", source.read)
    pending = b""
    while True:
        chunk = read(READ_SIZE)
        if not chunk:
            break
        data = pending + chunk
        cut = data.rfind(b"\n") + 1
        pending = data[cut:]
        if cut:
            _write(out, router.route(split_lines(data[:cut])))
    if pending:
        _write(out, router.route(split_lines(pending)))
    return 0

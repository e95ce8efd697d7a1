"""`skewer report`: one PNG of a run's imbalance over time and per-worker load, from Redis.

Layer: cli.

Reads the run's timeline (samples the aggregator took about once a second), its workers'
cumulative records and the controller's rebalances from Redis, draws the imbalance per
interval and cumulative (max/avg load, and I(t) as a fraction of records) over time and the
records per worker against their average, writes the PNG (default
`{run_dir}/reports/{run}.png`) and prints its path; a query's run also prints its last window's
top keys as the query's rows. Exit 2 for an unknown run or a path it
cannot write, 1 when Redis does not answer. See pipeline/runs/report.py for the figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.cli.arguments import add_command
from pipeline.observe.exporter import UNKNOWN_SCHEME


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "report",
        help="write a PNG of a run's imbalance over time and per-worker load",
        doc=__doc__,
        paragraph=1,
    )
    parser.add_argument("--run-id", required=True, help="the run (its Redis keys skewer:RUN:*)")
    parser.add_argument("--out", type=Path, metavar="PATH", help="PNG path")
    parser.add_argument(
        "--scheme", default=UNKNOWN_SCHEME, metavar="NAME", help="scheme named in the title"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.cli.arguments import UsageError
    from pipeline.io import config
    from pipeline.io.redis_client import connect_redis
    from pipeline.io.redis_layout import RunKeys
    from pipeline.io.state_store import StateStore
    from pipeline.runs import report
    from pipeline.runs.summary import top_row_lines, top_rows
    from pipeline.stages import user_topic

    try:
        RunKeys(args.run_id)
    except ValueError as error:
        raise UsageError(str(error)) from None
    settings = config.load()
    path = args.out or report.default_path(args.run_id, settings.run_dir)
    client = connect_redis(settings.redis_url)
    try:
        written, data = report.write_run_report(client, args.run_id, args.scheme, path)
        found = user_topic.recorded(client, args.run_id)
        rows = top_rows(StateStore(client, args.run_id), found[0].query if found else None)
    except report.ReportError as error:
        raise UsageError(str(error)) from None
    finally:
        client.close()
    for what, count in data.skipped.items():
        if count:
            print(f"skewer report: skipped {count} malformed {what} entries", file=sys.stderr)
    print(written)
    for line in top_row_lines(rows):
        print(line)
    return 0

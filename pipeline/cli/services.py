"""`skewer services up|down|status|install [NAME ...]`: the native Kafka, Redis and Prometheus.

Layer: cli.

``up`` starts what does not answer yet and waits until everything is healthy (a second ``up``
changes nothing); ``down`` stops exactly the processes ``up`` started; ``status`` prints one
line per service and exits 1 if any is down; ``install`` only fetches Kafka's jars and Spark's
Kafka source (Maven, once) and checks the Debian binaries. Exit code 1 with one line
``skewer services: <name> failed to start; see <log>`` when a service does not come up.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.arguments import add_command
from pipeline.io import artifacts, config
from pipeline.services import manager, native


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "services",
        help="start, stop or check the native Kafka, Redis and Prometheus",
        doc=__doc__,
        paragraph=1,
    )
    parser.add_argument("action", choices=("up", "down", "status", "install"))
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"services to act on (default: all of {', '.join(manager.SERVICE_NAMES)})",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = config.load()
    try:
        if args.action == "install":
            for service in manager.native_services(settings, args.names):
                service.install()
            jars = artifacts.ensure_spark_jars(settings)
            print(f"kafka libs:  {settings.kafka_libs_dir}")
            print(f"spark jars:  {', '.join(jar.name for jar in jars)}")
            return 0
        if args.action == "up":
            states = manager.up(settings, args.names)
        elif args.action == "down":
            states = manager.down(settings, args.names)
        else:
            states = manager.status(settings, args.names)
    except native.ServiceError as error:
        print(f"skewer services: {error}", file=sys.stderr)
        return 1
    for state in states:
        print(state.line())
    if args.action == "status" and any(state.state in ("down", "starting") for state in states):
        return 1
    return 0

"""`skewer services up|down|status|install [NAME ...]`: the native Kafka, Redis and Prometheus.

Layer: cli.

``up`` starts what does not answer yet and waits until everything is healthy (a second ``up``
changes nothing); ``down`` stops exactly the processes ``up`` started; ``status`` prints one
line per service and exits 1 if any is down; ``install`` only fetches Kafka's jars and Spark's
Kafka source (Maven, once) and checks the Debian binaries. Exit code 1 with one line
``skewer services: <name> failed to start (<why>); see <log>; its log ends: <its last line>``
when a service does not come up. ``up`` of Kafka and Redis also builds the Spark driver's class
archive, once per JDK and PySpark (docs/performance.md#start-up).
``up --spark-workers N`` also starts a Spark standalone master (``spark://127.0.0.1:17077``,
``$SKEWER_SPARK_STANDALONE``) and N workers of ``--spark-worker-cores C`` cores each (4), for
``--spark-master`` of ``skewer work`` and ``skewer demo``; ``status`` and ``down`` cover them.
``up --redis-sentinel`` makes Redis a primary with 2 replicas (``redis-replica-1..2``) and 3
sentinels (``redis-sentinel-1..3``, ``$SKEWER_REDIS_SENTINEL``), and prints the
``SKEWER_REDIS_URL`` that reaches whichever is the primary; ``status`` and ``down`` cover them.
``up --kafka-brokers 3`` runs Kafka as a cluster of three KRaft nodes (``kafka-1..3``, the first
on the one broker's ports), where topics get three replicas, two in sync.
``up --docker`` also runs a Docker engine (``docker``: Debian's ``docker.io``, installed as root
the first time, on ``$DOCKER_HOST``'s unix socket or ``/var/run/docker.sock``; left alone if
one answers there already) and installs the Compose plugin into ``.cache/docker-config``
(``install --docker`` only installs both); it prints the ``export`` line that points a shell's
``docker`` and ``docker compose`` at them. Only when asked: an engine switches the integration
tests to testcontainers.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.arguments import UsageError, add_command, require_at_least
from pipeline.io import artifacts, config
from pipeline.services import docker_engine, manager, native, spark_standalone


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
    parser.add_argument(
        "--kafka-brokers",
        type=int,
        choices=(1, config.KAFKA_CLUSTER_NODES),
        default=1,
        metavar="N",
        help=f"up: Kafka as 1 broker (default) or a cluster of {config.KAFKA_CLUSTER_NODES} nodes",
    )
    parser.add_argument(
        "--spark-workers",
        type=int,
        default=0,
        metavar="N",
        help="up: also a Spark standalone master and N workers",
    )
    parser.add_argument(
        "--spark-worker-cores",
        type=int,
        default=spark_standalone.DEFAULT_WORKER_CORES,
        metavar="C",
        help=f"cores each Spark worker offers ({spark_standalone.DEFAULT_WORKER_CORES})",
    )
    parser.add_argument(
        "--redis-sentinel",
        action="store_true",
        help="up: also 2 Redis replicas and 3 sentinels that fail the primary over",
    )
    parser.add_argument(
        "--docker",
        action="store_true",
        help="up, install: also a Docker engine (Debian's docker.io) and the Compose plugin",
    )
    parser.set_defaults(handler=run)


def _runs_workers(names: list[str]) -> bool:
    """Whether the services asked for are the ones a worker stage needs (all, by default)."""
    return not names or {"kafka", "redis"} <= set(names)


def run(args: argparse.Namespace) -> int:
    settings = config.load()
    for flag, given, actions in (
        ("--spark-workers", args.spark_workers, ("up",)),
        ("--kafka-brokers", args.kafka_brokers > 1, ("up",)),
        ("--redis-sentinel", args.redis_sentinel, ("up",)),
        ("--docker", args.docker, ("up", "install")),
    ):
        if given and args.action not in actions:
            raise UsageError(f"{flag} is an option of {' and '.join(f'`{a}`' for a in actions)}")
    require_at_least(0, ("--spark-workers", args.spark_workers))
    require_at_least(1, ("--spark-worker-cores", args.spark_worker_cores))
    try:
        if args.action == "install":
            for service in manager.native_services(settings, args.names, docker=args.docker):
                service.install()
            jars = artifacts.ensure_spark_jars(settings)
            print(f"kafka libs:  {settings.kafka_libs_dir}")
            print(f"spark jars:  {', '.join(jar.name for jar in jars)}")
            return 0
        if args.action == "up":
            states = manager.up(
                settings,
                args.names,
                spark_workers=args.spark_workers,
                spark_worker_cores=args.spark_worker_cores,
                kafka_brokers=args.kafka_brokers,
                redis_sentinel_set=args.redis_sentinel,
                docker=args.docker,
            )
        elif args.action == "down":
            states = manager.down(settings, args.names)
        else:
            states = manager.status(settings, args.names)
    except native.ServiceError as error:
        print(f"skewer services: {error}", file=sys.stderr)
        return 1
    for state in states:
        print(state.line())
    if args.action == "up" and _runs_workers(args.names):
        from pipeline.runs.class_archive import ensure_class_archive

        ensure_class_archive(settings, lambda line: print(line, file=sys.stderr))
    if args.redis_sentinel:
        print(f"clients of the Sentinel set: export SKEWER_REDIS_URL={settings.redis_sentinel_url}")
    if args.action == "up" and (args.docker or docker_engine.NAME in args.names):
        print(f"docker and docker compose: {docker_engine.shell_exports(settings)}")
    if args.action == "status" and any(state.state in ("down", "starting") for state in states):
        return 1
    return 0

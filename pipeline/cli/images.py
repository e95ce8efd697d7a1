"""`skewer images build --local [NAME ...] [--rebuild]`: the images of docker-compose.yml built
from Debian packages, for a machine that reaches no image registry. (layer: cli)

``build --local`` builds, with the Docker engine of ``$DOCKER_HOST`` (``skewer services up
docker`` runs one), a Debian bookworm base by ``debootstrap`` from the mirror apt uses (once;
``--rebuild`` makes it again), and on it skewer's own image ``skewer:local`` and stand-ins for
the official Kafka, Redis and Prometheus images, named as deploy/images/local.env says: ``docker
compose --env-file .env --env-file deploy/images/local.env up`` then runs them. NAME picks
images (debian, python, maven, kafka, redis, prometheus, skewer; what they need is built too).
It prints one line per image with its build time and size; exit 1 with one line naming the
build log when no engine answers or a build fails, 2 for a bad request. Without ``--local`` it
builds only ``skewer:local``, from the official images (pulled).

Logic: :mod:`pipeline.services.docker_images`.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.cli.arguments import UsageError, add_command
from pipeline.io import config
from pipeline.services import docker_images


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers,
        "images",
        help="build compose's images; --local: from Debian packages, without a registry",
        doc=__doc__,
        paragraph=1,
    )
    # `build` is a command of its own, so that NAMEs may follow its options.
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="build the images", description=parser.description)
    build.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"images to build (default: all of {', '.join(docker_images.IMAGE_NAMES)})",
    )
    build.add_argument(
        "--local",
        action="store_true",
        help="build the base and the stand-ins from Debian packages instead of pulling",
    )
    build.add_argument(
        "--rebuild",
        action="store_true",
        help="--local: debootstrap the base again (every image on it is built anew)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    unknown = [name for name in args.names if name not in docker_images.IMAGE_NAMES]
    if unknown:
        raise UsageError(
            f"no image {', '.join(unknown)}; the images are {', '.join(docker_images.IMAGE_NAMES)}"
        )
    if args.rebuild and not args.local:
        raise UsageError("--rebuild is an option of --local builds")
    if not args.local and set(args.names) - {"skewer"}:
        raise UsageError("without --local only skewer's own image is built; add --local")
    settings = config.load()
    try:
        builder = docker_images.Builder(settings, report=lambda line: print(line, flush=True))
        builder.build(args.names, local=args.local, rebuild=args.rebuild)
    except docker_images.ImageError as error:
        print(f"skewer images: {error}", file=sys.stderr)
        return 1
    if args.local:
        print(f"the stack on these images (no Grafana): {docker_images.COMPOSE_UP_LOCAL}")
    return 0

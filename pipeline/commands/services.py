"""`skewer services`: placeholder until its issue lands; registered so `skewer --help` lists it."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("services", help="(not built yet)")
    parser.set_defaults(handler=lambda args: print("skewer services: not built yet") or 1)

"""`skewer route`: placeholder until its issue lands; registered so `skewer --help` lists it."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("route", help="(not built yet)")
    parser.set_defaults(handler=lambda args: print("skewer route: not built yet") or 1)

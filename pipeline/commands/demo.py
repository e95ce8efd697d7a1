"""`skewer demo`: placeholder until its issue lands; registered so `skewer --help` lists it."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="(not built yet)")
    parser.set_defaults(handler=lambda args: print("skewer demo: not built yet") or 1)

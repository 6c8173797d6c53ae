"""Command line: ``python -m reliable_flow`` and the ``reliable-flow`` script."""

from __future__ import annotations

import argparse
import sys

from . import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reliable-flow",
        description="Transactional outbox, persistent inbox and ordered apply on two SQLite files.",
    )
    parser.add_argument("--version", action="version", version=f"reliable_flow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="a short narrated run: arrival 3,1,2, a gap, a schema upgrade")
    demo.add_argument("--dir", help="keep the demo's files in this directory (default: a temporary one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.dir)
    parser.print_help(sys.stderr)
    return 2

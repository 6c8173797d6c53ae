"""Command line: ``python -m reliable_flow`` and the ``reliable-flow`` script."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reliable-flow",
        description="Transactional outbox, persistent inbox and ordered apply on two SQLite files.",
    )
    parser.add_argument("--version", action="version", version=f"reliable_flow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="a short narrated run: arrival 3,1,2, a gap, a schema upgrade"
    )
    demo.add_argument(
        "--dir", help="keep the demo's files in this directory (default: a temporary one)"
    )
    experiment = sub.add_parser(
        "experiment",
        help="run every named scenario on fresh files; write or check the deterministic JSON",
        description=(
            "Run every named scenario (the seed's and ours) on fresh temporary files and produce "
            "deterministic JSON. With neither option the JSON goes to stdout."
        ),
    )
    experiment.add_argument("--output", metavar="FILE", help="write the JSON to FILE")
    experiment.add_argument(
        "--check", nargs="?", const="", metavar="FILE",
        help="compare with FILE (default: the frozen results shipped with the package); "
             "exit 1 and print a diff on any difference",
    )
    return parser


def _experiment(output: str | None, check: str | None) -> int:
    from .experiment import FROZEN_RESULTS, compare, dumps, run_experiment

    frozen_path = (Path(check) if check else FROZEN_RESULTS) if check is not None else None
    frozen = None
    if frozen_path is not None:  # read it first: a missing file should not cost a whole run
        try:
            frozen = json.loads(frozen_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"experiment --check: cannot read {frozen_path}: {exc}", file=sys.stderr)
            return 2
    results = run_experiment()
    text = dumps(results)
    if output is not None:
        with open(output, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    if frozen_path is None:
        if output is None:
            sys.stdout.write(text)
        return 0
    same, diff = compare(frozen, results)
    if same:
        count = results["scenario_count"]
        print(f"experiment --check: all {count} scenarios match {frozen_path}")
        return 0
    sys.stdout.write(diff)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.dir)
    if args.command == "experiment":
        return _experiment(args.output, args.check)
    parser.print_help(sys.stderr)
    return 2

"""Command line: ``python -m reliable_flow`` and the ``reliable-flow`` script."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import __version__
from ..errors import ReliableFlowError
from ._cli_common import seconds_type

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reliable-flow",
        description="Transactional outbox, persistent inbox and ordered apply on two SQLite files "
                    "(or PostgreSQL schemas: a postgresql://...#schema location wherever a file is taken).",
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
    inspect = sub.add_parser(
        "inspect",
        help="summarise a producer store and a consumer store (or what its consumers on other hosts owe it), "
             "or why one flow / event is stuck (read only)",
        description="Flows, undelivered and set-aside events per consumer, inbox pending / "
                    "blocked (with reasons) / applied, and gaps per flow; with --flow or --event, that "
                    "flow or event on both sides; with --effect, one effect and its durable history. Never writes. Exits 1 when something is blocked, set "
                    "aside, or stuck longer than --stuck-after (for alerts), 2 on an error. "
                    "Each store is a SQLite file or a postgresql://...#schema location. "
                    "Given redis://host:6379/0#NAME instead of a consumer store: the same report of the "
                    "consumer NAME on another host, read through the `reliable-flow bridge` serving it (no "
                    "answer within 5 s: exit 2, said so). Given redis://host:6379/0 alone (or nothing, once "
                    "the producer was served with --serve-as): the flows waiting for a result from effects "
                    "beside the consumers on other hosts, as their bridges last published. A producer and a consumer "
                    "that share no registration are refused (exit 2). See docs/operations.md.",
    )
    inspect.add_argument("producer", metavar="PRODUCER_DB")
    inspect.add_argument("consumer", metavar="CONSUMER_DB", nargs="?",
                         help="the consumer's store, or its location on Redis: redis://host:6379/0#NAME (read "
                              "through its bridge; without #NAME: what every registered consumer's bridge "
                              "publishes); default: where the producer is served")
    inspect.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    focus = inspect.add_mutually_exclusive_group()
    focus.add_argument("--flow", metavar="FLOW_ID", help="why this flow waits, on both sides")
    focus.add_argument("--event", metavar="EVENT_ID", help="this event on both sides")
    focus.add_argument("--effect", metavar="KEY", help="this effect (by idempotency key) and its history, in order")
    inspect.add_argument("--stuck-after", type=seconds_type(True), default=300.0, metavar="SECONDS",
                         help="a gap, or a next step pending, older than this is stuck (default 300)")
    compare = sub.add_parser(
        "compare",
        help="compare each consumer's projections with the producer's flows (read only)",
        description="Producer flow (state, seq) against each consumer's projection (state, last_seq), "
                    "flows missing on either side, a consumer ahead of the producer. Never writes. "
                    "Exits 1 on a difference no recorded operator action explains, 2 on an error. "
                    "Each store is a SQLite file or a postgresql://...#schema location.",
    )
    compare.add_argument("producer", metavar="PRODUCER_DB")
    compare.add_argument("consumers", metavar="CONSUMER_DB", nargs="+")
    compare.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    metrics = sub.add_parser(
        "metrics",
        help="the metrics snapshot of a producer store and a consumer store (read only)",
        description="Pending / set-aside / skipped deliveries per consumer with retries and the oldest "
                    "pending age, inbox rows by state, blocked by reason, gaps, effects by state. "
                    "Never writes. Each store is a SQLite file or a postgresql://...#schema location. "
                    "See docs/operations.md, 'Logs and metrics'.",
    )
    metrics.add_argument("producer", metavar="PRODUCER_DB")
    metrics.add_argument("consumer", metavar="CONSUMER_DB")
    metrics_format = metrics.add_mutually_exclusive_group()
    metrics_format.add_argument("--prometheus", action="store_true",
                                help="the Prometheus text exposition format instead of text")
    metrics_format.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    from .worker_cli import add_worker_commands

    add_worker_commands(sub)
    from .bridge_cli import add_bridge_command

    add_bridge_command(sub)
    from .operator_cli import add_operator_commands

    add_operator_commands(sub)
    from .console_cli import add_console_command

    add_console_command(sub)
    return parser


#: What the read-only tools report as exit 2: a store that cannot be read
#: (missing, wrong kind, needs an upgrade, server unreachable), a malformed
#: PostgreSQL location (a ValueError from its parse, e.g. a bad schema), or a
#: PostgreSQL location without the postgres extra installed (ImportError).
_TOOL_ERRORS = (ReliableFlowError, FileNotFoundError, ImportError, ValueError)


def _inspect(args: argparse.Namespace) -> int:
    from .drilldown import (
        effect_report,
        event_report,
        flow_report,
        format_effect_report,
        format_event_report,
        format_flow_report,
    )
    from .inspection import format_report, inspect_files
    from .remote_inspect import check_registered, format_remote_report, is_remote, remote_report

    # A consumer on Redis named (URL#NAME) is read through its bridge, in full; a server alone
    # (every registered consumer) or no location: what the bridges publish.
    remote = args.consumer is None or is_remote(args.consumer) and "#" not in args.consumer
    if remote and any(x is not None for x in (args.flow, args.event, args.effect)):
        print("inspect: --flow, --event and --effect need the consumer's store, or its location on Redis "
              "(redis://host:6379/0#NAME)", file=sys.stderr)
        return 2
    try:
        if not remote and is_remote(args.consumer):
            check_registered(args.producer, args.consumer)
        if remote:
            report = remote_report(args.producer, args.consumer, stuck_after=args.stuck_after)
            text = format_remote_report
        elif args.flow is not None:
            report = flow_report(args.producer, args.consumer, args.flow, stuck_after=args.stuck_after)
            text = format_flow_report
        elif args.event is not None:
            report = event_report(args.producer, args.consumer, args.event, stuck_after=args.stuck_after)
            text = format_event_report
        elif args.effect is not None:
            report = effect_report(args.producer, args.consumer, args.effect, stuck_after=args.stuck_after)
            text = format_effect_report
        else:
            report = inspect_files(args.producer, args.consumer, stuck_after=args.stuck_after)
            text = format_report
    except _TOOL_ERRORS as exc:
        print(f"inspect: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    else:
        print(text(report))
    return 1 if report["attention"] else 0


def _compare(producer: str, consumers: list[str], as_json: bool) -> int:
    from .compare import compare_files, dumps, format_comparison

    try:
        report = compare_files(producer, consumers)
    except _TOOL_ERRORS as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(dumps(report) if as_json else format_comparison(report) + "\n")
    return 1 if report["differences"] else 0


def _metrics(producer: str, consumer: str, prometheus: bool, as_json: bool) -> int:
    from ..metrics import prometheus_text
    from .metrics_report import format_metrics, metrics_files

    try:
        p, c = metrics_files(producer, consumer)
    except _TOOL_ERRORS as exc:
        print(f"metrics: {exc}", file=sys.stderr)
        return 2
    if prometheus:
        sys.stdout.write(prometheus_text([p, c]))
    elif as_json:
        report = {"producer": p.as_dict(), "consumer": c.as_dict()}
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    else:
        print(format_metrics(p, c))
    return 0


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
    if args.command == "inspect":
        return _inspect(args)
    if args.command == "compare":
        return _compare(args.producer, args.consumers, args.json)
    if args.command == "metrics":
        return _metrics(args.producer, args.consumer, args.prometheus, args.json)
    if args.command in ("run", "execute"):
        from .worker_cli import execute_command, run_command

        return run_command(args) if args.command == "run" else execute_command(args)
    if args.command == "bridge":
        from .bridge_cli import bridge_command

        return bridge_command(args)
    if args.command == "console":
        from .console_cli import console_command

        return console_command(args)
    from .operator_cli import run_operator_command

    done = run_operator_command(args)
    if done is not None:
        return done
    parser.print_help(sys.stderr)
    return 2

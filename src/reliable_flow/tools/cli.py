"""Command line: ``python -m reliable_flow`` and the ``reliable-flow`` script."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__
from ..checks import check_seconds
from ..errors import ReliableFlowError

__all__ = ["main"]


def _seconds(allow_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, > 0 (or >= 0 with ``allow_zero``)."""
    def parse(text: str) -> float:
        try:
            return check_seconds("value", float(text), allow_zero=allow_zero)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds {'>= 0' if allow_zero else '> 0'}, got {text!r}"
            ) from None

    return parse


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
        help="summarise a producer store and a consumer store, or why one flow / event is stuck (read only)",
        description="Flows, undelivered and set-aside events per consumer, inbox pending / "
                    "blocked (with reasons) / applied, and gaps per flow; with --flow or --event, that "
                    "flow or event on both sides. Never writes. Exits 1 when something is blocked, set "
                    "aside, or stuck longer than --stuck-after (for alerts), 2 on an error. "
                    "Each store is a SQLite file or a postgresql://...#schema location. "
                    "See docs/operations.md.",
    )
    inspect.add_argument("producer", metavar="PRODUCER_DB")
    inspect.add_argument("consumer", metavar="CONSUMER_DB")
    inspect.add_argument("--json", action="store_true", help="machine-readable JSON instead of text")
    focus = inspect.add_mutually_exclusive_group()
    focus.add_argument("--flow", metavar="FLOW_ID", help="why this flow waits, on both sides")
    focus.add_argument("--event", metavar="EVENT_ID", help="this event on both sides")
    inspect.add_argument("--stuck-after", type=_seconds(True), default=300.0, metavar="SECONDS",
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
    run = sub.add_parser(
        "run",
        help="relay and apply continuously until SIGTERM / SIGINT",
        description="A worker loop over one producer and its consumers (see docs/worker.md).",
    )
    run.add_argument("--producer", required=True, metavar="PATH", help="the producer file")
    run.add_argument(
        "--consumer", required=True, action="append", metavar="NAME=PATH",
        help="a consumer name and its file; repeat for several consumers",
    )
    run.add_argument(
        "--protocol", default="reliable_flow.reservation:RESERVATION", metavar="MODULE:ATTR",
        help="the protocol object to import (default: %(default)s)",
    )
    run.add_argument("--schemas", metavar="N,N", help="schemas the consumers decode (default: the protocol's)")
    run.add_argument("--handlers", metavar="MODULE:ATTR", help="a list of apply handlers the consumers run")
    run.add_argument("--effects", metavar="MODULE:ATTR",
                     help="an Effects registry: the consumers may schedule these effects and the worker runs them")
    run.add_argument("--app-schema", metavar="MODULE:ATTR", help="the application's own tables (an AppSchema)")
    run.add_argument("--lease", type=_seconds(False), default=30.0, metavar="SECONDS",
                     help="relay lease (default 30)")
    run.add_argument("--effect-lease", type=_seconds(False), default=30.0, metavar="SECONDS",
                     help="effect lease, longer than any effect function's own timeout (default 30)")
    run.add_argument("--idle-sleep", type=_seconds(True), default=0.5, metavar="SECONDS",
                     help="how long to sleep after a pass that found nothing (default 0.5)")
    run.add_argument("--report-every", type=_seconds(True), default=10.0, metavar="SECONDS",
                     help="print progress counts to stderr this often (0: only at exit)")
    run.add_argument("--register", action="store_true",
                     help="register consumer names the producer does not know yet (each gets every event "
                          "from the first one); without it an unknown name is refused, except the first "
                          "consumer of a producer that has none")
    until = run.add_mutually_exclusive_group()
    until.add_argument("--once", action="store_true",
                       help="run one pass and exit: at most 100 relays per consumer (the worker's "
                            "relay_batch), then apply and effects once; not 'until idle': events leased or "
                            "backing off are left for later")
    until.add_argument("--until-idle", action="store_true",
                       help="run passes until one does no work and nothing waits for a lease or backoff "
                            "to end (waiting those out), then exit 0")
    return parser


#: What the read-only tools report as exit 2: a store that cannot be read
#: (missing, wrong kind, needs an upgrade, server unreachable), a malformed
#: PostgreSQL location (a ValueError from its parse, e.g. a bad schema), or a
#: PostgreSQL location without the postgres extra installed (ImportError).
_TOOL_ERRORS = (ReliableFlowError, FileNotFoundError, ImportError, ValueError)


def _inspect(args: argparse.Namespace) -> int:
    from .drilldown import event_report, flow_report, format_event_report, format_flow_report
    from .inspection import format_report, inspect_files

    try:
        if args.flow is not None:
            report = flow_report(args.producer, args.consumer, args.flow, stuck_after=args.stuck_after)
            text = format_flow_report
        elif args.event is not None:
            report = event_report(args.producer, args.consumer, args.event, stuck_after=args.stuck_after)
            text = format_event_report
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


def _load(option: str, spec: str, check: Callable[[Any], bool], what: str) -> Any:
    """``module:ATTRIBUTE``, importable from the current directory as with ``python -m``."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"run: {option} must look like module:ATTRIBUTE, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj = getattr(importlib.import_module(module_name), attr, None)
    if not check(obj):
        raise SystemExit(f"run: {spec} is not {what}")
    return obj


def _load_protocol(spec: str) -> Any:
    from ..protocol import Protocol

    return _load("--protocol", spec, lambda o: isinstance(o, Protocol), "a reliable_flow Protocol")


def _load_app(args: argparse.Namespace) -> dict[str, Any]:
    """The consumer's handlers, effects registry and application schema, if named."""
    from ..effects import Effects
    from ..handlers import AppSchema

    app: dict[str, Any] = {}
    if args.handlers:
        app["handlers"] = _load("--handlers", args.handlers,
                                lambda o: isinstance(o, (list, tuple)) and all(callable(h) for h in o),
                                "a list of handler functions")
    if args.effects:
        app["effects"] = _load("--effects", args.effects, lambda o: isinstance(o, Effects),
                               "a reliable_flow Effects registry")
    if args.app_schema:
        app["app_schema"] = _load("--app-schema", args.app_schema, lambda o: isinstance(o, AppSchema),
                                  "a reliable_flow AppSchema")
    return app


def _run(args: argparse.Namespace) -> int:
    import time

    from ..consumer import Consumer
    from ..errors import ReliableFlowError
    from ..executor import EffectExecutor
    from ..producer import Producer
    from ..relay import DeliveryPolicy
    from ..worker import Worker, WorkerStats

    protocol = _load_protocol(args.protocol)
    app = _load_app(args)
    schemas = None
    if args.schemas:
        try:
            schemas = {int(x) for x in args.schemas.split(",")}
        except ValueError:
            raise SystemExit(f"run: --schemas must be comma-separated ints, got {args.schemas!r}") from None
    pairs = []
    for item in args.consumer:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"run: --consumer must look like NAME=PATH, got {item!r}")
        pairs.append((name, path))
    consumers: list[Consumer] = []
    try:
        producer = Producer(args.producer, protocol)
    except (ReliableFlowError, ValueError) as exc:
        print(f"run: {exc}", file=sys.stderr)
        return 2
    try:
        for name, path in pairs:
            consumers.append(Consumer(path, protocol, name=name, schemas=schemas, **app))
    except (ReliableFlowError, ValueError) as exc:
        for c in consumers:
            c.close()
        producer.close()
        print(f"run: {exc}", file=sys.stderr)
        return 2
    last = [time.monotonic()]

    def report(stats: WorkerStats) -> None:
        if args.report_every > 0 and time.monotonic() - last[0] >= args.report_every:
            last[0] = time.monotonic()
            print(f"run: {json.dumps(stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)

    policy = DeliveryPolicy(lease_seconds=args.lease)
    effect_policy = DeliveryPolicy(lease_seconds=args.effect_lease)
    executors = [EffectExecutor(c, policy=effect_policy, producer=producer) for c in consumers] if "effects" in app else []
    try:
        worker = Worker(
            producer, consumers, policy=policy, idle_sleep=args.idle_sleep, on_pass=report, executors=executors,
            register=args.register,
        )
    except ReliableFlowError as exc:  # a consumer name the producer has not registered
        for c in consumers:
            c.close()
        producer.close()
        print(f"run: {exc}", file=sys.stderr)
        return 2
    failure: ReliableFlowError | None = None
    try:
        worker.run(max_passes=1 if args.once else None, until_idle=args.until_idle)
    except ReliableFlowError as exc:  # the worker raises only what retrying cannot heal
        failure = exc
    finally:
        for c in consumers:
            c.close()
        producer.close()
    print(f"run: stopped: {json.dumps(worker.stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"run: cannot go on: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
        return 2
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
    if args.command == "run":
        return _run(args)
    parser.print_help(sys.stderr)
    return 2

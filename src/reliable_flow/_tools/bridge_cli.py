"""``reliable-flow bridge``: serve one consumer to producers on other hosts
through a Redis server (:class:`reliable_flow.transport.redis.Bridge`).
Stops on SIGTERM / SIGINT after the request in progress is answered (exit
0); exit 2 on an error, the message prefixed by ``bridge:``.  See
docs/transport.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from ..delivery import DEFAULT_LEASE_SECONDS
from ..errors import ReliableFlowError
from .loading import DEFAULT_PROTOCOL, OptionError

__all__ = ["add_bridge_command", "bridge_command"]


def add_bridge_command(sub: Any, seconds: Callable[[bool], Callable[[str], float]],
                       count: Callable[[str], int]) -> None:
    """Add ``bridge`` to the subcommands ``sub``."""
    bridge = sub.add_parser(
        "bridge", help="serve a consumer to producers on other hosts through Redis, until SIGTERM / SIGINT",
        description="Reads the requests that workers elsewhere send with `run --to redis://...` (or a "
                    "RedisReceiver), stores and applies them in CONSUMER, answers, and acknowledges each "
                    "request only after the inbox commit; also applies what waits and runs the consumer's "
                    "effects, as `run` does. See docs/transport.md.",
    )
    bridge.add_argument("consumer", metavar="CONSUMER", help="the consumer's store (a file or postgresql://...#schema)")
    bridge.add_argument("--redis", required=True, metavar="URL",
                        help="the Redis server: redis://host:port/db, rediss://..., unix:///path?db=0")
    bridge.add_argument("--name", metavar="NAME", help="the consumer's name (default: the store's own)")
    bridge.add_argument("--bridge-name", metavar="NAME",
                        help="this bridge's name in the Redis consumer group (default: host:pid); several "
                             "bridges for one consumer need different names")
    bridge.add_argument("--protocol", default=DEFAULT_PROTOCOL, metavar="MODULE:ATTR",
                        help="the protocol object to import (default: %(default)s)")
    bridge.add_argument("--schemas", metavar="N,N", help="schemas the consumer decodes (default: the protocol's)")
    bridge.add_argument("--handlers", metavar="MODULE:ATTR", help="a list of apply handlers")
    bridge.add_argument("--effects", metavar="MODULE:ATTR", help="an EffectRegistry the bridge runs")
    bridge.add_argument("--app-schema", metavar="MODULE:ATTR", help="the application's own tables (an AppSchema)")
    bridge.add_argument("--producer", metavar="PATH", help="where results of effects with feedback= are advanced")
    bridge.add_argument("--effect-lease", type=seconds(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                        help=f"effect lease (default {DEFAULT_LEASE_SECONDS:g})")
    bridge.add_argument("--concurrency", type=count, default=1, metavar="N",
                        help="effect calls in flight at once (default 1)")
    bridge.add_argument("--claim-after", type=seconds(False), default=10.0, metavar="SECONDS",
                        help="take over requests another bridge left unacknowledged this long (default 10)")
    bridge.add_argument("--report-every", type=seconds(True), default=10.0, metavar="SECONDS",
                        help="print progress counts to stderr this often (0: only at exit)")
    bridge.add_argument("--once", action="store_true", help="one pass, then exit")


def bridge_command(args: argparse.Namespace) -> int:
    """``reliable-flow bridge``: 0 when stopped, 2 on an error."""
    try:
        return _bridge(args)
    except OptionError as exc:
        print(f"bridge: {exc}", file=sys.stderr)
        return 2


def _bridge(args: argparse.Namespace) -> int:
    from .._consumer import Consumer
    from .._executor import EffectExecutor
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .worker_cli import load_option

    try:
        from ..transport.redis import Bridge, BridgeStats
    except ImportError as exc:
        raise OptionError(str(exc)) from None
    protocol = load_option("protocol", args.protocol)
    app = {key: load_option(key, getattr(args, key)) for key in ("handlers", "effects", "app_schema")
           if getattr(args, key)}
    schemas = None
    if args.schemas:
        try:
            schemas = {int(x) for x in args.schemas.split(",")}
        except ValueError:
            raise OptionError(f"--schemas must be comma-separated ints, got {args.schemas!r}") from None
    opened: list[Any] = []
    last = [time.monotonic()]

    def report(stats: BridgeStats) -> None:
        if args.report_every > 0 and time.monotonic() - last[0] >= args.report_every:
            last[0] = time.monotonic()
            print(f"bridge: {json.dumps(stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)

    try:
        consumer = Consumer(args.consumer, protocol, name=args.name, schemas=schemas, **app)
        opened.append(consumer)
        producer = None
        if args.producer is not None:
            producer = Producer(args.producer, protocol)
            opened.append(producer)
        executors = []
        if "effects" in app:
            executors.append(EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=args.effect_lease),
                                            producer=producer, concurrency=args.concurrency))
        bridge = Bridge(consumer, args.redis, executors=executors, name=args.bridge_name,
                        claim_after=args.claim_after, on_pass=report)
    except (ReliableFlowError, ValueError) as exc:
        for thing in reversed(opened):
            thing.close()
        raise OptionError(str(exc)) from None
    from ..transport.redis._connect import shown

    print(f"bridge: serving consumer {consumer.name!r} ({consumer.location}) through {shown(args.redis)}",
          file=sys.stderr, flush=True)
    failure: ReliableFlowError | None = None
    try:
        bridge.run(max_passes=1 if args.once else None)
    except ReliableFlowError as exc:  # only what retrying cannot heal
        failure = exc
    finally:
        bridge.close()
        for thing in reversed(opened):
            thing.close()
    print(f"bridge: stopped: {json.dumps(bridge.stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"bridge: cannot go on: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
        return 2
    return 0

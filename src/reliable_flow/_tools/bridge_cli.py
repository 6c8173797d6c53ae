"""``reliable-flow bridge``: serve one consumer to producers on other hosts
through a Redis server (:class:`reliable_flow.transport.redis.Bridge`).
Stops on SIGTERM / SIGINT after the request in progress is answered (exit
0); exit 2 on an error, the message prefixed by ``bridge:``.  See
docs/transport.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..delivery import DEFAULT_LEASE_SECONDS
from ._cli_common import (
    EarlySignals,
    Opened,
    add_shared,
    command,
    count_type,
    is_remote,
    opening,
    reporter,
    schemas_option,
    seconds_type,
    serve,
)
from .loading import OptionError, protocol_for

__all__ = ["add_bridge_command", "bridge_command"]


def add_bridge_command(sub: Any) -> None:
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
    add_shared(bridge, "--protocol")
    bridge.add_argument("--schemas", metavar="N,N", help="schemas the consumer decodes (default: the protocol's)")
    bridge.add_argument("--handlers", metavar="MODULE:ATTR", help="a list of apply handlers")
    bridge.add_argument("--effects", metavar="MODULE:ATTR", help="an EffectRegistry the bridge runs")
    bridge.add_argument("--app-schema", metavar="MODULE:ATTR", help="the application's own tables (an AppSchema)")
    add_shared(bridge, "--producer")
    bridge.add_argument("--effect-lease", type=seconds_type(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                        help=f"effect lease (default {DEFAULT_LEASE_SECONDS:g})")
    bridge.add_argument("--concurrency", type=count_type, default=1, metavar="N",
                        help="effect calls in flight at once (default 1)")
    bridge.add_argument("--claim-after", type=seconds_type(False), default=10.0, metavar="SECONDS",
                        help="take over requests another bridge left unacknowledged this long (default 10)")
    bridge.add_argument("--allow-actions", action="store_true",
                        help="run operator actions sent from other hosts (skip / replace an inbox event, retry / "
                             "resolve / amend / cancel an effect; `inspect`, the console and the operator commands "
                             "given redis://...#NAME), recorded here; refused without it. Anyone who can write "
                             "to the consumer's Redis keys can ask: see docs/transport.md, 'Security'")
    bridge.add_argument("--no-questions", action="store_true",
                        help="answer no operator's reads from other hosts (`inspect` and the console given "
                             "redis://...#NAME then time out)")
    add_shared(bridge, "--report-every")
    bridge.add_argument("--once", action="store_true", help="one pass, then exit")


def bridge_command(args: argparse.Namespace) -> int:
    """``reliable-flow bridge``: 0 when stopped, 2 on an error."""
    with EarlySignals() as signals:
        return command("bridge", lambda: _bridge(args, signals))


def _bridge(args: argparse.Namespace, signals: EarlySignals) -> int:
    from .._consumer import Consumer
    from .._effects.executor import EffectExecutor
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .worker_cli import load_option

    try:
        from ..transport.redis import Bridge
    except ImportError as exc:
        raise OptionError(str(exc)) from None
    local = None if is_remote(args.producer) else args.producer
    protocol = protocol_for(args.protocol, ("consumer", args.consumer), ("producer", local))
    app = {key: load_option(key, getattr(args, key)) for key in ("handlers", "effects", "app_schema")
           if getattr(args, key)}
    schemas = schemas_option(args.schemas)
    opened = Opened()
    report = reporter("bridge", args.report_every)
    with opening(opened.close):
        consumer = opened.add(Consumer(args.consumer, protocol, name=args.name, schemas=schemas, **app))
        producer = args.producer if local is None else opened.add(Producer(local, protocol))
        executors = []
        if "effects" in app:
            executors.append(opened.add(EffectExecutor(  # closed: a remote producer it opened goes too
                consumer, policy=DeliveryPolicy(lease_seconds=args.effect_lease), producer=producer,
                concurrency=args.concurrency)))
        bridge = Bridge(consumer, args.redis, executors=executors, name=args.bridge_name,
                        claim_after=args.claim_after, on_pass=report, questions=not args.no_questions,
                        allow_actions=args.allow_actions)
    signals.watch(bridge)
    from ..transport.redis._connect import shown

    print(f"bridge: serving consumer {consumer.name!r} ({consumer.location}) through {shown(args.redis)}",
          file=sys.stderr, flush=True)

    def close_all() -> None:
        bridge.close()
        opened.close()

    return serve("bridge", bridge, lambda: bridge.run(max_passes=1 if args.once else None), close_all)

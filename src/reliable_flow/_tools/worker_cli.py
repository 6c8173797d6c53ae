"""The long-running commands: ``reliable-flow run`` (relay, apply and run
effects for a producer's consumers) and ``reliable-flow execute`` (run one
consumer's effects).  Both stop on SIGTERM / SIGINT after the step in
progress is recorded (exit 0), and exit 2 on an error, with the message
prefixed by the command's name.  See docs/worker.md and docs/effects.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ..delivery import DEFAULT_LEASE_SECONDS
from ..errors import ReliableFlowError
from ._cli_common import (
    RELAY_ONLY,
    Caught,
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
    stopped,
)
from .loading import OptionError, load, protocol_for

__all__ = ["add_worker_commands", "execute_command", "load_option", "run_command"]

# The options of `run` given per consumer (NAME=MODULE:ATTR); _load_one checks what they import.
_APP_OPTIONS = ("handlers", "effects", "app_schema")


def add_worker_commands(sub: Any) -> None:
    """Add ``run`` and ``execute`` to the subcommands ``sub``."""
    lease = f"{DEFAULT_LEASE_SECONDS:g}"
    run = sub.add_parser(
        "run", help="relay and apply continuously until SIGTERM / SIGINT",
        description="A worker loop over one producer and its consumers (see docs/worker.md).",
    )
    run.add_argument("--producer", required=True, metavar="PATH", help="the producer file")
    run.add_argument("--consumer", required=True, action="append", metavar="NAME=PATH",
                     help="a consumer name and its file; repeat for several consumers (with --to: only "
                          "the NAME of a consumer served by `reliable-flow bridge` on another host)")
    run.add_argument("--to", metavar="URL",
                     help="relay only, through the Redis server at URL (redis://host:port/db or "
                          "unix:///path?db=0), to consumers served there by `reliable-flow bridge`; "
                          "applying and effects happen at the bridge (docs/transport.md)")
    run.add_argument("--serve-as", metavar="NAME",
                     help="with --to: also serve this producer as NAME to effect executors on other hosts "
                          "(`bridge|execute --producer URL#NAME`): the results and failure steps they feed "
                          "back are advanced here (docs/transport.md)")
    run.add_argument("--send-timeout", type=seconds_type(False), metavar="SECONDS",
                     help="with --to: how long a request waits for the bridge's answer before it counts as a "
                          "failed send, retried after backoff (default 10; keep it below --lease)")
    add_shared(run, "--protocol")
    run.add_argument("--schemas", metavar="N,N", help="schemas the consumers decode (default: the protocol's)")
    each = " (NAME=MODULE:ATTR: for that consumer only, repeatable; MODULE:ATTR: for every other consumer)"
    run.add_argument("--handlers", action="append", metavar="[NAME=]MODULE:ATTR",
                     help="a list of apply handlers the consumers run" + each)
    run.add_argument("--effects", action="append", metavar="[NAME=]MODULE:ATTR",
                     help="an EffectRegistry: the consumers may schedule these effects and the worker "
                          "runs them" + each)
    run.add_argument("--app-schema", action="append", metavar="[NAME=]MODULE:ATTR",
                     help="the application's own tables (an AppSchema)" + each)
    run.add_argument("--lease", type=seconds_type(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                     help=f"relay lease (default {lease}, as for Worker)")
    run.add_argument("--effect-lease", type=seconds_type(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                     help=f"effect lease, longer than any effect function's own timeout (default {lease})")
    run.add_argument("--concurrency", type=count_type, default=1, metavar="N",
                     help="effect calls in flight at once per consumer, off the worker's thread (default 1)")
    add_shared(run, "--idle-sleep", "--report-every")
    run.add_argument("--register", action="store_true",
                     help="register consumer names the producer does not know yet (each gets every event "
                          "from the first one); without it an unknown name is refused, except the first "
                          "consumer of a producer that has none")
    run.add_argument("--async", dest="use_async", action="store_true",
                     help="run an AsyncWorker on one asyncio event loop (reliable_flow.aio): relays, applies "
                          "and effect calls at once, async def effect functions awaited on that loop; the same "
                          "options, progress lines, stop on SIGTERM / SIGINT and exit codes")
    until = run.add_mutually_exclusive_group()
    until.add_argument("--once", action="store_true",
                       help="run one pass and exit: at most 100 relays per consumer (the worker's "
                            "relay_batch), then apply and effects once; not 'until idle': events leased or "
                            "backing off are left for later")
    until.add_argument("--until-idle", action="store_true",
                       help="run passes until one does no work and nothing waits for a lease or backoff "
                            "to end (waiting those out), then exit 0")
    execute = sub.add_parser(
        "execute", help="run one consumer's effects until SIGTERM / SIGINT",
        description="An effect executor over one consumer store (a SQLite file or a postgresql://...#schema "
                    "location): claims due effects, calls them, records each outcome and feeds results "
                    "back into --producer. SIGTERM / SIGINT let the call in progress finish and be "
                    "recorded, then exit 0; exit 2 on an error. See docs/effects.md.",
    )
    execute.add_argument("consumer", metavar="CONSUMER", help="the consumer's store")
    execute.add_argument("--effects", required=True, metavar="MODULE:ATTR",
                         help="the EffectRegistry to run (only its names are claimed)")
    add_shared(execute, "--producer", "--protocol")
    execute.add_argument("--lease", type=seconds_type(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                         help=f"effect lease, longer than any effect function's own timeout (default {lease})")
    execute.add_argument("--concurrency", type=count_type, default=1, metavar="N",
                         help="effect calls in flight at once (default 1: one at a time, in the executor's "
                              "own thread); plain functions run on threads, async def ones on the "
                              "executor's event loop")
    add_shared(execute, "--idle-sleep")
    execute.add_argument("--until-idle", action="store_true",
                         help="exit 0 once nothing is pending, running or in doubt (waiting out leases and "
                              "backoffs); what waits for a person (unknown, dead) does not count")
    execute.add_argument("--async", dest="use_async", action="store_true",
                         help="run an AsyncEffectExecutor on one asyncio event loop (reliable_flow.aio): "
                              "async def effect functions awaited on that loop; the same options, stop on "
                              "SIGTERM / SIGINT and exit codes")


# -- loading module:ATTR -----------------------------------------------------------------


def load_option(key: str, spec: str) -> Any:
    """``--KEY MODULE:ATTR`` imported and checked (protocol, handlers, effects, app_schema)."""
    return _load_one(key, spec)


def _load_one(key: str, spec: str) -> Any:
    from .._effects import EffectRegistry
    from .._handlers import AppSchema
    from ..protocol import Protocol

    checks: dict[str, tuple[Callable[[Any], bool], str]] = {
        "protocol": (lambda o: isinstance(o, Protocol), "a reliable_flow Protocol"),
        "handlers": (lambda o: isinstance(o, (list, tuple)) and all(callable(h) for h in o),
                     "a list of handler functions"),
        "effects": (lambda o: isinstance(o, EffectRegistry), "a reliable_flow EffectRegistry"),
        "app_schema": (lambda o: isinstance(o, AppSchema), "a reliable_flow AppSchema"),
    }
    check, what = checks[key]
    return load(f"--{key.replace('_', '-')}", spec, check, what)


def per_consumer(option: str, values: list[str] | None, names: list[str]) -> dict[str, str]:
    """Consumer name -> ``module:ATTR`` for one option: ``NAME=module:ATTR``
    for that consumer, a plain ``module:ATTR`` for every consumer not named
    (as before per-consumer values existed).  Refused: a NAME that is not a
    consumer, a consumer (or "every consumer") given twice."""
    common: str | None = None
    own: dict[str, str] = {}
    for value in values or ():
        name, sep, spec = value.partition("=")  # a module path never holds "="
        if not sep:
            if common is not None:
                raise OptionError(f"{option} is given twice for every consumer: {common!r} and {value!r}")
            common = value
            continue
        if name not in names:
            raise OptionError(f"{option} {value!r} names consumer {name!r}, which is not one of --consumer: "
                           f"{', '.join(names)}")
        if name in own:
            raise OptionError(f"{option} is given twice for consumer {name!r}")
        own[name] = spec
    return {n: own[n] for n in names if n in own} | ({n: common for n in names if n not in own} if common else {})


def _apps(args: argparse.Namespace, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each consumer's handlers, effects registry and application schema, if named."""
    apps: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key in _APP_OPTIONS:
        for name, spec in per_consumer(f"--{key.replace('_', '-')}", getattr(args, key), names).items():
            apps[name][key] = _load_one(key, spec)
    return apps


# -- run ---------------------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    """``reliable-flow run``: 0 when stopped (signal, --once, --until-idle), 2 on an error."""
    with EarlySignals() as signals:
        return command("run", lambda: _run(args, signals))


def _run(args: argparse.Namespace, signals: EarlySignals) -> int:
    from .._consumer import Consumer
    from .._effects.executor import EffectExecutor
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .._worker import Worker

    if args.to is not None:
        return _run_remote(args, signals)
    if args.send_timeout is not None:
        raise OptionError("--send-timeout is for run --to (a consumer on another host)")
    if args.serve_as is not None:
        raise OptionError("--serve-as needs --to: the producer is served through that Redis server")
    pairs = []
    for item in args.consumer:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise OptionError(f"--consumer must look like NAME=PATH, got {item!r}")
        pairs.append((name, path))
    names = [name for name, _ in pairs]
    protocol = protocol_for(args.protocol, ("producer", args.producer), *(("consumer", path) for _, path in pairs))
    apps = _apps(args, names)
    schemas = schemas_option(args.schemas)
    if args.use_async:
        import asyncio

        return asyncio.run(_run_async(args, signals, pairs, protocol, apps, schemas))
    consumers: list[Consumer] = []
    with opening():
        producer = Producer(args.producer, protocol)
    report = reporter("run", args.report_every)

    def close() -> None:
        for c in consumers:
            c.close()
        producer.close()

    with opening(close):
        for name, path in pairs:
            consumers.append(Consumer(path, protocol, name=name, schemas=schemas, **apps[name]))
        effect_policy = DeliveryPolicy(lease_seconds=args.effect_lease)  # each executor claims as itself
        executors = [EffectExecutor(c, policy=effect_policy, producer=producer, concurrency=args.concurrency)
                     for c in consumers if "effects" in apps[c.name]]
        # ReliableFlowError: e.g. a consumer name the producer has not registered
        worker = Worker(producer, consumers, policy=DeliveryPolicy(lease_seconds=args.lease),
                        idle_sleep=args.idle_sleep, on_pass=report, executors=executors, register=args.register)
    signals.watch(worker)
    return serve("run", worker, lambda: worker.run(max_passes=1 if args.once else None,
                                                   until_idle=args.until_idle), close)


def _run_remote(args: argparse.Namespace, signals: EarlySignals) -> int:
    """``run --to URL``: a relay-only :class:`Worker` whose consumers are
    :class:`~reliable_flow.transport.redis.RedisReceiver` objects."""
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .._worker import Worker

    for option in ("handlers", "effects", "app_schema", "schemas"):
        if getattr(args, option):
            raise OptionError(f"--{option.replace('_', '-')} belongs to the bridge on the consumer's host, "
                              f"not to run --to")
    if args.use_async:
        raise OptionError("--async is not available with --to (the relay waits on the network, not on a store)")
    try:
        from ..transport.redis import RedisReceiver
        from ..transport.redis._connect import shown, talking
    except ImportError as exc:
        raise OptionError(str(exc)) from None
    protocol = protocol_for(args.protocol, ("producer", args.producer))
    receivers: list[RedisReceiver] = []

    def close_receivers() -> None:
        for r in receivers:
            r.close()

    with opening(close_receivers):
        for name in args.consumer:
            if "=" in name:
                raise OptionError(f"with --to, --consumer is a consumer's NAME only, got {name!r}")
            if args.send_timeout is None:
                receivers.append(RedisReceiver(args.to, name))
            else:
                receivers.append(RedisReceiver(args.to, name, timeout=args.send_timeout))
        talking(args.to, "", lambda: _ping(args.to))
    with opening():
        producer = Producer(args.producer, protocol)
    report = reporter("run", args.report_every, RELAY_ONLY)  # nothing is applied here, no effect runs
    with opening(producer.close):
        worker = Worker(producer, receivers, policy=DeliveryPolicy(lease_seconds=args.lease),
                        idle_sleep=args.idle_sleep, on_pass=report, register=args.register,
                        serve_as=args.serve_as)
    signals.watch(worker)
    serving = "" if args.serve_as is None else f", serving the producer as {args.serve_as!r}"
    print(f"run: relaying to {', '.join(args.consumer)} through {shown(args.to)}{serving}", file=sys.stderr,
          flush=True)

    def close() -> None:
        close_receivers()
        producer.close()

    return serve("run", worker, lambda: worker.run(max_passes=1 if args.once else None,
                                                   until_idle=args.until_idle), close, RELAY_ONLY)


def _ping(url: str) -> None:
    """Reach the Redis server once (a clear error at start, not on the first pass)."""
    from ..transport.redis._connect import connect

    client = connect(url, timeout=5.0)
    try:
        client.ping()
    finally:
        client.close()


async def _run_async(args: argparse.Namespace, signals: EarlySignals, pairs: list[tuple[str, str]], protocol: Any,
                     apps: dict[str, dict[str, Any]], schemas: set[int] | None) -> int:
    """``run --async``: :func:`_run` with the aio face, on the running loop."""
    from .._relay import DeliveryPolicy
    from ..aio import AsyncConsumer, AsyncProducer
    from ..aio._executor import AsyncEffectExecutor
    from ..aio._worker import AsyncWorker

    consumers: list[AsyncConsumer] = []
    with opening():
        producer = await AsyncProducer.open(args.producer, protocol)
    report = reporter("run", args.report_every)

    async def close_all() -> None:
        for c in consumers:
            await c.close()
        await producer.close()

    try:
        for name, path in pairs:
            consumers.append(await AsyncConsumer.open(path, protocol, name=name, schemas=schemas, **apps[name]))
        effect_policy = DeliveryPolicy(lease_seconds=args.effect_lease)  # each executor claims as itself
        executors = [AsyncEffectExecutor(c, policy=effect_policy, producer=producer, concurrency=args.concurrency)
                     for c in consumers if "effects" in apps[c.name]]
        worker = AsyncWorker(producer, consumers, policy=DeliveryPolicy(lease_seconds=args.lease),
                             idle_sleep=args.idle_sleep, on_pass=report, executors=executors,
                             register=args.register)
    except (ReliableFlowError, ValueError) as exc:
        await close_all()
        raise OptionError(str(exc)) from None
    signals.watch(worker)
    caught = Caught()
    try:
        with caught:
            await worker.run(max_passes=1 if args.once else None, until_idle=args.until_idle)
    finally:
        await close_all()
    return stopped("run", worker.stats, caught.failure)


# -- execute -----------------------------------------------------------------------------


def execute_command(args: argparse.Namespace) -> int:
    """``reliable-flow execute``: 0 when stopped (signal, --until-idle), 2 on an error."""
    return command("execute", lambda: _execute(args))


def _execute(args: argparse.Namespace) -> int:
    from .._consumer import Consumer
    from .._effects.executor import EffectExecutor
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .._store.open import is_postgres

    local = None if is_remote(args.producer) else args.producer
    protocol = protocol_for(args.protocol, ("consumer", args.consumer), ("producer", local))
    effects = _load_one("effects", args.effects)
    if not is_postgres(args.consumer) and not os.path.isfile(args.consumer):
        raise OptionError(f"no consumer file at {args.consumer!r}")  # executing creates nothing
    if args.use_async:
        import asyncio

        return asyncio.run(_execute_async(args, protocol, effects, local))
    opened = Opened()
    with opening(opened.close):
        consumer = opened.add(Consumer(args.consumer, protocol, effects=effects))
        producer = args.producer if local is None else opened.add(Producer(local, protocol))
        executor = EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=args.lease), producer=producer,
                                  concurrency=args.concurrency)
        opened.add(executor)  # closes a remote producer it opened
    return serve("execute", executor, lambda: executor.run(until_idle=args.until_idle,
                                                           idle_sleep=args.idle_sleep), opened.close)


async def _execute_async(args: argparse.Namespace, protocol: Any, effects: Any, local: str | None) -> int:
    """``execute --async``: :func:`_execute` with the aio face, on the running loop."""
    from .._relay import DeliveryPolicy
    from ..aio import AsyncConsumer, AsyncEffectExecutor, AsyncProducer

    opened: list[AsyncConsumer | AsyncProducer] = []

    async def close() -> None:
        for thing in reversed(opened):
            await thing.close()

    try:
        with opening():
            consumer = await AsyncConsumer.open(args.consumer, protocol, effects=effects)
            opened.append(consumer)
            producer: Any = args.producer  # None, or a producer on another host (its location)
            if local is not None:
                producer = await AsyncProducer.open(local, protocol)
                opened.append(producer)
            executor = AsyncEffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=args.lease),
                                           producer=producer, concurrency=args.concurrency)
    except OptionError:
        await close()
        raise
    caught = Caught()
    try:
        with caught:
            await executor.run(until_idle=args.until_idle, idle_sleep=args.idle_sleep)
    finally:
        await executor.close()
        await close()
    return stopped("execute", executor.stats, caught.failure)

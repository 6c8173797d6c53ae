"""The long-running commands: ``reliable-flow run`` (relay, apply and run
effects for a producer's consumers) and ``reliable-flow execute`` (run one
consumer's effects).  Both stop on SIGTERM / SIGINT after the step in
progress is recorded (exit 0), and exit 2 on an error, with the message
prefixed by the command's name.  See docs/worker.md and docs/effects.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..delivery import DEFAULT_LEASE_SECONDS
from ..errors import ReliableFlowError
from .loading import DEFAULT_PROTOCOL, OptionError, load

__all__ = ["add_worker_commands", "execute_command", "load_option", "run_command"]

# The options of `run` given per consumer (NAME=MODULE:ATTR); _load_one checks what they import.
_APP_OPTIONS = ("handlers", "effects", "app_schema")


def add_worker_commands(sub: Any, seconds: Callable[[bool], Callable[[str], float]]) -> None:
    """Add ``run`` and ``execute`` to the subcommands ``sub``; ``seconds(allow_zero)``
    is the argparse type of a duration."""
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
    run.add_argument("--send-timeout", type=seconds(False), metavar="SECONDS",
                     help="with --to: how long a request waits for the bridge's answer before it counts as a "
                          "failed send, retried after backoff (default 10; keep it below --lease)")
    run.add_argument("--protocol", default=DEFAULT_PROTOCOL, metavar="MODULE:ATTR",
                     help="the protocol object to import (default: %(default)s)")
    run.add_argument("--schemas", metavar="N,N", help="schemas the consumers decode (default: the protocol's)")
    each = " (NAME=MODULE:ATTR: for that consumer only, repeatable; MODULE:ATTR: for every other consumer)"
    run.add_argument("--handlers", action="append", metavar="[NAME=]MODULE:ATTR",
                     help="a list of apply handlers the consumers run" + each)
    run.add_argument("--effects", action="append", metavar="[NAME=]MODULE:ATTR",
                     help="an EffectRegistry: the consumers may schedule these effects and the worker "
                          "runs them" + each)
    run.add_argument("--app-schema", action="append", metavar="[NAME=]MODULE:ATTR",
                     help="the application's own tables (an AppSchema)" + each)
    run.add_argument("--lease", type=seconds(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                     help=f"relay lease (default {lease}, as for Worker)")
    run.add_argument("--effect-lease", type=seconds(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                     help=f"effect lease, longer than any effect function's own timeout (default {lease})")
    run.add_argument("--concurrency", type=_count, default=1, metavar="N",
                     help="effect calls in flight at once per consumer, off the worker's thread (default 1)")
    run.add_argument("--idle-sleep", type=seconds(True), default=0.5, metavar="SECONDS",
                     help="how long to sleep after a pass that found nothing (default 0.5)")
    run.add_argument("--report-every", type=seconds(True), default=10.0, metavar="SECONDS",
                     help="print progress counts to stderr this often (0: only at exit)")
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
    execute.add_argument("--producer", metavar="PATH", help="where results of effects with feedback= are advanced")
    execute.add_argument("--protocol", default=DEFAULT_PROTOCOL, metavar="MODULE:ATTR",
                         help="the protocol object to import (default: %(default)s)")
    execute.add_argument("--lease", type=seconds(False), default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                         help=f"effect lease, longer than any effect function's own timeout (default {lease})")
    execute.add_argument("--concurrency", type=_count, default=1, metavar="N",
                         help="effect calls in flight at once (default 1: one at a time, in the executor's "
                              "own thread); plain functions run on threads, async def ones on the "
                              "executor's event loop")
    execute.add_argument("--idle-sleep", type=seconds(True), default=0.5, metavar="SECONDS",
                         help="how long to sleep after a pass that found nothing (default 0.5)")
    execute.add_argument("--until-idle", action="store_true",
                         help="exit 0 once nothing is pending, running or in doubt (waiting out leases and "
                              "backoffs); what waits for a person (unknown, dead) does not count")


def _count(text: str) -> int:
    """An argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


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
    try:
        return _run(args)
    except OptionError as exc:
        print(f"run: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from .._consumer import Consumer
    from .._executor import EffectExecutor
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .._worker import Worker, WorkerStats

    if args.to is not None:
        return _run_remote(args)
    if args.send_timeout is not None:
        raise OptionError("--send-timeout is for run --to (a consumer on another host)")
    pairs = []
    for item in args.consumer:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise OptionError(f"--consumer must look like NAME=PATH, got {item!r}")
        pairs.append((name, path))
    names = [name for name, _ in pairs]
    protocol = _load_one("protocol", args.protocol)
    apps = _apps(args, names)
    schemas = None
    if args.schemas:
        try:
            schemas = {int(x) for x in args.schemas.split(",")}
        except ValueError:
            raise OptionError(f"--schemas must be comma-separated ints, got {args.schemas!r}") from None
    if args.use_async:
        import asyncio

        return asyncio.run(_run_async(args, pairs, protocol, apps, schemas))
    consumers: list[Consumer] = []
    try:
        producer = Producer(args.producer, protocol)
    except (ReliableFlowError, ValueError) as exc:
        raise OptionError(str(exc)) from None
    last = [time.monotonic()]

    def report(stats: WorkerStats) -> None:
        if args.report_every > 0 and time.monotonic() - last[0] >= args.report_every:
            last[0] = time.monotonic()
            print(f"run: {json.dumps(stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)

    try:
        for name, path in pairs:
            consumers.append(Consumer(path, protocol, name=name, schemas=schemas, **apps[name]))
        effect_policy = DeliveryPolicy(lease_seconds=args.effect_lease)  # each executor claims as itself
        executors = [EffectExecutor(c, policy=effect_policy, producer=producer, concurrency=args.concurrency)
                     for c in consumers if "effects" in apps[c.name]]
        # ReliableFlowError: e.g. a consumer name the producer has not registered
        worker = Worker(producer, consumers, policy=DeliveryPolicy(lease_seconds=args.lease),
                        idle_sleep=args.idle_sleep, on_pass=report, executors=executors, register=args.register)
    except (ReliableFlowError, ValueError) as exc:
        for c in consumers:
            c.close()
        producer.close()
        raise OptionError(str(exc)) from None
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


def _run_remote(args: argparse.Namespace) -> int:
    """``run --to URL``: a relay-only :class:`Worker` whose consumers are
    :class:`~reliable_flow.transport.redis.RedisReceiver` objects."""
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .._worker import Worker, WorkerStats

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
    protocol = _load_one("protocol", args.protocol)
    receivers: list[RedisReceiver] = []
    try:
        for name in args.consumer:
            if "=" in name:
                raise OptionError(f"with --to, --consumer is a consumer's NAME only, got {name!r}")
            if args.send_timeout is None:
                receivers.append(RedisReceiver(args.to, name))
            else:
                receivers.append(RedisReceiver(args.to, name, timeout=args.send_timeout))
        talking(args.to, "run --to", receivers[0]._client.ping)
    except (ReliableFlowError, ValueError) as exc:
        for r in receivers:
            r.close()
        raise OptionError(str(exc)) from None
    try:
        producer = Producer(args.producer, protocol)
    except (ReliableFlowError, ValueError) as exc:
        raise OptionError(str(exc)) from None
    last = [time.monotonic()]

    def report(stats: WorkerStats) -> None:
        if args.report_every > 0 and time.monotonic() - last[0] >= args.report_every:
            last[0] = time.monotonic()
            print(f"run: {json.dumps(stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)

    try:
        worker = Worker(producer, receivers, policy=DeliveryPolicy(lease_seconds=args.lease),
                        idle_sleep=args.idle_sleep, on_pass=report, register=args.register)
    except (ReliableFlowError, ValueError) as exc:
        producer.close()
        raise OptionError(str(exc)) from None
    print(f"run: relaying to {', '.join(args.consumer)} through {shown(args.to)}", file=sys.stderr, flush=True)
    failure: ReliableFlowError | None = None
    try:
        worker.run(max_passes=1 if args.once else None, until_idle=args.until_idle)
    except ReliableFlowError as exc:
        failure = exc
    finally:
        for r in receivers:
            r.close()
        producer.close()
    print(f"run: stopped: {json.dumps(worker.stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"run: cannot go on: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
        return 2
    return 0


async def _run_async(args: argparse.Namespace, pairs: list[tuple[str, str]], protocol: Any,
                     apps: dict[str, dict[str, Any]], schemas: set[int] | None) -> int:
    """``run --async``: :func:`_run` with the aio face, on the running loop."""
    from .._relay import DeliveryPolicy
    from .._worker import WorkerStats
    from ..aio import AsyncConsumer, AsyncProducer
    from ..aio._executor import AsyncEffectExecutor
    from ..aio._worker import AsyncWorker

    consumers: list[AsyncConsumer] = []
    try:
        producer = await AsyncProducer.open(args.producer, protocol)
    except (ReliableFlowError, ValueError) as exc:
        raise OptionError(str(exc)) from None
    last = [time.monotonic()]

    def report(stats: WorkerStats) -> None:
        if args.report_every > 0 and time.monotonic() - last[0] >= args.report_every:
            last[0] = time.monotonic()
            print(f"run: {json.dumps(stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)

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
    failure: ReliableFlowError | None = None
    try:
        await worker.run(max_passes=1 if args.once else None, until_idle=args.until_idle)
    except ReliableFlowError as exc:  # the worker raises only what retrying cannot heal
        failure = exc
    finally:
        await close_all()
    print(f"run: stopped: {json.dumps(worker.stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"run: cannot go on: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
        return 2
    return 0


# -- execute -----------------------------------------------------------------------------


def execute_command(args: argparse.Namespace) -> int:
    """``reliable-flow execute``: 0 when stopped (signal, --until-idle), 2 on an error."""
    try:
        return _execute(args)
    except OptionError as exc:
        print(f"execute: {exc}", file=sys.stderr)
        return 2


def _execute(args: argparse.Namespace) -> int:
    from .._consumer import Consumer
    from .._executor import EffectExecutor
    from .._producer import Producer
    from .._relay import DeliveryPolicy
    from .._store.open import is_postgres

    protocol = _load_one("protocol", args.protocol)
    effects = _load_one("effects", args.effects)
    if not is_postgres(args.consumer) and not os.path.isfile(args.consumer):
        raise OptionError(f"no consumer file at {args.consumer!r}")  # executing creates nothing
    opened: list[Any] = []
    try:
        consumer = Consumer(args.consumer, protocol, effects=effects)
        opened.append(consumer)
        producer = None
        if args.producer is not None:
            producer = Producer(args.producer, protocol)
            opened.append(producer)
        executor = EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=args.lease), producer=producer,
                                  concurrency=args.concurrency)
    except (ReliableFlowError, ValueError) as exc:
        for thing in reversed(opened):
            thing.close()
        raise OptionError(str(exc)) from None
    failure: ReliableFlowError | None = None
    try:
        executor.run(until_idle=args.until_idle, idle_sleep=args.idle_sleep)
    except ReliableFlowError as exc:  # run() raises only what retrying cannot heal
        failure = exc
    finally:
        for thing in reversed(opened):
            thing.close()
    print(f"execute: stopped: {json.dumps(executor.stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"execute: cannot go on: {type(failure).__name__}: {failure}", file=sys.stderr, flush=True)
        return 2
    return 0

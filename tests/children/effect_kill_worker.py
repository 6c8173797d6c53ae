"""The effect executor that ``test_effect_kill.py`` kills, and the client of the
fake service (``fake_service.py``) its effect calls.

Not collected by pytest.  The test forks and calls :func:`run` in the child
(or, when the test process has threads, runs this file as a script)::

    python tests/children/effect_kill_worker.py CONSUMER SOCKET CONFIG OWNER [MAX_SECONDS [EVENTS]]

CONSUMER is the consumer store's location: a SQLite path or a
``postgresql://...#schema`` string.  It opens the consumer store (nothing is
inherited: no connection is open in the parent when it forks), reports
``ready``, and runs ``EffectExecutor.run_once()`` in a loop, until it is killed (or after
MAX_SECONDS, a watchdog).  OWNER names its leases and is sent with every
call, so the service's log tells which incarnation sent what.  CONFIG chooses how the one effect, ``call_service``,
settles doubt (:func:`build_effects`):

* ``reconcile``: ``reconcile=`` asks the service's ``status`` of the key;
* ``idempotent``: ``idempotent=True`` (the service is started with ``--dedup 1``);
* ``neither``: an effect in doubt can only be parked as ``unknown``.

The effect function sends ``perform`` with the call's key and a deadline of
:data:`CALL_TIMEOUT` and classifies the answer: ``{"error": ...}`` is
``RetryLater`` (the service certainly did nothing), no answer in time is
``OutcomeUnknown``.  The lease (:data:`LEASE`) is longer than that timeout
and than the reconcile's (:data:`STATUS_TIMEOUT`), as the executor requires.

The concurrent configurations (issue 20), ``<config>-c16``
(:data:`CONCURRENT_CONFIGS`), settle doubt the same three ways, but the
executor runs with ``concurrency=16`` and a lease of :data:`C_LEASE`
seconds, and two effects are registered, both with ``timeout=``
:data:`C_TIMEOUT`: ``call_service_sync`` (a plain function, on the
executor's threads) and ``call_service_async`` (an ``async def`` function,
and an ``async def`` reconcile, on the executor's event loop).  Each
effect's payload says what kind of call it is (chosen by the test's apply
handler):

* ``quick``: as above, with a deadline of :data:`C_QUICK_DEADLINE`;
* ``long``: the service works ``hold`` seconds (longer than the lease)
  before it decides; the function waits for the answer calling
  ``call.heartbeat()`` every :data:`BEAT_EVERY` seconds (a ``LeaseLost``
  closes the connection, so the service, which decides only for a caller
  still connected, does nothing);
* ``slow``: the same, but ``hold`` is past the executor's ``timeout``: the
  executor records the attempt in doubt while the call still runs, holds
  the claim until it returns, and discards its late outcome.

Calls of a kind stay that kind for their first few attempts only
(:data:`LONG_ATTEMPTS`, :data:`SLOW_ATTEMPTS`; then ``quick``), so an
effect re-run by key is not timed out for ever.  The ``service``'s "retry"
answer carries ``after``, raised as ``RetryLater(after=...)``.  Half the
incarnations drive the executor with ``run_once(limit=100)`` in a loop, half
with ``pump()`` (as ``Worker`` does).  When EVENTS (a file) is given, every
``long`` and ``slow`` call appends how it ended (its seconds, heartbeats,
the longest a heartbeat waited, ``LeaseLost``) and the executor's
``timed_out`` and ``lease_lost`` log records are appended too, one JSON line
each, so the test can tell the campaign exercised them (a killed
incarnation loses what it had not written yet).

Only the standard library and ``reliable_flow`` are imported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from reliable_flow import Consumer, DeliveryPolicy
from reliable_flow._effects import (
    EffectCall,
    EffectRegistry,
    Happened,
    NotHappened,
    OutcomeUnknown,
    RetryLater,
)
from reliable_flow._effects.executor import EffectExecutor
from reliable_flow.errors import LeaseLost
from reliable_flow.reservation import RESERVATION

CONFIGS = ("reconcile", "idempotent", "neither")
EFFECT = "call_service"
CALL_TIMEOUT = 0.06  # the effect function's own timeout (the service's deadline)
STATUS_TIMEOUT = 0.2  # the reconcile's timeout
LEASE = 0.4  # > both timeouts: a lease never runs out while a call can still take effect
MAX_ATTEMPTS = 1_000_000  # kills and "retry" answers must never exhaust an effect: nothing goes dead
IDLE_PAUSE = 0.003  # between two passes that found nothing due

# -- the concurrent configurations (issue 20) -----------------------------------------------
CONCURRENT_SUFFIX = "-c16"
CONCURRENT_CONFIGS = tuple(c + CONCURRENT_SUFFIX for c in CONFIGS)
CONCURRENCY = 16
SYNC_EFFECT, ASYNC_EFFECT = "call_service_sync", "call_service_async"
C_LEASE = 1.5  # real seconds; renewed every C_LEASE / 3 by the executor while its process lives
C_TIMEOUT = 3.0  # the effects' timeout=: past it a call is recorded in doubt
C_QUICK_DEADLINE = 0.3  # a quick call's deadline (< the lease)
C_STATUS_TIMEOUT = 0.5  # the reconcile's (< the lease)
LONG_HOLD = (C_LEASE + 0.3, C_LEASE + 0.9)  # the service works this long: longer than the lease
SLOW_HOLD = (C_TIMEOUT + 0.1, C_TIMEOUT + 0.5)  # ... past the timeout
HOLD_MARGIN = 0.4  # a long or slow call's deadline: hold + this (a long call's < C_TIMEOUT)
BEAT_EVERY = 0.25  # seconds between two heartbeats of a long or slow call
LONG_ATTEMPTS, SLOW_ATTEMPTS = 3, 2  # then the effect's calls are quick
KINDS = ("quick", "long", "slow")


def split_config(config: str) -> tuple[str, bool]:
    """``("reconcile", True)`` for ``"reconcile-c16"``; ValueError for an unknown one."""
    concurrent = config.endswith(CONCURRENT_SUFFIX)
    base = config[: -len(CONCURRENT_SUFFIX)] if concurrent else config
    if base not in CONFIGS:
        raise ValueError(f"config must be one of {CONFIGS + CONCURRENT_CONFIGS}, got {config!r}")
    return base, concurrent


def effect_names(config: str) -> tuple[str, ...]:
    return (SYNC_EFFECT, ASYNC_EFFECT) if split_config(config)[1] else (EFFECT,)


def hold_for(kind: str, rng: random.Random) -> float:
    """How long the service works on a call of ``kind`` before it decides."""
    if kind == "long":
        return round(rng.uniform(*LONG_HOLD), 3)
    if kind == "slow":
        return round(rng.uniform(*SLOW_HOLD), 3)
    return 0.0


def policy(**overrides: Any) -> DeliveryPolicy:
    """The executor's policy: the short lease, and short backoffs so retries come soon."""
    return DeliveryPolicy(**{"lease_seconds": LEASE, "backoff_base": 0.01, "backoff_cap": 0.05, **overrides})


def policy_for(config: str, **overrides: Any) -> DeliveryPolicy:
    """:func:`policy`, with the concurrent configurations' longer lease."""
    if split_config(config)[1]:
        overrides = {"lease_seconds": C_LEASE, **overrides}
    return policy(**overrides)


def _exchange(socket_path: str, request: dict[str, Any], timeout: float,
              beat: Callable[[], None] | None = None) -> dict[str, Any]:
    """Send one request and read one answer within ``timeout`` seconds.

    Raises ``RetryLater`` when the request was certainly never received (no
    connection), ``OutcomeUnknown`` when it may have been (no complete answer
    in time, or the connection broke after sending).  ``beat``: called every
    :data:`BEAT_EVERY` seconds while the answer is awaited (a heartbeat); what
    it raises closes the connection and propagates.
    """
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:  # nothing was sent
            raise RetryLater(f"cannot connect to the service: {exc}") from None
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                if beat is None:
                    sock.settimeout(remaining)
                    chunk = sock.recv(65536)
                else:
                    sock.settimeout(min(remaining, BEAT_EVERY))
                    try:
                        chunk = sock.recv(65536)
                    except TimeoutError:
                        beat()
                        continue
                if not chunk:
                    raise ConnectionError("the service closed the connection without answering")
                answer += chunk
        except TimeoutError:
            raise OutcomeUnknown(f"no answer within {timeout}s") from None
        except OSError as exc:
            raise OutcomeUnknown(f"the call broke after sending: {exc}") from None
    finally:
        sock.close()
    return dict(json.loads(answer))


async def _aexchange(socket_path: str, request: dict[str, Any], timeout: float,
                     beat: Callable[[], None] | None = None) -> dict[str, Any]:
    """:func:`_exchange` on the event loop (asyncio streams); ``beat`` is
    called (it blocks the loop until the executor wrote the renewal) every
    :data:`BEAT_EVERY` seconds while the answer is awaited."""
    deadline = time.monotonic() + timeout
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path), timeout)
    except (OSError, asyncio.TimeoutError) as exc:  # nothing was sent
        raise RetryLater(f"cannot connect to the service: {exc!r}") from None
    read: asyncio.Future[bytes] | None = None
    try:
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            read = asyncio.ensure_future(reader.readline())
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OutcomeUnknown(f"no answer within {timeout}s")
                done, _ = await asyncio.wait({read}, timeout=remaining if beat is None else min(remaining, BEAT_EVERY))
                if done:
                    answer = read.result()
                    break
                if beat is not None:
                    beat()
        except OSError as exc:
            raise OutcomeUnknown(f"the call broke after sending: {exc}") from None
        if not answer.endswith(b"\n"):
            raise OutcomeUnknown("the service closed the connection without answering")
    finally:
        if read is not None and not read.done():
            read.cancel()
        writer.close()
    return dict(json.loads(answer))


class Events:
    """One JSON line per event, appended to a file (one ``write`` each, so
    the lines of several threads never interleave); a no-op without a path."""

    def __init__(self, path: str | None) -> None:
        self.fd = None if path is None else os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, **entry: Any) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps(entry, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _ExecutorEvents(logging.Handler):
    """The executor's ``timed_out`` and ``lease_lost`` log records, as events."""

    def __init__(self, events: Events) -> None:
        super().__init__(logging.INFO)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        plan = getattr(record, "plan", None)
        if plan in ("timed_out", "lease_lost"):
            self.events(ev=plan, key=getattr(record, "key", None))


class _Beats:
    """A long or slow call's heartbeats: how many, the longest wait, and LeaseLost."""

    def __init__(self, call: EffectCall) -> None:
        self.call, self.count, self.longest, self.lost = call, 0, 0.0, False

    def __call__(self) -> None:
        began = time.monotonic()
        try:
            self.call.heartbeat()  # waits until the executor's thread wrote the renewal
        except LeaseLost:
            self.lost = True
            raise
        finally:
            self.count += 1
            self.longest = max(self.longest, time.monotonic() - began)


def build_effects(config: str, socket_path: str, owner: str, events: Events | None = None) -> EffectRegistry:
    """The registry for ``config``: ``call_service`` (or, concurrent, the
    sync and async effects) calling the service at ``socket_path``, each
    request naming ``owner``."""
    base, concurrent = split_config(config)
    if concurrent:
        return _build_concurrent(base, socket_path, owner, events or Events(None))

    def call_service(call: EffectCall) -> Any:
        request = {"op": "perform", "key": call.key, "payload": call.payload, "attempt": call.attempt,
                   "owner": owner, "deadline": time.monotonic() + CALL_TIMEOUT}
        answer = _exchange(socket_path, request, CALL_TIMEOUT)
        if "error" in answer:  # "retry" or "deadline": the service did nothing
            raise RetryLater(f"service answered {answer['error']}")
        return answer["result"]

    def was_performed(call: EffectCall) -> Happened | NotHappened:
        answer = _exchange(socket_path, {"op": "status", "key": call.key, "attempt": call.attempt,
                                         "owner": owner},
                           STATUS_TIMEOUT)
        return Happened(answer["result"]) if answer["performed"] else NotHappened()

    effects = EffectRegistry()
    effects.register(EFFECT, call_service, reconcile=was_performed if config == "reconcile" else None,
                     idempotent=config == "idempotent", max_attempts=MAX_ATTEMPTS)
    return effects


def _build_concurrent(base: str, socket_path: str, owner: str, events: Events) -> EffectRegistry:
    def request_for(call: EffectCall) -> tuple[dict[str, Any], float, str]:
        kind = call.payload["kind"]
        if (kind == "long" and call.attempt > LONG_ATTEMPTS) or (kind == "slow" and call.attempt > SLOW_ATTEMPTS):
            kind = "quick"
        hold = 0.0 if kind == "quick" else float(call.payload["hold"])
        timeout = C_QUICK_DEADLINE if kind == "quick" else hold + HOLD_MARGIN
        request = {"op": "perform", "key": call.key, "payload": call.payload, "attempt": call.attempt,
                   "owner": owner, "kind": kind, "hold": hold, "deadline": time.monotonic() + timeout}
        return request, timeout, kind

    def answered(answer: dict[str, Any]) -> Any:
        if "error" in answer:  # "retry" or "deadline": the service did nothing
            raise RetryLater(f"service answered {answer['error']}", after=answer.get("after"))
        return answer["result"]

    def report(call: EffectCall, kind: str, began: float, beats: _Beats, end: str) -> None:
        if kind != "quick":
            events(ev="call", key=call.key, name=call.name, kind=kind, attempt=call.attempt, end=end,
                   seconds=round(time.monotonic() - began, 3), beats=beats.count,
                   longest_beat=round(beats.longest, 3), lease_lost=beats.lost)

    def ended(exc: BaseException | None) -> str:
        return "answered" if exc is None else type(exc).__name__

    def call_sync(call: EffectCall) -> Any:
        request, timeout, kind = request_for(call)
        beats, began, error = _Beats(call), time.monotonic(), None
        try:
            return answered(_exchange(socket_path, request, timeout, None if kind == "quick" else beats))
        except BaseException as exc:
            error = exc
            raise
        finally:
            report(call, kind, began, beats, ended(error))

    async def call_async(call: EffectCall) -> Any:
        request, timeout, kind = request_for(call)
        beats, began, error = _Beats(call), time.monotonic(), None
        try:
            return answered(await _aexchange(socket_path, request, timeout, None if kind == "quick" else beats))
        except BaseException as exc:
            error = exc
            raise
        finally:
            report(call, kind, began, beats, ended(error))

    def status_request(call: EffectCall) -> dict[str, Any]:
        return {"op": "status", "key": call.key, "attempt": call.attempt, "owner": owner, "kind": "status"}

    def was_performed(call: EffectCall) -> Happened | NotHappened:
        answer = _exchange(socket_path, status_request(call), C_STATUS_TIMEOUT)
        return Happened(answer["result"]) if answer["performed"] else NotHappened()

    async def was_performed_async(call: EffectCall) -> Happened | NotHappened:
        answer = await _aexchange(socket_path, status_request(call), C_STATUS_TIMEOUT)
        return Happened(answer["result"]) if answer["performed"] else NotHappened()

    effects = EffectRegistry()
    for name, run_fn, reconcile_fn in ((SYNC_EFFECT, call_sync, was_performed),
                                       (ASYNC_EFFECT, call_async, was_performed_async)):
        effects.register(name, run_fn, reconcile=reconcile_fn if base == "reconcile" else None,
                         idempotent=base == "idempotent", max_attempts=MAX_ATTEMPTS, timeout=C_TIMEOUT)
    return effects


def run(consumer_path: str, socket_path: str, config: str, owner: str, ready: Callable[[], None],
        max_seconds: float = 120.0, events_path: str | None = None) -> None:
    """Open the consumer and execute its effects until killed (or ``max_seconds``,
    or the process that started this one is gone)."""
    parent = os.getppid()
    end = time.monotonic() + max_seconds
    concurrent = split_config(config)[1]
    events = Events(events_path)
    if concurrent:
        executor_log = logging.getLogger("reliable_flow.executor")
        executor_log.setLevel(logging.INFO)
        executor_log.propagate = False  # only to the events (a forked child inherits the parent's handlers)
        executor_log.addHandler(_ExecutorEvents(events))
    with Consumer(consumer_path, RESERVATION, effects=build_effects(config, socket_path, owner, events)) as consumer:
        if not concurrent:
            executor = EffectExecutor(consumer, policy=policy(owner=owner))
            ready()
            while time.monotonic() < end and os.getppid() == parent:
                if executor.run_once(limit=10).work == 0:
                    time.sleep(IDLE_PAUSE)
            return
        executor = EffectExecutor(consumer, policy=policy_for(config, owner=owner), concurrency=CONCURRENCY)
        digits = "".join(c for c in owner if c.isdigit())  # "inc-N": odd N pump, even N run_once
        pump = bool(digits) and int(digits) % 2 == 1
        events(ev="start", driver="pump" if pump else "run_once", thread=threading.current_thread().name)
        ready()
        while time.monotonic() < end and os.getppid() == parent:
            if pump:
                if executor.pump(limit=CONCURRENCY) == 0:
                    executor.calls_ended.wait(0.02)
            elif executor.run_once(limit=100).work == 0:
                time.sleep(IDLE_PAUSE)


def main(argv: list[str]) -> int:
    consumer_path, socket_path, config, owner = argv[0], argv[1], argv[2], argv[3]
    max_seconds = float(argv[4]) if len(argv) > 4 else 120.0
    events_path = argv[5] if len(argv) > 5 else None

    def ready() -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()

    run(consumer_path, socket_path, config, owner, ready, max_seconds, events_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

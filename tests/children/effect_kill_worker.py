"""The effect executor that ``test_effect_kill.py`` kills, and the client of the
fake service (``fake_service.py``) its effect calls.

Not collected by pytest.  The test forks and calls :func:`run` in the child
(or, when the test process has threads, runs this file as a script)::

    python tests/children/effect_kill_worker.py CONSUMER SOCKET CONFIG OWNER [MAX_SECONDS]

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

Only the standard library and ``reliable_flow`` are imported.
"""

from __future__ import annotations

import json
import os
import socket
import sys
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
from reliable_flow._executor import EffectExecutor
from reliable_flow.reservation import RESERVATION

CONFIGS = ("reconcile", "idempotent", "neither")
EFFECT = "call_service"
CALL_TIMEOUT = 0.06  # the effect function's own timeout (the service's deadline)
STATUS_TIMEOUT = 0.2  # the reconcile's timeout
LEASE = 0.4  # > both timeouts: a lease never runs out while a call can still take effect
MAX_ATTEMPTS = 1_000_000  # kills and "retry" answers must never exhaust an effect: nothing goes dead
IDLE_PAUSE = 0.003  # between two passes that found nothing due


def policy(**overrides: Any) -> DeliveryPolicy:
    """The executor's policy: the short lease, and short backoffs so retries come soon."""
    return DeliveryPolicy(**{"lease_seconds": LEASE, "backoff_base": 0.01, "backoff_cap": 0.05, **overrides})


def _exchange(socket_path: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request and read one answer within ``timeout`` seconds.

    Raises ``RetryLater`` when the request was certainly never received (no
    connection), ``OutcomeUnknown`` when it may have been (no complete answer
    in time, or the connection broke after sending).
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
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
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


def build_effects(config: str, socket_path: str, owner: str) -> EffectRegistry:
    """The registry for ``config``: ``call_service`` calling the service at
    ``socket_path``, each request naming ``owner``."""
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {CONFIGS}, got {config!r}")

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


def run(consumer_path: str, socket_path: str, config: str, owner: str, ready: Callable[[], None],
        max_seconds: float = 120.0) -> None:
    """Open the consumer and execute its effects until killed (or ``max_seconds``,
    or the process that started this one is gone)."""
    parent = os.getppid()
    end = time.monotonic() + max_seconds
    with Consumer(consumer_path, RESERVATION, effects=build_effects(config, socket_path, owner)) as consumer:
        executor = EffectExecutor(consumer, policy=policy(owner=owner))
        ready()
        while time.monotonic() < end and os.getppid() == parent:
            if executor.run_once(limit=10) == 0:
                time.sleep(IDLE_PAUSE)


def main(argv: list[str]) -> int:
    consumer_path, socket_path, config, owner = argv[0], argv[1], argv[2], argv[3]
    max_seconds = float(argv[4]) if len(argv) > 4 else 120.0

    def ready() -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()

    run(consumer_path, socket_path, config, owner, ready, max_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""An effect executor process that dies at a crash point, for
``test_effect_crash_points.py``.

Not collected by pytest.  Run as a script, with ``RELIABLE_FLOW_CRASH_AT``
armed in its environment::

    python tests/children/effect_crash_child.py CONSUMER CALLS NOW

CONSUMER is the consumer store's location: a SQLite path or a
``postgresql://...#schema`` string.  It sets nothing up: it opens the
consumer store the test prepared (one
pending ``notify`` effect), registers ``notify`` (which appends
``<key> <attempt>`` to the file CALLS on every call, so the test can count
calls), and runs ``EffectExecutor.run_once()`` once under a lease of
:data:`LEASE` seconds owned by :data:`OWNER`, its clock standing still at
NOW.  It prints how many effects it took up, which it never gets to when
the crash point fires (it exits 73).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from reliable_flow import Consumer, DeliveryPolicy, EffectCall, EffectExecutor, EffectRegistry
from reliable_flow.reservation import RESERVATION

NAME = "notify"
OWNER = "child"
LEASE = 30.0


def record_calls(calls_path: str) -> Callable[[EffectCall], dict[str, int]]:
    """The effect function: one durable line per call, then the result."""

    def notify(call: EffectCall) -> dict[str, int]:
        with open(calls_path, "a", encoding="utf-8") as out:
            out.write(f"{call.key} {call.attempt}\n")
            out.flush()
            os.fsync(out.fileno())
        return {"sent": call.attempt}

    return notify


def main(argv: list[str]) -> int:
    consumer_path, calls_path, now = argv[0], argv[1], float(argv[2])
    effects = EffectRegistry()
    effects.register(NAME, record_calls(calls_path))
    policy = DeliveryPolicy(lease_seconds=LEASE, clock=lambda: now, random=lambda: 0.5, owner=OWNER)
    with Consumer(consumer_path, RESERVATION, effects=effects, clock=lambda: now) as consumer:
        print(EffectExecutor(consumer, policy=policy).run_once().work, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

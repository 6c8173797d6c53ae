"""An effect executor with a recurring schedule, for the kill test of
``test_effect_every.py``.  Not collected by pytest.  Run as a script::

    python tests/children/every_child.py CONSUMER SERVICE_LOG INTERVAL

CONSUMER is a store location (a SQLite path or ``postgresql://...#schema``).
It declares ``every("tick", interval=INTERVAL, missed="all")`` and runs its
executor (real clock, lease 0.5 s) until killed.  The effect appends its key
to SERVICE_LOG (one line, fsynced: the counting service); its reconcile says
whether the key is there.
"""

from __future__ import annotations

import os
import sys
import time

from reliable_flow import Consumer, DeliveryPolicy, EffectExecutor
from reliable_flow._effects import EffectCall, EffectRegistry, Happened, NotHappened
from reliable_flow.reservation import RESERVATION


def registry(log: str, interval: float | None) -> EffectRegistry:
    """The effect ``tick`` writing to the service log (and, given ``interval``, its schedule)."""
    def perform(call: EffectCall) -> None:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{call.key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        time.sleep(0.02)  # performed, not yet recorded: where a kill leaves the tick in doubt

    def performed(call: EffectCall) -> Happened | NotHappened:
        try:
            with open(log, encoding="utf-8") as f:
                done = call.key in f.read().splitlines()
        except FileNotFoundError:
            done = False
        return Happened() if done else NotHappened()

    effects = EffectRegistry()
    effects.register("tick", perform, reconcile=performed, max_attempts=50)
    if interval is not None:
        effects.every("tick", interval=interval, missed="all")
    return effects


def main(argv: list[str]) -> int:
    location, log, interval = argv[0], argv[1], float(argv[2])
    effects = registry(log, interval)
    with Consumer(location, RESERVATION, name="ticks", effects=effects) as consumer:
        policy = DeliveryPolicy(lease_seconds=0.5, owner="child", backoff_base=0.01, backoff_cap=0.05)
        print("ready", flush=True)
        EffectExecutor(consumer, policy=policy).run(idle_sleep=0.01, handle_signals=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A worker or an effect executor for ``test_console_kill.py``, killed with
SIGKILL again and again while the console reads the same stores.

Not collected by pytest.  Run as a script::

    python tests/children/console_kill_child.py worker PRODUCER CONSUMER DONE
    python tests/children/console_kill_child.py executor PRODUCER CONSUMER DONE

PRODUCER and CONSUMER are store locations (SQLite paths or
``postgresql://...#schema`` strings).  ``worker`` relays and applies for
ever: each applied step schedules one ``notify`` effect.  ``executor`` runs
the effects for ever: ``notify`` performs its call by creating the file
``DONE/<key>`` (the external system, deduplicating by key: a call re-run
after a kill finds it there and answers the same), and appends the key to
``DONE/calls`` (every raw call).  Neither returns: the test kills them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Producer,
    Worker,
)
from reliable_flow.reservation import RESERVATION

NAME = "notify"
LEASE = 1.0


def registry(done: Path) -> EffectRegistry:
    def notify(call: EffectCall) -> dict[str, Any]:
        with open(done / "calls", "a", encoding="utf-8") as log:
            log.write(call.key + "\n")
        marker = done / call.key.replace(":", "_")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.fsync(fd)
            os.close(fd)
        except FileExistsError:
            pass  # performed by an earlier call of this key: the same answer
        return {"sent": call.key}

    effects = EffectRegistry()
    effects.register(NAME, notify, idempotent=True, max_attempts=1000)
    return effects


def handler(ctx: ApplyContext) -> None:
    ctx.schedule(NAME, {"event": ctx.event.event_id})


def main(argv: list[str]) -> int:
    role, producer_at, consumer_at, done = argv[0], argv[1], argv[2], Path(argv[3])
    policy = DeliveryPolicy(lease_seconds=LEASE, owner=f"{role}-{os.getpid()}")
    with Producer(producer_at, RESERVATION) as producer, \
            Consumer(consumer_at, RESERVATION, handlers=[handler], effects=registry(done)) as consumer:
        print("ready", flush=True)
        if role == "worker":
            Worker(producer, [consumer], policy=policy, idle_sleep=0.05).run(handle_signals=False)
        else:
            EffectExecutor(consumer, policy=policy).run(idle_sleep=0.01, handle_signals=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A relay process that dies mid-send, for the lease tests of ``test_delivery.py``.

Not collected by pytest.  Run as a script with a crash point armed
(``RELIABLE_FLOW_CRASH_AT``)::

    python tests/children/lease_child.py PRODUCER CONSUMER NOW

PRODUCER and CONSUMER are store locations: SQLite paths or
``postgresql://...#schema`` strings.  It relays once to the consumer named ``projection`` under a lease of 10 s
owned by ``child``, its clock standing still at NOW, and prints the status
(which it never gets to when the crash point fires: it exits 73).
"""

from __future__ import annotations

import sys

from reliable_flow import Consumer, DeliveryPolicy, Producer, relay
from reliable_flow.reservation import RESERVATION


def main(argv: list[str]) -> int:
    producer_path, consumer_path, now = argv[0], argv[1], float(argv[2])
    policy = DeliveryPolicy(lease_seconds=10, clock=lambda: now, owner="child")
    with Producer(producer_path, RESERVATION) as p, Consumer(consumer_path, RESERVATION, name="projection") as c:
        print(relay(p, c, policy=policy).status, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

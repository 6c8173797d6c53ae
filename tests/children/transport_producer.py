"""The producer's host side of ``test_transport_faults.py``.

Not collected by pytest.  Two ways in, as scripts (with ``tests/`` and
``src/`` on ``PYTHONPATH``, see ``support.child_env``)::

    python tests/children/transport_producer.py advance PRODUCER SEED FLOWS PACE
    python tests/children/transport_producer.py worker PRODUCER URL CONSUMER TIMEOUT LEASE [until-idle]

``advance``: commits the events of FLOWS flows (``T0000``, ``T0001`` ...),
each 1 to 3 reservation steps long (seeded), in a random interleaving that
keeps each flow's own order, sleeping PACE seconds between two commits so
the work is spread over the faults; prints ``committed N`` at the end.  It
keeps no state of its own: a flow already advanced (a second run) is carried
on from the producer's view of it.

``worker``: a relay-only :class:`~reliable_flow.Worker` whose one consumer
is ``RedisReceiver(URL, CONSUMER, timeout=TIMEOUT)`` (``run --to`` has no
option for the receiver's timeout, 10 s by default), with a relay lease of
LEASE seconds and short backoffs (base 0.2 s, cap 2 s) so a send that failed
during a fault is retried soon after it ends.  Runs until SIGTERM (exit 0),
or with ``until-idle`` until a pass does no work and nothing waits for a
lease or backoff.  Its totals go to stderr as ``worker: stopped: {...}``.
"""

from __future__ import annotations

import json
import random
import sys
import time

from reliable_flow import DeliveryPolicy, Producer, Worker
from reliable_flow.reservation import RESERVATION

STEPS = ("reserved", "confirmed", "released")


def flow_name(i: int) -> str:
    return f"T{i:04d}"


def plan(seed: int, flows: int) -> dict[str, tuple[int, int]]:
    """Flow id -> (its number of steps, its amount): the same for every caller."""
    rng = random.Random(f"{seed}:plan")
    return {flow_name(i): (rng.randint(1, 3), rng.randint(1, 9)) for i in range(flows)}


def advance(producer_path: str, seed: int, flows: int, pace: float) -> int:
    wanted = plan(seed, flows)
    rng = random.Random(f"{seed}:order")
    committed = 0
    with Producer(producer_path, RESERVATION) as producer:
        done = {f: int((producer.flow(f) or {}).get("seq", 0)) for f in wanted}
        open_flows = [f for f, (steps, _amount) in wanted.items() if done[f] < steps]
        while open_flows:
            flow_id = rng.choice(open_flows)
            seq = done[flow_id] + 1
            result = producer.advance(f"{flow_id}-{seq}", flow_id, expected_seq=seq - 1, kind=STEPS[seq - 1],
                                      payload={"amount": wanted[flow_id][1]})
            if result.status != "committed":
                raise AssertionError(f"advance {flow_id}-{seq}: {result}")
            committed += 1
            done[flow_id] = seq
            if seq == wanted[flow_id][0]:
                open_flows.remove(flow_id)
            if pace > 0:
                time.sleep(pace)
    print(f"committed {committed}", flush=True)
    return 0


def worker(producer_path: str, url: str, consumer: str, timeout: float, lease: float, until_idle: bool) -> int:
    from reliable_flow.transport.redis import RedisReceiver

    policy = DeliveryPolicy(lease_seconds=lease, backoff_base=0.2, backoff_cap=2.0)
    with Producer(producer_path, RESERVATION) as producer, RedisReceiver(url, consumer, timeout=timeout) as receiver:
        print(f"worker: relaying to {consumer} through {url}", file=sys.stderr, flush=True)
        stats = Worker(producer, [receiver], policy=policy, idle_sleep=0.1).run(until_idle=until_idle)
    print(f"worker: stopped: {json.dumps(stats.as_dict(), sort_keys=True)}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "advance":
        return advance(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
    if argv[0] == "worker":
        return worker(argv[1], argv[2], argv[3], float(argv[4]), float(argv[5]),
                      len(argv) > 6 and argv[6] == "until-idle")
    raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The worker process of the signal and SIGKILL tests in ``test_worker.py``.

Not collected by pytest.  Run as a script, in a fresh interpreter started by
the test with an explicit environment and a timeout::

    python tests/children/worker_child.py signal DIR          # run until SIGTERM / SIGINT
    python tests/children/worker_child.py kill DIR SEED       # feed, re-send and work until killed
    python tests/children/worker_child.py finish DIR SEED     # the same, until everything is settled
    python tests/children/worker_child.py signal-in-wait DIR  # SIGTERM inside the idle wait

DIR holds ``producer.db`` and one consumer file per name (``projection.db``,
``audit.db``; ``c.db`` for ``signal-in-wait``); or DIR is a JSON object
naming the store of each label (``{"producer": LOCATION, "projection": ...}``),
a SQLite file or a PostgreSQL location.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from typing import Any

from reliable_flow import Consumer, DeliveryPolicy, Producer, Worker
from reliable_flow.records import WorkerStats
from reliable_flow.reservation import RESERVATION

STEPS = ("reserved", "confirmed", "released")
FLOWS = [f"F{i:02d}" for i in range(20)]
CONFLICT = ("projection", "F07-1")  # the projection inbox holds another F07-1


def amount(flow: str) -> int:
    return 1 + int(flow[1:])


def at(d: str, label: str) -> str:
    """The store of ``label``: named in DIR's JSON object, or ``DIR/<label>.db``."""
    if d.startswith("{"):
        return str(json.loads(d)[label])
    return os.path.join(d, label + ".db")


def open_all(d: str) -> tuple[Producer, list[Consumer]]:
    producer = Producer(at(d, "producer"), RESERVATION)
    consumers = [Consumer(at(d, name), RESERVATION, name=name) for name in ("projection", "audit")]
    return producer, consumers


def signal_mode(d: str) -> int:
    producer, consumers = open_all(d)

    def on_pass(stats: WorkerStats) -> None:
        if stats.passes == 1:
            print("running", flush=True)

    worker = Worker(producer, consumers, policy=DeliveryPolicy(lease_seconds=30), relay_batch=10,
                    apply_limit=2, idle_sleep=0.05, on_pass=on_pass, register=True)
    stats = worker.run()
    print(json.dumps(stats.as_dict()), flush=True)
    for c in consumers:
        c.close()
    producer.close()
    return 0


def seq_of(producer: Producer, flow: str) -> int:
    found = producer.flow(flow)
    return 0 if found is None else found["seq"]


def settled(producer: Producer) -> bool:
    if any(seq_of(producer, f) < 3 for f in FLOWS):
        return False
    return all(
        len(e.deliveries) == 2 and all(d.state in ("accepted", "set_aside") for d in e.deliveries.values())
        for e in producer.outbox()
    )


def kill_mode(d: str, seed: int, finish: bool) -> int:
    rng = random.Random(seed)
    producer, consumers = open_all(d)
    policy = DeliveryPolicy(lease_seconds=0.2, backoff_base=0.01, backoff_cap=0.05)
    worker = Worker(producer, consumers, policy=policy, relay_batch=rng.randint(1, 8),
                    apply_limit=rng.randint(1, 3), idle_sleep=0, register=True)
    quota = 60 if finish else rng.randint(1, 4)  # events this incarnation may commit
    print("ready", flush=True)
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        for _ in range(rng.randint(0, 2)):
            open_flows = [f for f in FLOWS if seq_of(producer, f) < 3]
            if quota <= 0 or not open_flows:
                break
            flow = rng.choice(open_flows)
            seq = seq_of(producer, flow)
            r = producer.advance(f"{flow}-{seq + 1}", flow, expected_seq=seq, kind=STEPS[seq],
                                 payload={"amount": amount(flow)})
            if r.status != "committed":
                print("advance answered", r, file=sys.stderr)
                return 2
            quota -= 1
        if rng.random() < 0.3:  # the network delivers a committed event again
            ids = [e.event_id for e in producer.outbox()]
            if ids:
                event_id, consumer = rng.choice(ids), rng.choice(consumers)
                status = consumer.receive(producer.event(event_id)).status
                conflict = {"id_conflict"} if (consumer.name, event_id) == CONFLICT else set()
                allowed = {"accepted", "duplicate"} | conflict
                if status not in allowed:
                    print("receive answered", status, "for", event_id, file=sys.stderr)
                    return 2
        work = worker.run_once().work
        if finish and work == 0 and settled(producer):
            print("done", json.dumps(worker.stats.as_dict()), flush=True)
            return 0
    return 3


def signal_in_wait(d: str) -> int:
    """SIGTERM lands while the main thread holds the stop event's lock inside
    Event.wait() (the idle sleep); prints whether the worker noticed."""
    with Producer(at(d, "producer"), RESERVATION) as p, Consumer(at(d, "c"), RESERVATION) as c:
        installed: list[Any] = []
        worker = Worker(p, [c], idle_sleep=0, on_pass=lambda s: installed.append(signal.getsignal(signal.SIGTERM)))
        worker.run(max_passes=1)
        signal.signal(signal.SIGTERM, installed[0])  # the handler run() installs
        event = getattr(worker, "_stop", None)
        lock = getattr(event, "_cond", None)
        if lock is not None:
            # The main thread is inside Event.wait(), between taking the event's
            # lock and going to sleep on it, when SIGTERM arrives.
            with lock:
                signal.raise_signal(signal.SIGTERM)
                pass  # noqa: PIE790 - one more statement under the lock, as the regression script always had
        else:
            signal.raise_signal(signal.SIGTERM)
        for _ in range(500):
            if worker.stopping:
                break
            time.sleep(0.01)
        print("returned", worker.stopping, flush=True)
    return 0


def main(argv: list[str]) -> int:
    mode, d = argv[0], argv[1]
    if mode == "signal":
        return signal_mode(d)
    if mode == "signal-in-wait":
        return signal_in_wait(d)
    return kill_mode(d, int(argv[2]), mode == "finish")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

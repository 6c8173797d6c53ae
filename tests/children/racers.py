"""Targets of the ``spawn`` processes that :func:`support.start_on_barrier` starts.

Not collected by pytest (no ``test_`` prefix).  Each target is called as
``target(*args, barrier)`` in its own process: it opens its own files, waits
at the shared barrier (so every process acts at the same moment) and returns
what it saw.  It never reports by itself: ``start_on_barrier`` sends the
return value, or the exception with its traceback and SQLite error name, back
to the parent.
"""

from __future__ import annotations

import os
from typing import Any

from reliable_flow import Consumer, DeliveryPolicy, Producer, relay
from reliable_flow.reservation import RESERVATION

CREATE_ROUNDS = 40


def race_child(kind: str, producer_path: str, consumer_path: str, index: int, barrier: Any) -> list[str]:
    """One of the racing processes of ``test_races.py``: open, wait at the barrier, act.

    Returns the statuses of the calls it made.
    """
    if kind == "create":
        return create_race(producer_path, consumer_path, barrier)
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        barrier.wait(timeout=60)  # everyone open; go together
        statuses: list[str] = []
        if kind == "advance_same":
            r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            statuses.append(str(r.status))
        elif kind == "advance_new_ids":
            r = producer.advance(f"A1-{index}", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            statuses.append(str(r.status))
        elif kind == "receive":
            envelope = {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved",
                        "schema": 1, "payload": {"amount": 3}}
            statuses.append(str(consumer.receive(envelope).status))
        elif kind == "apply":
            statuses.append(str(consumer.apply_next("A").status))
        elif kind == "relay":
            for _ in range(1000):
                d = relay(producer, consumer)
                statuses.append(f"{d.status} {d.event_id}")
                if d.status == "idle":
                    break
        else:
            raise ValueError(f"unknown race kind {kind!r}")
    return statuses


def create_race(producer_dir: str, consumer_dir: str, barrier: Any) -> list[str]:
    """Open ``CREATE_ROUNDS`` brand-new producer and consumer files, all racers together.

    Each round every racer waits at the barrier, then opens the same two new
    paths; one of them creates each file.  Returns ``"ok"`` or the error per round
    (an error in one round does not stop the others, so the barrier stays in step).
    """
    out = []
    for n in range(CREATE_ROUNDS):
        barrier.wait(timeout=60)
        try:
            Producer(os.path.join(producer_dir, f"p{n}.db"), RESERVATION).close()
            Consumer(os.path.join(consumer_dir, f"c{n}.db"), RESERVATION).close()
            out.append("ok")
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out.append(f"{type(exc).__name__} {getattr(exc, 'sqlite_errorname', None)}: {exc}")
    return out


def relay_with_lease(producer_path: str, consumer_path: str, barrier: Any) -> list[tuple[str | None, str]]:
    """One of the leased relays of ``test_delivery.py``: relay until idle; (event id, status) per send."""
    with Producer(producer_path, RESERVATION) as p, Consumer(consumer_path, RESERVATION) as c:
        policy = DeliveryPolicy(lease_seconds=30)
        barrier.wait(timeout=60)
        got = []
        while True:
            r = relay(p, c, policy=policy)
            if r.status == "idle":
                break
            got.append((r.event_id, str(r.status)))
        return got


def open_producer(path: str, barrier: Any) -> int:
    """One of the processes of ``test_migrations.py`` opening (and so upgrading) a v1
    producer file at once; returns how many outbox events it sees."""
    barrier.wait(timeout=60)
    with Producer(path, RESERVATION) as producer:
        return len(producer.outbox())

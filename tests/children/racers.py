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
import time
from typing import Any

from reliable_flow import Consumer, DeliveryPolicy, Producer, relay
from reliable_flow.reservation import RESERVATION

CREATE_ROUNDS = 40
REGISTER_ADVANCES = 40  # advances per advancing process of the registration race
REGISTER_CAP = 100  # registrations at most, while the advancers run
PG_CREATE_ROUNDS = 15  # a schema's creation is a dozen DDL statements and a durable commit


def _is_pg(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


def _nth(base: str, name: str) -> str:
    """The ``name`` store under ``base``: a file in the directory, or a schema
    named after the base location's schema."""
    return f"{base}_{name}" if _is_pg(base) else os.path.join(base, f"{name}.db")


def race_child(kind: str, producer_path: str, consumer_path: str, index: int, barrier: Any) -> list[str]:
    """One of the racing processes of ``test_races.py``: open, wait at the barrier, act.

    Returns the statuses of the calls it made.
    """
    if kind == "create":
        return create_race(producer_path, consumer_path, barrier)
    if kind == "register":
        return register_race(producer_path, index, barrier)
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
    for n in range(PG_CREATE_ROUNDS if _is_pg(producer_dir) else CREATE_ROUNDS):
        barrier.wait(timeout=60)
        try:
            Producer(_nth(producer_dir, f"p{n}"), RESERVATION).close()
            Consumer(_nth(consumer_dir, f"c{n}"), RESERVATION).close()
            out.append("ok")
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            out.append(f"{type(exc).__name__} {getattr(exc, 'sqlite_errorname', None)}: {exc}")
    return out


def register_race(producer_path: str, index: int, barrier: Any) -> list[str]:
    """The registration race: process 0 registers consumer names ``late-<k>``
    (each from the first event) for as long as the others are advancing; the
    others each commit ``REGISTER_ADVANCES`` one-step flows.  Returns the
    names registered (process 0) or the event ids committed (the others)."""
    with Producer(producer_path, RESERVATION) as producer:
        barrier.wait(timeout=60)
        done: list[str] = []
        if index == 0:
            total = (barrier.parties - 1) * REGISTER_ADVANCES
            while len(done) < REGISTER_CAP and len(producer.flows()) < total:
                name = f"late-{len(done)}"
                producer.admin.register_consumer(name, actor="race", reason="registered while advancing")
                done.append(name)
                time.sleep(0.002)  # let the advancers in (SQLite's busy handler is not fair)
            return done
        for k in range(REGISTER_ADVANCES):
            flow = f"F{index}-{k}"
            r = producer.advance(f"{flow}-1", flow, expected_seq=0, kind="reserved", payload={"amount": 1})
            assert r.status == "committed", r
            done.append(r.event_id)
        return done


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

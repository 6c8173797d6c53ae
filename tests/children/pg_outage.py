"""The child of ``test_postgres_faults.py``'s server-kill test.

Not collected by pytest (no ``test_`` prefix).  Run as::

    python tests/children/pg_outage.py PRODUCER CONSUMER JOURNAL FLOWS

It takes ``FLOWS`` reservation flows through all three steps, one step at a
time: advance, relay until idle, drain.  The test kills the PostgreSQL server
(SIGKILL to the postmaster) and restarts it while this runs.  Every call that
fails must raise a :class:`StorageError` (the child then waits a moment and
makes the same call again, as an application would); any other exception,
or an answer that is wrong for what the child knows, ends it with exit code
2.  After each call returns it appends one line to ``JOURNAL``: ``<op>
<answer> <id> .`` (``error <op> <ErrorClass> .`` for a failed call).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from reliable_flow import Consumer, Producer, relay
from reliable_flow.errors import CommitOutcomeUnknown, StorageError
from reliable_flow.reservation import RESERVATION

STEPS = ("reserved", "confirmed", "released")
WRONG = 2
T = TypeVar("T")


class Wrong(Exception):
    """An answer the library must never give here."""


class Outage:
    def __init__(self, producer: str, consumer: str, journal: str) -> None:
        self.producer_location, self.consumer_location = producer, consumer
        self.fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.p: Producer | None = None
        self.c: Consumer | None = None

    def log(self, *fields: object) -> None:
        os.write(self.fd, (" ".join(str(f) for f in fields) + " .\n").encode())

    def call(self, op: str, fn: Callable[[], T]) -> tuple[T, bool]:
        """``fn()`` until it returns; (its answer, whether an earlier try's COMMIT outcome was unknown)."""
        unknown = False
        for _ in range(3000):
            try:
                if self.p is None:
                    self.p = Producer(self.producer_location, RESERVATION)
                if self.c is None:
                    self.c = Consumer(self.consumer_location, RESERVATION)
                return fn(), unknown
            except StorageError as exc:
                self.log("error", op, type(exc).__name__)
                unknown = unknown or isinstance(exc, CommitOutcomeUnknown)
                time.sleep(0.02)
        raise Wrong(f"{op}: the server never came back")

    def run(self, flows: int) -> None:
        for i in range(flows):
            flow = f"F{i}"
            for seq, kind in enumerate(STEPS, start=1):
                event_id = f"{flow}-{seq}"
                r, unknown = self.call("advance", lambda e=event_id, f=flow, s=seq, k=kind, n=i + 1: (
                    self.producer.advance(e, f, expected_seq=s - 1, kind=k, payload={"amount": n})))
                allowed = ("committed", "existing") if unknown else ("committed",)
                if r.status not in allowed or r.seq != seq:
                    raise Wrong(f"advance {event_id}: {r} (an earlier COMMIT outcome unknown: {unknown})")
                self.log("advance", r.status, event_id)
                while True:
                    d, _ = self.call("relay", lambda: relay(self.producer, self.consumer))
                    if d.status == "idle":
                        break
                    # duplicate: a re-send after a failed call, or after a lost
                    # non-durable mark (the server crashed before flushing it).
                    if d.status not in ("accepted", "duplicate"):
                        raise Wrong(f"relay: {d}")
                    self.log("relay", d.status, d.event_id)
                a, _ = self.call("apply", lambda f=flow: self.consumer.apply_next(f))
                if a.status == "applied":
                    self.log("apply", "applied", a.event_id)
                    if a.event_id != event_id:
                        raise Wrong(f"apply {flow}: applied {a.event_id}, expected {event_id}")
                elif a.status != "idle":  # idle: an earlier try's COMMIT happened after all
                    raise Wrong(f"apply {flow}: {a}")
                last, _ = self.call("read", lambda f=flow: self.consumer.projection(f))
                if last is None or last["last_seq"] != seq:
                    raise Wrong(f"{flow}: projection {last} after applying seq {seq}")

    @property
    def producer(self) -> Producer:
        assert self.p is not None
        return self.p

    @property
    def consumer(self) -> Consumer:
        assert self.c is not None
        return self.c


def main(argv: list[str]) -> int:
    producer, consumer, journal, flows = argv
    outage = Outage(producer, consumer, journal)
    print("ready", flush=True)
    try:
        outage.run(int(flows))
    except Wrong as exc:
        print(f"WRONG ANSWER: {exc}", file=sys.stderr, flush=True)
        return WRONG
    finally:
        for thing in (outage.p, outage.c):
            if thing is not None:
                try:
                    thing.close()
                except StorageError:
                    pass
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

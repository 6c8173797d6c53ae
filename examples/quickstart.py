"""Quickstart: one flow, three steps, from the producer's file to the consumer's.

    python examples/quickstart.py [DIR]

Without DIR the two SQLite files live in a temporary directory that is removed
at the end; with DIR they are kept there (run it twice to see every retry answer
"existing" or "duplicate" and nothing happen twice).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION

STEPS = [("A1", "reserved"), ("A2", "confirmed"), ("A3", "released")]


def run(where: Path) -> None:
    with (
        Producer(where / "producer.db", RESERVATION) as producer,
        Consumer(where / "consumer.db", RESERVATION) as consumer,
    ):
        print("advance: flow state and its outbox event are committed in one transaction")
        for seq, (event_id, kind) in enumerate(STEPS):
            r = producer.advance(event_id, "A", expected_seq=seq, kind=kind, payload={"amount": 3})
            print(f"  advance {event_id} {kind:<9} -> {r.status}, seq {r.seq}")
        r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        print(f"  advance A1 again -> {r.status}: same id and body, so a retry is safe")
        r = producer.advance("A9", "A", expected_seq=1, kind="released", payload={"amount": 3})
        print(f"  advance A9 at expected_seq 1 -> {r.status}: the flow moved on; nothing written")
        print("relay: the consumer stores each event in its inbox; now it owns it")
        while (sent := relay(producer, consumer)).status != "idle":
            print(f"  relay {sent.event_id} -> {sent.status}")
        print(f"  projection A before drain: {consumer.projection('A')}  (accepted is not applied)")
        done = consumer.drain("A")
        print(f"drain A -> applied {done.applied}, stopped at {done.stop}: strictly in seq order")
        print(f"  projection A: {consumer.projection('A')}")
        again = relay(producer, consumer, event_id="A2").status
        kinds = [e.kind for e in consumer.applied("A")]
        print(f"relay A2 again -> {again}; effects A: {kinds} (one per event, ever)")


def main(argv: list[str]) -> int:
    if argv:
        Path(argv[0]).mkdir(parents=True, exist_ok=True)
        run(Path(argv[0]))
        print(f"files kept in {argv[0]}")
        return 0
    with tempfile.TemporaryDirectory(prefix="quickstart_") as tmp:
        run(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

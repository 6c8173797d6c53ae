"""``python -m reliable_flow demo``: a narrated walk through the three ledgers."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from .._consumer import Consumer
from .._producer import Producer
from .._relay import relay
from ..reservation import RESERVATION
from .snapshot import snapshot

__all__ = ["run_demo"]


def run_demo(directory: str | None = None, out: Callable[[str], None] = print) -> int:
    """Run the demo on fresh files in ``directory`` (a temporary one by default)."""
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="reliable_flow_demo_") as tmp:
            return _run(Path(tmp), out, keep=False)
    Path(directory).mkdir(parents=True, exist_ok=True)
    return _run(Path(directory), out, keep=True)


def _run(where: Path, say: Callable[[str], None], keep: bool) -> int:
    producer_path, consumer_path = where / "producer.db", where / "consumer.db"
    for stale in where.glob("*.db*"):
        stale.unlink()
    producer = Producer(producer_path, RESERVATION)
    consumer = Consumer(consumer_path, RESERVATION)  # decodes schema 1 only

    say("reliable_flow demo: two SQLite files, three ledgers (committed / accepted / applied)")
    say(f"  producer file: {producer_path.name}   consumer file: {consumer_path.name}")
    say("")
    say("1. The producer advances flow A three times. Each advance commits the flow's")
    say("   new state and its outbox event in ONE transaction.")
    for seq, (kind, eid) in enumerate([("reserved", "A1"), ("confirmed", "A2"), ("released", "A3")]):
        r = producer.advance(eid, "A", expected_seq=seq, kind=kind, payload={"amount": 3})
        say(f"   advance {eid} {kind:<9} -> {r.status} (seq {r.seq})")
    r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
    say(f"   advance A1 again      -> {r.status} (a retry is safe, even after the flow moved on)")
    say("")
    say("2. The network delivers A3 first, then A1, then A1 again, then A2.")
    say(f"   relay A3 -> {relay(producer, consumer, event_id='A3').status}")
    a = consumer.apply_next("A")
    say(f"   apply_next(A) -> {a.status}: seq {a.seq} is missing, so A3 waits in the inbox")
    say(f"   relay A1 -> {relay(producer, consumer, event_id='A1').status}")
    d = consumer.drain("A")
    say(f"   drain(A) -> applied {d.applied}, stopped at {d.stop} (A2 still missing)")
    say(f"   relay A1 -> {relay(producer, consumer, event_id='A1').status} (stored once, no second effect)")
    say(f"   relay A2 -> {relay(producer, consumer, event_id='A2').status}")
    d = consumer.drain("A")
    say(f"   drain(A) -> applied {d.applied}, stopped at {d.stop}")
    p = consumer.projection("A")
    effects = ", ".join(e.kind for e in consumer.applied("A"))
    say(f"   projection A: {p['state']}, last_seq {p['last_seq']}, held {p['held']}; effects: {effects}")  # type: ignore[index]
    say("")
    say("3. Flow B changes payload format: B2 and B3 use schema 2 ({'units': n}),")
    say("   which this consumer cannot decode yet.")
    producer.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 5})
    producer.advance("B2", "B", expected_seq=1, kind="confirmed", payload={"units": 5}, schema=2)
    producer.advance("B3", "B", expected_seq=2, kind="released", payload={"units": 5}, schema=2)
    while (r2 := relay(producer, consumer)).status != "idle":
        say(f"   relay {r2.event_id} -> {r2.status}")
    d = consumer.drain("B")
    last = d.last
    say(f"   drain(B) -> applied {d.applied}, stopped at {d.stop} "
        f"({last.reason if last else ''} at seq {last.seq if last else ''})")
    say("   B2 is accepted (the consumer owns it) but not applied; nothing was guessed.")
    producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 1})
    say("   Meanwhile C1 is committed, but no relay has run for it yet.")
    say("")
    say("   The three ledgers now disagree, and each is right about its own step:")
    _table(producer_path, consumer_path, say)
    consumer.close()
    upgraded = Consumer(consumer_path, RESERVATION, schemas={1, 2})
    d = upgraded.drain("B")
    say(f"   upgrade: Consumer(..., schemas={{1, 2}}) on the same file -> drain(B) applied {d.applied}, "
        f"stopped at {d.stop}")
    p = upgraded.projection("B")
    say(f"   projection B: {p['state']}, last_seq {p['last_seq']}, held {p['held']}")  # type: ignore[index]
    say(f"   relay C1 -> {relay(producer, upgraded).status}, drain(C) -> {upgraded.drain('C').stop}")
    upgraded.close()
    producer.close()
    say("")
    say("4. After the upgrade, per event:")
    _table(producer_path, consumer_path, say)
    say("")
    say("committed = producer state + outbox event in one commit; accepted = the consumer")
    say("durably stored it; applied = the consumer's projection, effect and mark in one commit.")
    if keep:
        say(f"Files kept in {where}; look at them with sqlite3 or reliable_flow.snapshot().")
    return 0


def _table(producer_path: Path, consumer_path: Path, say: Callable[[str], None]) -> None:
    snap = snapshot(producer_path, consumer_path)
    say(f"   {'event':<6} {'flow':<5} {'seq':>3}  {'committed':<9}  {'accepted':<8}  {'applied':<7}  inbox")
    for flow_id, events in snap["producer"]["outbox"].items():
        inbox = {row["event_id"]: row for row in snap["consumer"]["inbox"].get(flow_id, [])}
        for event in events:
            row = inbox.get(event["event_id"])
            state = "-" if row is None else row["state"] + (f" ({row['reason']})" if row["reason"] else "")
            applied = "yes" if row is not None and row["state"] == "applied" else "no"
            say(f"   {event['event_id']:<6} {flow_id:<5} {event['seq']:>3}  {'yes':<9}  "
                f"{'yes' if event['accepted'] else 'no':<8}  {applied:<7}  {state}")

"""Scenarios in one process: idempotency, accepted-is-not-applied, schemas, poison, refusals.

What ``advance`` answers to a repeated, changed or stale step; that an
accepted event is not yet applied; a schema upgrade that unblocks events
without rewriting them; a poison event set aside without starving other
flows; and events the consumer refuses to apply, blocked with a reason.
"""

from __future__ import annotations

from ..._consumer import Consumer
from ..._producer import Producer
from ..._relay import relay
from ...reservation import RESERVATION
from .harness import (
    Files,
    Result,
    advance_first,
    advance_flow,
    bodies,
    drain_dict,
    effects_of,
    event_of,
    inbox_of,
    observe,
    open_files,
    outbox_of,
    relay_until_idle,
    run_sql,
)

__all__ = [
    "accepted_is_not_applied",
    "advance_idempotency",
    "consumer_blocks_invalid_events",
    "poison_isolation_and_explicit_relay",
    "poison_resolved_then_explicit_relay",
    "schema_upgrade",
]


# -- the seed's ----------------------------------------------------------------------


def advance_idempotency(files: Files) -> Result:
    """Same id and body: existing; same id, other body: conflict; new id, old seq: stale."""
    with open_files(files) as (producer, _):
        committed = advance_flow(producer, "A")
        # name -> (event_id, flow_id, expected_seq, kind, payload, schema) of one more call
        calls: dict[str, tuple[str, str, int, str, Result, int]] = {
            "A1_again_identical": ("A1", "A", 0, "reserved", {"amount": 3}, 1),
            "A1_changed_amount": ("A1", "A", 0, "reserved", {"amount": 4}, 1),
            "A1_changed_flow": ("A1", "B", 0, "reserved", {"amount": 3}, 1),
            "A1_changed_schema": ("A1", "A", 0, "reserved", {"units": 3}, 2),
            "A4_new_id_stale_expected_seq": ("A4", "A", 1, "confirmed", {"amount": 3}, 1),
            "A4_new_id_step_after_released": ("A4", "A", 3, "reserved", {"amount": 3}, 1),
            "C1_new_flow_amount_0": ("C1", "C", 0, "reserved", {"amount": 0}, 1),
        }
        attempts = {
            name: producer.advance(
                event_id, flow_id, expected_seq=seq, kind=kind, payload=payload, schema=schema
            )
            for name, (event_id, flow_id, seq, kind, payload, schema) in calls.items()
        }
        answers: Result = {}
        for name, r in attempts.items():
            entry: Result = {"status": str(r.status), "seq": r.seq}
            if r.status == "conflict":
                entry["reason"] = r.reason
            answers[name] = entry
        return {
            "first_three_advances": committed,
            "attempts": answers,
            "flow_A_after": producer.flow("A"),
            "outbox_after": outbox_of(producer),
            "flows_B_and_C_after": [producer.flow("B"), producer.flow("C")],
        }


def accepted_is_not_applied(files: Files) -> Result:
    """Three events relayed: all accepted marks true, all inbox rows pending, nothing applied."""
    with open_files(files) as (producer, consumer):
        advance_flow(producer, "A")
        relayed = relay_until_idle(producer, consumer)
        return {
            "relay": relayed,
            **{k: v for k, v in observe(producer, consumer, "A").items() if k != "flow"},
        }


def schema_upgrade(files: Files) -> Result:
    """Seq 2 and 3 in schema 2: blocked unsupported_schema, then applied unchanged after upgrade."""
    with Producer(files.producer, RESERVATION) as producer:
        with Consumer(files.consumer, RESERVATION) as old:
            advanced = advance_flow(producer, "A", schemas=(1, 2, 2))
            relayed = relay_until_idle(producer, old)
            before = {
                "drain": drain_dict(old.drain("A")),
                "drain_again": drain_dict(old.drain("A")),
                "projection": old.projection("A"),
                "inbox": inbox_of(old, "A"),
            }
        with Consumer(files.consumer, RESERVATION, schemas={1, 2}) as upgraded:
            after = {
                "drain": drain_dict(upgraded.drain("A")),
                "projection": upgraded.projection("A"),
                "inbox": inbox_of(upgraded, "A"),
                "effects": effects_of(upgraded, "A"),
            }
    unchanged = bodies(files.producer, "outbox") == bodies(files.consumer, "inbox")
    return {
        "advance": advanced,
        "relay": relayed,
        "schema_1_consumer": before,
        "schemas_1_2_consumer_same_file": after,
        "inbox_bodies_equal_outbox_bodies": unchanged,
    }


def _plant_conflicting_a1(producer: Producer, consumer: Consumer) -> str:
    """Commit A1 and B1; put into the consumer an A1 with another body (amount 4, not 3)."""
    for flow_id in ("A", "B"):
        advance_first(producer, f"{flow_id}1", flow_id)
    return str(consumer.receive({**event_of(producer, "A1"), "payload": {"amount": 4}}).status)


def poison_isolation_and_explicit_relay(files: Files) -> Result:
    """A1 conflicts in the consumer: it is set aside, B1 still flows, explicit relay works."""
    with open_files(files) as (producer, consumer):
        planted = _plant_conflicting_a1(producer, consumer)
        plain = []
        for _ in range(3):
            r = relay(producer, consumer)
            plain.append({"status": str(r.status), "event_id": r.event_id})
        a1 = next(e for e in producer.outbox("A") if e.event_id == "A1")
        explicit = {
            eid: str(relay(producer, consumer, event_id=eid).status) for eid in ("B1", "A1")
        }
        return {
            "planted_A1_with_amount_4": planted,
            "plain_relays": plain,
            "A1_in_outbox": {k: getattr(a1, k) for k in ("accepted", "state", "last_status")},
            "explicit_relays": explicit,
            "outbox_B": outbox_of(producer, "B"),
            "drain_B": drain_dict(consumer.drain("B")),
            "projection_B": consumer.projection("B"),
            "inbox_A": inbox_of(consumer, "A"),
        }


# -- ours ----------------------------------------------------------------------------


def poison_resolved_then_explicit_relay(files: Files) -> Result:
    """The set-aside A1 after an operator removes the consumer's wrong, unapplied copy."""
    with open_files(files) as (producer, consumer):
        _plant_conflicting_a1(producer, consumer)
        first = relay_until_idle(producer, consumer)
        removed = run_sql(
            files.consumer, "DELETE FROM inbox WHERE event_id = 'A1' AND state <> 'applied'"
        )
        plain = str(relay(producer, consumer).status)
        explicit = str(relay(producer, consumer, event_id="A1").status)
        a1 = next(e for e in producer.outbox("A") if e.event_id == "A1")
        return {
            "relay_until_idle_before_fix": first,
            "operator_deleted_inbox_rows": removed,
            "plain_relay_after_fix": plain,
            "explicit_relay_A1": explicit,
            "A1_in_outbox": {k: getattr(a1, k) for k in ("accepted", "state", "last_status")},
            "drain_A": drain_dict(consumer.drain("A")),
            "projection_A": consumer.projection("A"),
            "effects_A": effects_of(consumer, "A"),
        }


def consumer_blocks_invalid_events(files: Files) -> Result:
    """Events our producer would refuse, received directly: blocked with a reason, never skipped."""

    def env(event_id: str, flow_id: str, seq: int, kind: str, amount: int) -> Result:
        return {
            "event_id": event_id,
            "flow_id": flow_id,
            "seq": seq,
            "kind": kind,
            "schema": 1,
            "payload": {"amount": amount},
        }

    planted = [
        env("X1", "X", 1, "reserved", 3),
        env("X2", "X", 2, "released", 3),
        env("X3", "X", 3, "released", 3),
        env("Y1", "Y", 1, "reserved", 3),
        env("Y2", "Y", 2, "confirmed", 4),
    ]
    with Consumer(files.consumer, RESERVATION) as consumer:
        received = {e["event_id"]: str(consumer.receive(e).status) for e in planted}
        first = {flow: drain_dict(d) for flow, d in consumer.process_all().items()}
        second = {flow: drain_dict(d) for flow, d in consumer.process_all().items()}
        return {
            "received": received,
            "process_all": first,
            "process_all_again": second,
            "inbox": {flow: inbox_of(consumer, flow) for flow in ("X", "Y")},
            "projections": {flow: consumer.projection(flow) for flow in ("X", "Y")},
        }

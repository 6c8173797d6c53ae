"""One record type for every operator action (issue 19, item 5):
``OperatorAction``, whose ``target`` (``ActionTarget``) says what it acted
on and which optional fields it fills.

Behaviour on both engines (the ``engine`` fixture): every admin action of
``producer.admin`` and ``consumer.admin`` returns one, and every listing
lists them.  The JSON shape of each kind (``as_dict``) is the one it had
before the four types became one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from engine_reads import new_location
from reliable_flow import (
    Consumer,
    Producer,
    relay,
)
from reliable_flow.records import OperatorAction
from reliable_flow.reservation import RESERVATION
from reliable_flow.statuses import ActionTarget, DeliveryState, InboxState
from support import KINDS, dead_effects, troubled_history

WHO = {"actor": "alice", "reason": "INC-7: checked by hand"}

#: The JSON keys of each kind, as before the four record types became one.
SHAPES = {
    ActionTarget.DELIVERY: {"at", "consumer", "event_id", "action", "actor", "reason", "previous_state"},
    ActionTarget.INBOX: {"at", "event_id", "flow_id", "seq", "action", "previous_state", "actor", "reason",
                         "replacement_event_id"},
    ActionTarget.EFFECT: {"at", "key", "action", "actor", "reason"},
    ActionTarget.REGISTRY: {"at", "consumer", "action", "actor", "reason"},
    ActionTarget.RETENTION: {"at", "action", "horizon", "forget_before", "actor", "reason"},
    ActionTarget.SCHEDULE: {"at", "schedule", "action", "actor", "reason"},
}
#: The optional fields each target fills (every other one is None).
FILLED = {
    ActionTarget.DELIVERY: {"event_id", "consumer", "previous_state"},
    ActionTarget.INBOX: {"event_id", "flow_id", "seq", "previous_state", "replacement_event_id"},
    ActionTarget.EFFECT: {"key"},
    ActionTarget.REGISTRY: {"consumer"},
    ActionTarget.RETENTION: {"horizon", "forget_before"},
    ActionTarget.SCHEDULE: {"schedule"},
}
OPTIONAL = {"event_id", "consumer", "flow_id", "seq", "key", "previous_state", "replacement_event_id", "horizon",
            "forget_before", "topics",  # topics: a registry action that named topics (issue 32)
            "schedule"}  # schedule: a recurring schedule's pause / resume / remove (issue 33)


def unfilled(record: OperatorAction) -> dict[str, Any]:
    """The optional fields the record's target does not fill (all should be None)."""
    return {name: getattr(record, name) for name in OPTIONAL - FILLED[record.target]}


@pytest.fixture
def troubled(engine: str, tmp_path: Path) -> tuple[str, str]:
    """``troubled_history``: A2 blocked in the inbox, C1 set aside, D1 pending."""
    producer_at, consumer_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    troubled_history(producer_at, consumer_at)
    return producer_at, consumer_at


# -- the type -------------------------------------------------------------------------------


def test_one_frozen_keyword_only_record_with_a_target() -> None:
    assert [t.value for t in ActionTarget] == ["delivery", "inbox", "effect", "registry", "retention",
                                                 "schedule"]
    assert "ActionTarget" in reliable_flow.statuses.__all__ and "ActionTarget" not in reliable_flow.__all__
    names = [f.name for f in dataclasses.fields(OperatorAction)]
    assert names[:5] == ["at", "target", "action", "actor", "reason"]
    assert set(names[5:]) == OPTIONAL
    with pytest.raises(TypeError):
        OperatorAction(1.0, ActionTarget.EFFECT, "retry", "ops", "why")  # type: ignore[misc]
    record = OperatorAction(at=1.0, target=ActionTarget.EFFECT, key="k", action="retry", actor="ops", reason="why")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.actor = "someone else"  # type: ignore[misc]
    assert not hasattr(record, "__dict__")  # slots
    assert record.as_dict() == {"at": 1.0, "key": "k", "action": "retry", "actor": "ops", "reason": "why"}


# -- the producer ---------------------------------------------------------------------------


def test_delivery_actions_return_and_list_operator_actions(troubled: tuple[str, str]) -> None:
    producer_at, _ = troubled
    with Producer(producer_at, RESERVATION) as producer:
        before = producer.admin.operator_actions()  # troubled_history's own redeliver of B2
        redelivered = producer.admin.redeliver("C1", consumer="default", **WHO)
        skipped = producer.admin.skip("D1", consumer="default", actor="bob", reason="never wanted")
        listed = producer.admin.operator_actions()
        of_c1 = producer.admin.operator_actions("C1")
    for record, action, event_id, was in ((redelivered, "redeliver", "C1", DeliveryState.SET_ASIDE),
                                          (skipped, "skip", "D1", DeliveryState.PENDING)):
        assert type(record) is OperatorAction and record.target is ActionTarget.DELIVERY
        assert (record.action, record.event_id, record.consumer, record.previous_state) == (
            action, event_id, "default", was)
        assert set(unfilled(record).values()) == {None}
        assert set(record.as_dict()) == SHAPES[ActionTarget.DELIVERY]
    # listed: the same records, without the previous state (not stored)
    assert listed == [*before, dataclasses.replace(redelivered, previous_state=None),
                      dataclasses.replace(skipped, previous_state=None)]
    assert of_c1 == [listed[-2]]
    assert all(type(a) is OperatorAction and a.target is ActionTarget.DELIVERY for a in listed)
    assert set(listed[-1].as_dict()) == SHAPES[ActionTarget.DELIVERY] - {"previous_state"}


def test_registry_actions_return_and_list_operator_actions(producer: Producer, consumer: Consumer) -> None:
    producer.advance("A1", "A", expected_seq=0, kind=KINDS[0], payload={"amount": 3})
    relay(producer, consumer)  # the first consumer registers itself: actor "relay"
    registered = producer.admin.register_consumer("audit", **WHO)
    removed = producer.admin.remove_consumer("audit", actor="bob", reason="typo")
    for record, action in ((registered, "register"), (removed, "remove")):
        assert type(record) is OperatorAction and record.target is ActionTarget.REGISTRY
        assert (record.action, record.consumer) == (action, "audit")
        assert set(unfilled(record).values()) == {None}
        assert set(record.as_dict()) == SHAPES[ActionTarget.REGISTRY]
    [by_relay, *mine] = producer.admin.registry_actions()
    assert mine == [registered, removed] == producer.admin.registry_actions("audit")
    assert (by_relay.target, by_relay.consumer, by_relay.action, by_relay.actor) == (
        ActionTarget.REGISTRY, "default", "register", "relay")


# -- the consumer ---------------------------------------------------------------------------


def test_inbox_actions_return_and_list_operator_actions(troubled: tuple[str, str]) -> None:
    _, consumer_at = troubled
    fix = {"event_id": "A2-fix", "flow_id": "A", "seq": 2, "kind": "confirmed", "schema": 1, "payload": {"amount": 3}}
    with Consumer(consumer_at, RESERVATION) as consumer:
        replaced = consumer.admin.replace_event("A2", fix, **WHO)
        skipped = consumer.admin.skip_event("A2-fix", actor="bob", reason="left out")
        listed = consumer.admin.operator_actions()
        naming_fix = consumer.admin.operator_actions("A2-fix")
    assert (replaced.action, replaced.event_id, replaced.replacement_event_id, replaced.previous_state) == (
        "replace", "A2", "A2-fix", InboxState.BLOCKED)
    assert (skipped.action, skipped.event_id, skipped.replacement_event_id, skipped.previous_state) == (
        "skip", "A2-fix", None, InboxState.PENDING)
    for record in (replaced, skipped):
        assert type(record) is OperatorAction and record.target is ActionTarget.INBOX
        assert (record.flow_id, record.seq) == ("A", 2)
        assert set(unfilled(record).values()) == {None}
        assert set(record.as_dict()) == SHAPES[ActionTarget.INBOX]  # replacement_event_id even when None
    assert listed == [replaced, skipped] == naming_fix  # the inbox stores the previous state


def test_effect_actions_return_and_list_operator_actions(engine: str, tmp_path: Path) -> None:
    consumer_at = dead_effects(engine, tmp_path, ("A", "B", "C"))
    a, b, c = "default:A1:notify", "default:B1:notify", "default:C1:notify"
    with Consumer(consumer_at, RESERVATION) as consumer:
        done = [consumer.admin.retry_effect(a, **WHO), consumer.admin.resolve_effect(b, result={"ok": 1}, **WHO),
                consumer.admin.cancel_effect(c, actor="bob", reason="too late")]
        listed = consumer.admin.effect_actions()
        of_b = consumer.admin.effect_actions(b)
    for record, action, key in zip(done, ("retry", "resolve", "cancel"), (a, b, c)):
        assert type(record) is OperatorAction and record.target is ActionTarget.EFFECT
        assert (record.action, record.key) == (action, key)
        assert set(unfilled(record).values()) == {None}
        assert record.as_dict() == {"at": record.at, "key": key, "action": action, "actor": record.actor,
                                    "reason": record.reason}
    assert listed == done and of_b == [done[1]]


# -- the JSON shapes: as before, no "target" ----------------------------------------------------


def test_the_json_of_each_kind_keeps_its_keys(troubled: tuple[str, str]) -> None:
    from reliable_flow._tools.drilldown import event_report
    from reliable_flow._tools.snapshot import snapshot

    producer_at, consumer_at = troubled
    with Producer(producer_at, RESERVATION) as producer, Consumer(consumer_at, RESERVATION) as consumer:
        producer.admin.skip("C1", consumer="default", **WHO)
        consumer.admin.skip_event("A2", **WHO)
    report = event_report(producer_at, consumer_at, "C1")
    [listed] = report["producer"]["operator_actions"]
    assert set(listed) == SHAPES[ActionTarget.DELIVERY] - {"previous_state"}
    report = event_report(producer_at, consumer_at, "A2")
    [listed] = report["consumer"]["actions"]
    assert set(listed) == SHAPES[ActionTarget.INBOX]
    assert (listed["previous_state"], listed["replacement_event_id"]) == ("blocked", None)
    dumped = snapshot(producer_at, consumer_at)
    assert {frozenset(a) for a in dumped["producer"]["operator_actions"]} == {
        frozenset(SHAPES[ActionTarget.DELIVERY] - {"previous_state"})}
    json.dumps(dumped)  # still JSON-able

"""Topics, subscriptions and a partial subscriber's order (issue 32), on both engines.

A producer declares topics (001 section 2: ``agent.commands``,
``agent.domain-events``, ``agent.notifications``, ``agent.audit``); a
consumer name subscribes to some of them and gets only their events, each
delivery carrying the seq of the flow's previous event for that consumer
(``prev_seq``), fixed when the event commits.  So the partial subscriber
applies in the flow's order, reports a gap only for an event that is for
it, and never waits for one that is not.  Bad input is refused with an
error naming it, and nothing is stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import new_location, rows
from reliable_flow import Consumer, DeliveryPolicy, Producer, Topic, relay
from reliable_flow.errors import InvalidEnvelope, TopicError, UnknownConsumer, UnknownEvent
from reliable_flow.protocol import Protocol
from support import relay_until_idle

KINDS = ("review.requested", "review.completed", "notification.sent", "audit.noted")
#: Every kind from every state: a consumer that sees only some of a flow's
#: events must be able to apply them (its protocol says what it accepts).
AGENT = Protocol(name="agent", initial="new", transitions={s: KINDS for s in ("new", *KINDS)},
                 schemas={1: lambda kind, payload: dict(payload)})
WHO = {"actor": "alice", "reason": "issue 32"}


def topics() -> list[Topic]:
    return [
        Topic("agent.commands", kinds={"review.requested"}, role="command"),
        Topic("agent.domain-events", kinds={"review.completed"}),
        Topic("agent.notifications", kinds={"notification.sent"}),
        Topic("agent.audit", kinds=set(KINDS)),
    ]


#: One flow's steps, in order: seq 1..6.
STEPS = ("review.requested", "notification.sent", "review.completed", "audit.noted", "notification.sent",
         "review.completed")


@pytest.fixture
def at(engine: str, tmp_path: Path) -> Iterator[Any]:
    yield lambda label: new_location(engine, tmp_path, label)


def advance_all(producer: Producer, flow: str = "F", steps: tuple[str, ...] = STEPS, start: int = 0) -> None:
    for i, kind in enumerate(steps, start=start):
        r = producer.advance(f"{flow}{i + 1}", flow, expected_seq=i, kind=kind, payload={"n": i + 1})
        assert r.status == "committed", r


def test_a_partial_subscriber_gets_only_its_topics_events_with_the_previous_seq(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, Consumer(at("c"), AGENT, name="notify") as c:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        p.admin.register_consumer("audit", **WHO)  # every event, as before topics
        advance_all(p)
        # Only its topic's events are kept for it, and counted in its backlog.
        backlog = {e.name: e.backlog for e in p.admin.consumers()}
        assert backlog == {"audit": 6, "notify": 2}
        bodies = [json.loads(b) for _, b in p.store.latest.next_due("notify", float("inf"), 100)]
        assert [(b["seq"], b.get("prev_seq")) for b in bodies] == [(2, 0), (5, 2)]
        assert [json.loads(b).get("prev_seq") for _, b in p.store.latest.next_due("audit", float("inf"), 100)] \
            == [None] * 6  # a full subscriber's body is the event's own
        assert [r.event_id for r in relay_until_idle(p, c)] == ["F2", "F5"]
        # The producer's event stays the one committed; the consumer stores what it was delivered.
        assert "prev_seq" not in p.event("F5") and c.event("F5")["prev_seq"] == 2
        assert [c.apply_next("F").seq for _ in range(2)] == [2, 5]
        assert c.apply_next("F").status == "idle"
        assert c.projection("F")["last_seq"] == 5
        assert [e.seq for e in c.applied("F")] == [2, 5]


def test_a_missing_event_for_it_is_a_gap_and_one_not_for_it_is_never_waited_for(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, Consumer(at("c"), AGENT, name="events") as c:
        p.admin.register_consumer("events", topics=["agent.domain-events", "agent.notifications"], **WHO)
        advance_all(p)  # its events: seq 2, 3, 5, 6 (not 1: a command, not 4: audit only)
        with pytest.raises(UnknownEvent, match="'F4' is not for consumer 'events'"):
            relay(p, c, event_id="F4")  # an event not for it is never sent to it
        assert relay(p, c, event_id="F5").status == "accepted"
        assert relay(p, c, event_id="F3").status == "accepted"
        gap = c.apply_next("F")
        # seq 1 and 4 are not for it: it waits for seq 2, its first event of the flow.
        assert (gap.status, gap.seq) == ("gap", 2) and "seq 2" in (gap.detail or "")
        assert c.stuck("F").detail == "seq 2 has not arrived"
        assert relay(p, c, event_id="F2").status == "accepted"
        assert [c.apply_next("F").seq for _ in range(2)] == [2, 3]
        # seq 4 is not for it: seq 5 applies at once.
        assert (c.apply_next("F").status, c.projection("F")["last_seq"]) == ("applied", 5)
        assert c.apply_next("F").status == "idle"
        assert relay(p, c, event_id="F6").status == "accepted"
        assert c.apply_next("F").seq == 6


def test_apply_on_arrival_and_the_worker_follow_prev_seq(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, \
            Consumer(at("c"), AGENT, name="notify", apply_on_receive=True) as c:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        advance_all(p)
        answers = relay_until_idle(p, c)
        assert [a.status for a in answers] == ["accepted", "accepted"]
        assert c.projection("F")["last_seq"] == 5 and c.inbox("F")[-1].state == "applied"


def test_the_declaration_is_recorded_and_checked_on_reopen(at: Any) -> None:
    location = at("p")
    with Producer(location, AGENT, topics=topics()) as p:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        declared = p.topics
    with Producer(location, AGENT) as p:  # no topics given: the recorded ones
        assert p.topics == declared
        advance_all(p)
        assert {e.name: e.backlog for e in p.admin.consumers()} == {"notify": 2}
    renamed = [t for t in topics() if t.name != "agent.notifications"] + [
        Topic("agent.notices", kinds={"notification.sent"})]
    with pytest.raises(TopicError, match="'agent.notifications' is subscribed by consumer 'notify'"):
        Producer(location, AGENT, topics=renamed)
    with Producer(location, AGENT) as p:
        assert p.topics == declared  # nothing stored
    # A new topic, the subscribed ones kept: recorded.
    more = [*topics(), Topic("agent.projections", kinds={"review.completed"}, retention=3600.0)]
    with Producer(location, AGENT, topics=more) as p:
        assert "agent.projections" in {t.name for t in p.topics}
    with Producer(location, AGENT) as p:
        assert next(t for t in p.topics if t.name == "agent.projections").retention == 3600.0


def test_a_producer_without_topics_is_unchanged(at: Any) -> None:
    with Producer(at("p"), AGENT) as p, Consumer(at("c"), AGENT) as c:
        assert p.topics == ()
        advance_all(p)
        assert [json.loads(b).get("prev_seq") for _, b in p.store.latest.next_due("default", 0, 10)] == []
        relay_until_idle(p, c)
        assert c.drain("F").applied == 6
        with pytest.raises(TopicError, match="declares no topics"):
            p.admin.subscribe("default", ["agent.audit"], **WHO)


def test_a_subscription_change_holds_from_a_recorded_position(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, Consumer(at("c"), AGENT, name="notify") as c:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        advance_all(p, steps=STEPS[:3])  # seq 1..3: notify gets seq 2
        record = p.admin.subscribe("notify", ["agent.notifications", "agent.domain-events"], **WHO)
        assert (record.action, record.topics) == ("subscribe", ("agent.domain-events", "agent.notifications"))
        entry = next(e for e in p.admin.consumers() if e.name == "notify")
        assert entry.topics == ("agent.domain-events", "agent.notifications") and entry.topics_from == 3
        assert [a.action for a in p.admin.registry_actions("notify")] == ["register", "subscribe"]
        advance_all(p, steps=STEPS[3:], start=3)  # seq 4..6: it gets 5 and 6
        # seq 3 (a domain event, committed before the change) is not half-seen: not delivered.
        assert [r.event_id for r in relay_until_idle(p, c)] == ["F2", "F5", "F6"]
        assert c.drain("F").applied == 3 and c.projection("F")["last_seq"] == 6


def test_registering_a_subscriber_from_the_first_event_routes_the_stored_ones(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, Consumer(at("c"), AGENT, name="events") as c:
        advance_all(p)
        p.admin.register_consumer("events", topics=["agent.domain-events"], **WHO)
        advance_all(p, flow="G", steps=STEPS[:3])
        assert [r.event_id for r in relay_until_idle(p, c)] == ["F3", "F6", "G3"]
        assert c.process_all()["F"].applied == 2 and c.projection("G")["last_seq"] == 3
        assert next(e for e in p.admin.consumers() if e.name == "events").topics_from == 0


def test_bad_input_is_refused_naming_it_and_nothing_is_stored(at: Any) -> None:
    location = at("p")
    with pytest.raises(ValueError, match="kind 'audit.noted' is in no topic"):
        Producer(location, AGENT, topics=[Topic("agent.commands", kinds=set(KINDS) - {"audit.noted"})])
    with pytest.raises(ValueError, match="kind 'refund.approved' is not a kind of the protocol"):
        Producer(location, AGENT, topics=[*topics(), Topic("x", kinds={"refund.approved"})])
    with pytest.raises(ValueError, match="role must be 'command' or 'fact'"):
        Topic("agent.commands", kinds={"review.requested"}, role="order")
    with pytest.raises(ValueError, match="topic 'agent.audit' is declared twice"):
        Producer(location, AGENT, topics=[*topics(), Topic("agent.audit", kinds={"audit.noted"})])
    with pytest.raises(ValueError, match="retention"):
        Topic("t", kinds={"audit.noted"}, retention=float("nan"))
    with pytest.raises(TypeError, match="delivery"):
        Topic("t", kinds={"audit.noted"}, delivery=30)  # type: ignore[arg-type]
    with Producer(location, AGENT, topics=topics()) as p:
        p.admin.register_consumer("reviewer", topics=["agent.commands"], **WHO)
        before = (p.admin.consumers(), p.admin.registry_actions())
        with pytest.raises(TopicError, match="topic 'agent.command' is not declared"):
            p.admin.register_consumer("x", topics=["agent.command"], **WHO)
        with pytest.raises(TopicError, match="command topic 'agent.commands'.*'reviewer' and 'second'"):
            p.admin.register_consumer("second", topics=["agent.commands"], **WHO)
        p.admin.register_consumer("audit", topics=["agent.audit"], **WHO)
        before = (p.admin.consumers(), p.admin.registry_actions())
        with pytest.raises(TopicError, match="command topic 'agent.commands'.*'audit' and 'reviewer'"):
            p.admin.subscribe("audit", ["agent.commands"], **WHO)
        with pytest.raises(UnknownConsumer):
            p.admin.subscribe("nobody", ["agent.audit"], **WHO)
        with pytest.raises(ValueError, match="topics must name at least one topic"):
            p.admin.subscribe("audit", [], **WHO)
        assert (p.admin.consumers(), p.admin.registry_actions()) == before
    # A command topic with two subscribers cannot be declared either.
    with Producer(location, AGENT) as p:
        p.admin.subscribe("audit", ["agent.audit", "agent.domain-events"], **WHO)
    as_command = [Topic(t.name, t.kinds, "command" if t.name == "agent.audit" else t.role) for t in topics()]
    with Producer(location, AGENT, topics=as_command) as p:
        pass  # one subscriber (audit) of agent.audit: allowed
    with Producer(location, AGENT, topics=topics()) as p:
        p.admin.register_consumer("auditor-2", topics=["agent.audit"], **WHO)
    with pytest.raises(TopicError, match="'audit' and 'auditor-2'"):
        Producer(location, AGENT, topics=as_command)


def test_a_delivered_prev_seq_is_checked_by_the_envelope_rules(at: Any) -> None:
    with Consumer(at("c"), AGENT) as c:
        body = {"event_id": "E3", "flow_id": "F", "seq": 3, "kind": "audit.noted", "schema": 1, "payload": {}}
        for bad in (3, -1, True, 1.5, "1"):
            with pytest.raises(InvalidEnvelope, match="prev_seq"):
                c.receive({**body, "prev_seq": bad})
        assert c.inbox("F") == []
        assert c.receive({**body, "prev_seq": 1}).status == "accepted"
        assert c.receive({**body, "prev_seq": 1}).status == "duplicate"
        assert c.receive({**body, "prev_seq": 0}).status == "id_conflict"
        assert c.receive({**body, "event_id": "E2", "seq": 2, "prev_seq": 1}).status == "accepted"  # = seq - 1
        assert c.event("E2")["prev_seq"] == 1  # kept: a subscriber to topics always gets one


def test_per_topic_delivery_policy_is_recorded(at: Any) -> None:
    policy = DeliveryPolicy(lease_seconds=12.0, backoff_base=2.0, backoff_cap=60.0)
    declared = [*topics()[:3], Topic("agent.audit", kinds=set(KINDS), retention=86400.0, delivery=policy)]
    location = at("p")
    with Producer(location, AGENT, topics=declared):
        pass
    with Producer(location, AGENT) as p:
        audit = next(t for t in p.topics if t.name == "agent.audit")
        assert audit.retention == 86400.0 and audit.delivery is not None
        assert (audit.delivery.lease_seconds, audit.delivery.backoff_base, audit.delivery.backoff_cap) == (12.0, 2.0,
                                                                                                           60.0)
    held = rows(location, "SELECT value FROM meta WHERE key = 'topics'")
    assert json.loads(held[0][0])[0]["name"] == "agent.audit"


@pytest.mark.redis
def test_a_partial_subscriber_through_the_redis_transport(at: Any, redis_url: str) -> None:
    """The same through Redis: the bridge's consumer stores each delivery with
    its prev_seq and applies on arrival without waiting for others' events."""
    import threading

    from reliable_flow import Worker
    from reliable_flow.transport.redis import Bridge, RedisReceiver

    c_at, opened, done = at("c"), threading.Event(), []

    def serve() -> None:
        with Consumer(c_at, AGENT, name="notify") as consumer:
            bridge = Bridge(consumer, redis_url, block=0.05)
            done.append(bridge)
            opened.set()
            try:
                bridge.run(handle_signals=False)
            finally:
                bridge.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert opened.wait(20)
    try:
        with Producer(at("p"), AGENT, topics=topics()) as p, \
                RedisReceiver(redis_url, "notify", timeout=10) as receiver:
            p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
            advance_all(p)
            advance_all(p, flow="G", steps=STEPS[:2])
            stats = Worker(p, [receiver], relay_batch=2, idle_sleep=0.05).run(until_idle=True,
                                                                               handle_signals=False)
            assert (dict(stats.relayed), stats.errors) == ({"accepted": 3}, 0)
    finally:
        done[0].stop()
        thread.join(20)
    with Consumer(c_at, AGENT, name="notify") as c:
        c.process_all()
        assert [a.seq for a in c.applied("F")] == [2, 5] and [a.seq for a in c.applied("G")] == [2]
        assert [c.event(e)["prev_seq"] for e in ("F2", "F5", "G2")] == [0, 2, 0]


# -- 6. retention and delivery per topic ------------------------------------------------------------


class Failing:
    """A receiver whose sends fail (a network down): what a backoff is recorded for."""

    def __init__(self, consumer: Consumer) -> None:
        self.name, self.uid, self.location = consumer.name, consumer.uid, consumer.location

    def accept(self, body: str) -> Any:
        raise ConnectionError("down")

    def accept_many(self, bodies: Any) -> Any:
        raise ConnectionError("down")


def test_an_events_lease_and_backoff_follow_its_topic(at: Any) -> None:
    slow = DeliveryPolicy(lease_seconds=5.0, backoff_base=100.0, backoff_cap=100.0)
    declared = [Topic("agent.notifications", kinds={"notification.sent"}, delivery=slow),
                Topic("agent.audit", kinds=set(KINDS))]
    relay_policy = DeliveryPolicy(lease_seconds=30.0, wait_for_due=False, clock=lambda: 1000.0,
                                  random=lambda: 1.0, owner="relay-1")
    with Producer(at("p"), AGENT, topics=declared) as p, Consumer(at("c"), AGENT) as c:
        advance_all(p, steps=STEPS[:3])  # seq 2 is a notification
        with pytest.raises(ConnectionError):
            relay_batch_(p, Failing(c), relay_policy)
        due = {e.event_id: e.deliveries["default"].due_at for e in p.outbox()}
        # Its topic's backoff (100 s) for the notification; the relay's own (0.5 s cap 300: 0.5) for the rest.
        assert due == {"F1": 1000.5, "F2": 1100.0, "F3": 1000.5}
    with Producer(at("p2"), AGENT, topics=declared) as p, Consumer(at("c2"), AGENT) as c:
        advance_all(p, steps=STEPS[:3])
        leased: dict[str, float] = {}

        class Watching(Failing):
            def accept_many(self, bodies: Any) -> Any:
                leased.update({e.event_id: e.deliveries["default"].due_at for e in p.outbox()})
                return c.accept_many(bodies)

        relay_batch_(p, Watching(c), relay_policy)
        assert leased == {"F1": 1030.0, "F2": 1005.0, "F3": 1030.0}  # each claimed for its topic's lease


def relay_batch_(p: Producer, receiver: Any, policy: DeliveryPolicy) -> Any:
    from reliable_flow import relay_batch

    return relay_batch(p, receiver, 10, policy=policy, register=True)


def test_pruning_keeps_an_event_while_its_topic_keeps_it(at: Any) -> None:
    import time

    declared = [Topic("agent.audit", kinds={"audit.noted"}, retention=1000.0),
                Topic("agent.rest", kinds=set(KINDS) - {"audit.noted"})]
    with Producer(at("p"), AGENT, topics=declared) as p, Consumer(at("c"), AGENT) as c:
        steps = ("audit.noted", "audit.noted", "review.requested", "notification.sent", "audit.noted",
                 "review.completed")
        advance_all(p, steps=steps)
        relay_until_idle(p, c)
        now = time.time()
        # One event per transaction: the kept audit events at the head do not stop the walk.
        pruned = p.admin.prune(10, now=now + 100, batch_size=1, **WHO)
        assert pruned.events == 3 and pruned.complete
        assert [e.event_id for e in p.outbox()] == ["F1", "F2", "F5"]
        assert p.advance("F3", "F", expected_seq=2, kind="review.requested", payload={"n": 3}).status == "existing"
        assert p.admin.prune(10, now=now + 2000, **WHO).events == 3
        assert p.outbox() == []
        assert p.advance("F1", "F", expected_seq=0, kind="audit.noted", payload={"n": 1}).status == "existing"


def test_a_consumer_tombstone_answers_a_late_delivered_duplicate(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, Consumer(at("c"), AGENT, name="notify") as c:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        advance_all(p)
        bodies = [b for _, b in p.store.latest.next_due("notify", float("inf"), 10)]
        relay_until_idle(p, c)
        c.process_all()
        assert c.admin.prune(0, **WHO).events == 2
        assert [c.accept(b).status for b in bodies] == ["duplicate", "duplicate"]


def test_the_registry_command_registers_and_subscribes_with_topics(at: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from reliable_flow._tools.cli import main

    location = at("p")
    with Producer(location, AGENT, topics=topics()):
        pass
    who = ["--actor", "alice", "--reason", "INC-7", "--protocol", "test_topics:AGENT"]
    assert main(["registry", "register", location, "events", "--topics", "agent.domain-events", *who]) == 0
    assert "of topics agent.domain-events" in capsys.readouterr().out
    assert main(["registry", "subscribe", location, "events", "--topics", "agent.domain-events,agent.audit",
                 *who, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["action"], shown["topics"]) == ("subscribe", ["agent.audit", "agent.domain-events"])
    assert main(["registry", "subscribe", location, "events", "--topics", "agent.nope", *who]) == 2
    assert "topic 'agent.nope' is not declared" in capsys.readouterr().err
    with Producer(location, AGENT) as p:
        assert [(e.name, e.topics, e.topics_from) for e in p.admin.consumers()] == [
            ("events", ("agent.audit", "agent.domain-events"), 0)]
        assert [a.action for a in p.admin.registry_actions()] == ["register", "subscribe"]


def test_compare_judges_a_partial_subscriber_by_its_own_events(at: Any) -> None:
    from reliable_flow._tools.compare import compare_files

    p_at, c_at = at("p"), at("c")
    with Producer(p_at, AGENT, topics=topics()) as p, Consumer(c_at, AGENT, name="notify") as c:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        advance_all(p)  # its events: seq 2 and 5 of 6
        relay(p, c)
        c.process_all()
    behind = compare_files(p_at, [c_at])
    assert [(d["flow_id"], d["kind"], d["producer"]["seq"]) for d in behind["consumers"][0]["differences"]] == [
        ("F", "behind", 5)]
    with Producer(p_at, AGENT) as p, Consumer(c_at, AGENT, name="notify") as c:
        relay(p, c)
        c.process_all()
    assert compare_files(p_at, [c_at])["differences"] == 0  # at seq 5 of 6: all it gets


def test_a_batch_routes_each_advance_and_delivers_to_every_event_consumers(at: Any) -> None:
    with Producer(at("p"), AGENT, topics=topics()) as p, Consumer(at("c"), AGENT, name="notify") as c:
        p.admin.register_consumer("notify", topics=["agent.notifications"], **WHO)
        p.admin.register_consumer("audit", **WHO)  # every event: its deliveries owed by the batch
        with p.batch() as b:
            for i, kind in enumerate(STEPS):
                b.advance(f"F{i + 1}", "F", expected_seq=i, kind=kind, payload={})
            b.advance("G1", "G", expected_seq=0, kind="notification.sent", payload={})
        assert {e.name: e.backlog for e in p.admin.consumers()} == {"audit": 7, "notify": 3}
        assert [r.event_id for r in relay_until_idle(p, c)] == ["F2", "F5", "G1"]
        assert c.process_all()["F"].applied == 2 and c.projection("G")["last_seq"] == 1

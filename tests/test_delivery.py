"""Delivery that runs by itself: several named consumers, leases, backoff with
full jitter, fairness, backlog caps and operator actions.

Everything runs on both engines (the ``engine`` fixture: SQLite files under
``tmp_path``, PostgreSQL schemas of the session's server).  An unreachable
consumer is a small ``Consumer`` subclass whose ``receive`` raises: that is
the transport failing, not the database.  Time is an injected clock, so no
test sleeps; a relay that dies mid-send is either a ``BaseException`` out of
``receive`` (no failure is recorded, the lease stays) or a real child process
that exits at a crash point.

The tests with real relay processes -- the relay child that dies mid-send at
a crash point (``children/lease_child.py``) and the six leased relay
processes -- give the children location strings; the lease columns the
public API does not show are read through ``engine_reads.rows`` on either
engine.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from children.racers import relay_with_lease
from engine_reads import execute, new_location, rows
from reliable_flow import Consumer, DeliveryPolicy, Producer, relay
from reliable_flow._tools.inspection import format_report, inspect_files
from reliable_flow.crash import CRASH_EXIT_CODE, ENV_VAR
from reliable_flow.errors import NotResolvable, UnknownEvent
from reliable_flow.records import DeliveryRecord
from reliable_flow.reservation import RESERVATION
from support import (
    CHILDREN,
    KINDS,
    Clock,
    Unreachable,
    child_env,
    commit,
    envelope,
    outbox_entry,
    relay_log,
    run_script,
    start_on_barrier,
)

NAMES = ("projection", "audit", "notifier")


# -- helpers ------------------------------------------------------------------------------


def delivery(producer: Producer, event_id: str, consumer: str) -> DeliveryRecord:
    return outbox_entry(producer, event_id).deliveries[consumer]


def raw_delivery(path: str | Path, event_id: str, consumer: str) -> dict[str, Any]:
    """Columns the public API has no accessor for (failures, lease_owner), on either engine."""
    found = rows(
        path,
        "SELECT d.state, d.attempts, d.failures, d.due_at, d.lease_owner, d.last_error, d.last_status "
        "FROM delivery d JOIN outbox o ON o.pos = d.pos WHERE o.event_id = ? AND d.consumer = ?",
        (event_id, consumer),
    )
    assert len(found) == 1, found
    keys = ("state", "attempts", "failures", "due_at", "lease_owner", "last_error", "last_status")
    return dict(zip(keys, found[0]))




@pytest.fixture
def three(new_store: Any, producer: Producer) -> Iterator[dict[str, Consumer]]:
    consumers = {name: Consumer(new_store(name), RESERVATION, name=name) for name in NAMES}
    for name in NAMES:  # several consumers: each one registered explicitly
        producer.admin.register_consumer(name, actor="test", reason="one of three consumers")
    yield consumers
    for c in consumers.values():
        c.close()


# -- several named consumers ----------------------------------------------------------------


def test_each_named_consumer_gets_every_event_and_keeps_its_own_state(
    producer: Producer, three: dict[str, Consumer]
) -> None:
    for c in three.values():  # bind all three before anything is committed
        assert relay(producer, c).status == "idle"
    for flow in ("A", "B", "C", "D"):
        commit(producer, flow)

    # Only the projection consumer has been relayed to so far.
    answers = relay_log(producer, three["projection"])
    assert sorted(answers) == sorted(f"{f}{n} accepted" for f in "ABCD" for n in (1, 2, 3))
    for flow in "ABCD":
        mine = producer.outbox(flow, consumer="projection")
        assert [(e.event_id, e.state, e.accepted) for e in mine] == [
            (f"{flow}{n}", "accepted", True) for n in (1, 2, 3)
        ]
        for other in ("audit", "notifier"):
            theirs = producer.outbox(flow, consumer=other)
            assert [(e.state, e.accepted) for e in theirs] == [("pending", False)] * 3
        together = producer.outbox(flow)
        assert [(e.state, e.accepted) for e in together] == [("pending", False)] * 3
        assert all(set(e.deliveries) == set(NAMES) for e in together)
        assert [e.deliveries["projection"].state for e in together] == ["accepted"] * 3
        assert [e.deliveries["audit"].state for e in together] == ["pending"] * 3

    for name in ("audit", "notifier"):
        assert len(relay_log(producer, three[name])) == 12
    for c in three.values():
        drained = c.process_all()
        assert {f: (d.applied, d.stop) for f, d in drained.items()} == {f: (3, "idle") for f in "ABCD"}
        for flow in "ABCD":
            assert c.projection(flow) == {"state": "released", "last_seq": 3, "held": 0}
            assert [e.event_id for e in c.applied(flow)] == [f"{flow}1", f"{flow}2", f"{flow}3"]
    assert all(e.accepted and e.state == "accepted" for e in producer.outbox())
    # Three separate files, each with its own copy.
    assert len({c.location for c in three.values()}) == 3


def test_a_conflict_for_one_consumer_is_pending_for_the_others(
    producer: Producer, three: dict[str, Consumer]
) -> None:
    three["audit"].receive(envelope("A1", "A", 1, amount=9))  # audit already holds another A1
    commit(producer, "A", 1)
    results = {name: relay(producer, c).status for name, c in three.items()}
    assert results == {"projection": "accepted", "audit": "id_conflict", "notifier": "accepted"}
    d = outbox_entry(producer, "A1").deliveries
    assert {n: d[n].state for n in NAMES} == {
        "projection": "accepted", "audit": "set_aside", "notifier": "accepted"
    }
    assert outbox_entry(producer, "A1", "projection").accepted is True
    assert outbox_entry(producer, "A1", "audit").state == "set_aside"
    together = outbox_entry(producer, "A1")
    assert (together.state, together.accepted) == ("set_aside", False)


# -- backoff with full jitter -----------------------------------------------------------------


def test_backoff_formula_is_full_jitter_capped() -> None:
    for r in (1.0, 0.5, 0.0):
        policy = DeliveryPolicy(backoff_base=0.5, backoff_cap=300.0, random=lambda r=r: r)
        for n in range(1, 80):
            assert policy.backoff(n) == r * min(300.0, 0.5 * 2 ** (n - 1)), n


@pytest.mark.parametrize(
    "kwargs",
    [{"lease_seconds": 0}, {"lease_seconds": -1}, {"lease_seconds": True}, {"lease_seconds": "5"},
     {"backoff_base": -0.1}, {"backoff_cap": -1}, {"backoff_base": True}, {"backoff_cap": "3"}],
)
def test_delivery_policy_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DeliveryPolicy(**kwargs)


@pytest.mark.parametrize("lease", [None, 10.0])
@pytest.mark.parametrize("jitter", [1.0, 0.5])
def test_failed_sends_back_off_exponentially_with_jitter_and_cap(
    new_store: Any, producer: Producer, lease: float | None, jitter: float
) -> None:
    clock = Clock(1000.0)
    policy = DeliveryPolicy(
        lease_seconds=lease, backoff_base=2.0, backoff_cap=20.0, clock=clock, random=lambda: jitter, owner="r1"
    )
    with Unreachable(new_store("c"), RESERVATION, name="projection") as c:
        commit(producer, "A", 1)
        waits = []
        for n in range(1, 7):
            with pytest.raises(ConnectionError, match=rf"unreachable \(call {n}\)"):
                relay(producer, c, policy=policy)
            d = delivery(producer, "A1", "projection")
            assert (d.state, d.attempts) == ("pending", n)
            assert d.last_error == f"ConnectionError: consumer unreachable (call {n})"
            assert d.due_at == clock.t + jitter * min(20.0, 2.0 * 2 ** (n - 1))
            raw = raw_delivery(producer.location, "A1", "projection")
            assert (raw["failures"], raw["lease_owner"]) == (n, None)
            waits.append(d.due_at - clock.t)
            # Not due yet: the relay has nothing to do and does not call the consumer.
            clock.t = d.due_at - 0.01
            calls = c.calls
            assert relay(producer, c, policy=policy).status == "idle"
            assert c.calls == calls
            clock.t = d.due_at  # due exactly now
        assert waits == [jitter * w for w in (2.0, 4.0, 8.0, 16.0, 20.0, 20.0)]

        c.down = False
        r = relay(producer, c, policy=policy)
        assert (r.status, r.event_id) == ("accepted", "A1")
        d = delivery(producer, "A1", "projection")
        assert (d.state, d.attempts, d.last_error, d.last_status) == ("accepted", 7, None, "accepted")
        raw = raw_delivery(producer.location, "A1", "projection")
        assert (raw["failures"], raw["lease_owner"]) == (0, None)  # success resets the failure count
        assert relay(producer, c, policy=policy).status == "idle"
        assert c.calls == 7
        assert [row.event_id for row in c.inbox("A")] == ["A1"]


def test_a_failed_send_records_the_failure_and_propagates_the_exception(
    new_store: Any, producer: Producer
) -> None:
    clock = Clock()
    policy = DeliveryPolicy(clock=clock, random=lambda: 1.0, backoff_base=1.0)
    with Unreachable(new_store("c"), RESERVATION, exc=lambda n: TimeoutError("no answer in 5 s")) as c:
        commit(producer, "A", 1)
        with pytest.raises(TimeoutError, match="no answer in 5 s"):
            relay(producer, c, policy=policy)
        assert c.inbox("A") == []  # nothing stored
        d = delivery(producer, "A1", "default")
        assert (d.state, d.attempts, d.last_error, d.due_at) == (
            "pending", 1, "TimeoutError: no answer in 5 s", 1001.0
        )
        # An explicit relay of the event also records and propagates.
        with pytest.raises(TimeoutError):
            relay(producer, c, "A1", policy=policy)
        assert delivery(producer, "A1", "default").attempts == 2


@pytest.mark.parametrize("kind", ["id_conflict", "sequence_conflict"])
def test_a_conflict_is_set_aside_and_never_retried_as_time_passes(
    producer: Producer, consumer: Consumer, kind: str
) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=10, clock=clock)
    planted = envelope("A1", "A", 1, amount=9) if kind == "id_conflict" else envelope("X1", "A", 1)
    assert consumer.receive(planted).status == "accepted"
    commit(producer, "A", 1)
    commit(producer, "B", 2)
    r = relay(producer, consumer, policy=policy)
    assert (r.status, r.event_id) == (kind, "A1")
    assert relay_log(producer, consumer, policy=policy) == ["B1 accepted", "B2 accepted"]
    for t in (1011.0, 1e5, 1e9):
        clock.t = t
        assert relay(producer, consumer, policy=policy).status == "idle"
    d = delivery(producer, "A1", "default")
    assert (d.state, d.last_status, d.attempts) == ("set_aside", kind, 1)
    assert outbox_entry(producer, "A1").accepted is False
    # The inbox still holds only what was planted.
    assert rows(consumer.location, "SELECT event_id, body FROM inbox WHERE flow_id = 'A'") == [
        (planted["event_id"], json.dumps(planted, sort_keys=True, separators=(",", ":")))
    ]


# -- leases -----------------------------------------------------------------------------------


def test_a_lease_keeps_other_relays_off_until_it_expires(new_store: Any, producer: Producer) -> None:
    """Relay a claims A1 and dies inside the send (a BaseException: nothing is
    recorded); relay b skips A1 while the lease runs, delivers the rest, and
    sends A1 again once the lease has expired."""
    clock = Clock(1000.0)
    path = new_store("c")
    with Unreachable(path, RESERVATION, exc=lambda n: KeyboardInterrupt()) as dying, \
            Consumer(path, RESERVATION) as healthy:
        commit(producer, "A", 1)
        commit(producer, "B", 1)
        with pytest.raises(KeyboardInterrupt):
            relay(producer, dying, policy=DeliveryPolicy(lease_seconds=10, clock=clock, owner="relay-a"))
        assert dying.sent == ["A1"]
        raw = raw_delivery(producer.location, "A1", "default")
        assert (raw["state"], raw["lease_owner"], raw["due_at"], raw["attempts"]) == ("pending", "relay-a", 1010.0, 0)

        other = DeliveryPolicy(lease_seconds=10, clock=clock, owner="relay-b")
        clock.t = 1005.0
        assert relay_log(producer, healthy, policy=other) == ["B1 accepted"]
        clock.t = 1009.99
        assert relay(producer, healthy, policy=other).status == "idle"
        clock.t = 1010.0
        assert relay_log(producer, healthy, policy=other) == ["A1 accepted"]
        assert [row.event_id for row in healthy.inbox("A")] == ["A1"]
        assert raw_delivery(producer.location, "A1", "default")["lease_owner"] is None


@pytest.mark.parametrize(
    ("point", "resent_as"),
    [("receive.after_inbox_insert", "accepted"), ("receive.after_commit", "duplicate"),
     ("relay.after_mark", "duplicate"), ("relay.after_commit", None)],
)
def test_a_relay_process_that_dies_mid_send_loses_its_lease_on_expiry(
    tmp_path: Path, engine: str, point: str, resent_as: str | None
) -> None:
    producer_path, consumer_path = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "projection")
    with Producer(producer_path, RESERVATION) as producer, \
            Consumer(consumer_path, RESERVATION, name="projection") as consumer:
        commit(producer, "A", 1)
        proc = run_script(CHILDREN / "lease_child.py", producer_path, consumer_path, "1000",
                          env=child_env(**{ENV_VAR: point}), cwd=tmp_path)
        assert proc.returncode == CRASH_EXIT_CODE, proc.stderr
        raw = raw_delivery(producer_path, "A1", "projection")
        if resent_as is None:  # the accepted mark was committed before the exit
            assert raw["state"] == "accepted"
        else:
            assert (raw["state"], raw["lease_owner"], raw["due_at"]) == ("pending", "child", 1010.0)

        clock = Clock(1000.0)
        policy = DeliveryPolicy(lease_seconds=10, clock=clock, owner="parent")
        clock.t = 1009.5
        assert relay(producer, consumer, policy=policy).status == "idle"  # still leased
        clock.t = 1010.0
        sent = relay_log(producer, consumer, policy=policy)
        assert sent == ([] if resent_as is None else [f"A1 {resent_as}"])
        assert [(r.event_id, r.state) for r in consumer.inbox("A")] == [("A1", "pending")]
        assert outbox_entry(producer, "A1", "projection").accepted is True
        assert (consumer.drain("A").applied, len(consumer.applied("A"))) == (1, 1)


def test_six_relay_processes_with_leases_send_each_event_once(tmp_path: Path, engine: str) -> None:
    producer_path, consumer_path = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    with Producer(producer_path, RESERVATION) as producer:
        for i in range(120):
            commit(producer, f"F{i:03d}", 1, sep="-")
    Consumer(consumer_path, RESERVATION).close()
    run = start_on_barrier(relay_with_lease, [(producer_path, consumer_path)] * 6, timeout=120, name="relay")
    reports = run.values()  # fails if a child raised or did not exit 0
    sends = Counter(event_id for got in reports for event_id, _ in got)
    statuses = Counter(status for got in reports for _, status in got)
    assert len(sends) == 120
    assert max(sends.values()) == 1, [e for e, n in sends.items() if n > 1]
    assert statuses == {"accepted": 120}
    assert sum(1 for got in reports if got) >= 2  # the work was really shared
    assert rows(consumer_path, "SELECT count(*) FROM inbox") == [(120,)]
    assert rows(producer_path, "SELECT count(*) FROM delivery WHERE state <> 'accepted'") == [(0,)]


def test_an_expired_lease_is_resent_even_while_new_events_keep_coming(
    new_store: Any, producer: Producer
) -> None:
    clock = Clock(1000.0)
    path = new_store("c")
    with Unreachable(path, RESERVATION, exc=lambda n: KeyboardInterrupt()) as dying, \
            Consumer(path, RESERVATION) as healthy:
        commit(producer, "A", 1)
        with pytest.raises(KeyboardInterrupt):
            relay(producer, dying, policy=DeliveryPolicy(lease_seconds=10, clock=clock, owner="dead"))
        policy = DeliveryPolicy(lease_seconds=10, clock=clock, owner="alive")
        for i in range(5):  # a backlog of five events that stays five
            commit(producer, f"L{i:03d}", 1, sep="-")
        resent_at = None
        for i in range(5, 200):
            clock.t += 1.0  # one new event per second, one send per second
            commit(producer, f"L{i:03d}", 1, sep="-")
            r = relay(producer, healthy, policy=policy)
            if r.event_id == "A1":
                resent_at = clock.t
                break
        # The lease expired at 1010: from then on A1 is due and older than
        # everything committed since, so new work cannot starve it.
        assert resent_at == 1010.0, resent_at


# -- fairness ---------------------------------------------------------------------------------


def test_a_flow_whose_sends_always_fail_does_not_hold_back_fifty_others(
    new_store: Any, producer: Producer
) -> None:
    clock = Clock(1000.0)
    policy = DeliveryPolicy(lease_seconds=5, backoff_base=1.0, backoff_cap=60.0, clock=clock, random=lambda: 1.0)
    healthy_flows = [f"H{i:02d}" for i in range(50)]
    with Unreachable(new_store("c"), RESERVATION, fail_flows={"STUCK"}) as c:
        commit(producer, "STUCK")  # committed first: the oldest events in the outbox
        for i in range(3):  # interleave the healthy flows' steps
            for flow in healthy_flows:
                r = producer.advance(f"{flow}-{i + 1}", flow, expected_seq=i, kind=KINDS[i], payload={"amount": 2})
                assert r.status == "committed"
        relays = failures = 0
        for _ in range(400):
            relays += 1
            try:
                r = relay(producer, c, policy=policy)
            except ConnectionError:
                failures += 1
                continue
            finally:
                clock.t += 0.5  # time passes between two sends
            if r.status == "idle":
                c.process_all()
                if all(c.projection(f) == {"state": "released", "last_seq": 3, "held": 0} for f in healthy_flows):
                    break
        else:
            pytest.fail("the healthy flows were not all applied within 400 relays")
        assert relays - failures <= 150 + 2 * 3 + 1, (relays, failures)  # about one send per healthy event
        for flow in healthy_flows:
            assert [e.seq for e in c.applied(flow)] == [1, 2, 3]
        assert c.projection("STUCK") is None and c.inbox("STUCK") == [] and c.applied("STUCK") == []
        stuck = producer.outbox("STUCK", consumer="default")
        assert [e.state for e in stuck] == ["pending"] * 3
        assert all(e.deliveries["default"].attempts >= 2 for e in stuck)  # retried, with backoff
        assert all(e.deliveries["default"].last_error.startswith("ConnectionError") for e in stuck)
        assert failures == c.sent.count("STUCK1") + c.sent.count("STUCK2") + c.sent.count("STUCK3")


def test_a_set_aside_conflict_does_not_hold_back_fifty_other_flows(producer: Producer, consumer: Consumer) -> None:
    consumer.receive(envelope("BAD1", "BAD", 1, amount=9))  # the consumer holds another BAD1
    commit(producer, "BAD")
    healthy_flows = [f"H{i:02d}" for i in range(50)]
    for i in range(3):
        for flow in healthy_flows:
            assert producer.advance(
                f"{flow}-{i + 1}", flow, expected_seq=i, kind=KINDS[i], payload={"amount": 2}
            ).status == "committed"
    answers: list[str] = []
    for _ in range(20):
        batch = relay_log(producer, consumer, policy=DeliveryPolicy(lease_seconds=5))
        answers += batch
        consumer.process_all()
        if not batch:
            break
    assert Counter(a.split()[1] for a in answers) == {"accepted": 152, "id_conflict": 1}
    assert answers.count("BAD1 id_conflict") == 1  # never sent again
    for flow in healthy_flows:
        assert consumer.projection(flow) == {"state": "released", "last_seq": 3, "held": 0}
    assert outbox_entry(producer, "BAD1").state == "set_aside"
    assert [e.state for e in producer.outbox("BAD")] == ["set_aside", "accepted", "accepted"]


# -- backlog caps -----------------------------------------------------------------------------


def test_max_backlog_refuses_without_storing_then_commits_after_relaying(new_store: Any) -> None:
    with Producer(new_store("p"), RESERVATION, max_backlog=3) as producer, \
            Consumer(new_store("c"), RESERVATION) as consumer:
        for flow in "ABC":
            commit(producer, flow, 1)
        r = producer.advance("D1", "D", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert (r.status, r.seq) == ("backlog_full", None)
        assert "max_backlog" in r.reason
        assert producer.flow("D") is None
        assert [e.event_id for e in producer.outbox()] == ["A1", "B1", "C1"]
        # Answers that store nothing still come first.
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "existing"
        assert producer.advance("A9", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "stale"

        assert relay(producer, consumer).status == "accepted"  # binds: 2 deliveries still pending
        assert producer.advance("D1", "D", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert producer.advance("E1", "E", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "backlog_full"
        assert len(relay_log(producer, consumer)) == 3
        assert producer.advance("E1", "E", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert relay_log(producer, consumer) == ["E1 accepted"]


def test_max_backlog_counts_pending_deliveries_over_all_consumers(new_store: Any) -> None:
    with Producer(new_store("p"), RESERVATION, max_backlog=4) as producer, \
            Consumer(new_store("a"), RESERVATION, name="a") as a, \
            Consumer(new_store("b"), RESERVATION, name="b") as b:
        assert relay(producer, a).status == relay(producer, b, register=True).status == "idle"
        commit(producer, "A", 1)
        commit(producer, "B", 1)  # 2 events x 2 consumers = 4 pending
        assert producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "backlog_full"
        assert relay(producer, a).status == "accepted"
        assert producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_caps_must_be_positive_ints(new_store: Any, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_backlog"):
        Producer(new_store("p"), RESERVATION, max_backlog=bad)
    with pytest.raises(ValueError, match="max_inbox"):
        Consumer(new_store("c"), RESERVATION, max_inbox=bad)


def test_max_inbox_refuses_without_storing_and_the_relay_retries_later(
    producer: Producer, new_store: Any
) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=10, backoff_base=1.0, clock=clock, random=lambda: 1.0)
    with Consumer(new_store("c"), RESERVATION, name="projection", max_inbox=2) as c:
        commit(producer, "A")
        commit(producer, "B", 1)
        assert relay(producer, c, policy=policy).event_id == "A1"
        assert relay(producer, c, policy=policy).event_id == "A2"
        # A3: two unapplied rows, and A3 is not A's next step: refused, stored nothing.
        refused = relay(producer, c, policy=policy)
        assert (refused.status, refused.event_id, refused.flow_id, refused.seq, refused.applied) == (
            "refused", "A3", "A", 3, False)
        assert (refused.reason or "").startswith("inbox full (max_inbox 2): ")
        assert [r.event_id for r in c.inbox("A")] == ["A1", "A2"]
        d = delivery(producer, "A3", "projection")
        assert (d.state, d.attempts, d.due_at) == ("pending", 1, 1001.0)
        assert d.last_error.startswith("InboxFull: ")
        # B1 is B's very next step: let in although the inbox is full.
        r = relay(producer, c, policy=policy)
        assert (r.status, r.event_id) == ("accepted", "B1")
        assert rows(c.location, "SELECT count(*) FROM inbox WHERE state <> 'applied'") == [(3,)]
        assert relay(producer, c, policy=policy).status == "idle"  # A3 waits for its backoff
        assert {f: d.applied for f, d in c.process_all().items()} == {"A": 2, "B": 1}
        clock.t = 1001.0
        assert relay_log(producer, c, policy=policy) == ["A3 accepted"]
        assert c.drain("A").applied == 1
        assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}


def test_a_full_inbox_of_later_steps_still_lets_the_missing_step_in(producer: Producer, new_store: Any) -> None:
    with Consumer(new_store("c"), RESERVATION, max_inbox=2) as c:
        commit(producer, "A")
        assert relay(producer, c, "A3").status == "accepted"
        assert relay(producer, c, "A2").status == "accepted"
        assert c.apply_next("A").status == "gap"
        full = c.receive(envelope("Z2", "Z", 2))  # another flow's later step is refused ...
        assert (full.status, full.event_id, full.applied) == ("refused", "Z2", False)
        assert c.inbox("Z") == []
        assert relay(producer, c).event_id == "A1"  # ... but A's missing step gets in: no deadlock
        assert c.drain("A").applied == 3
        # Duplicates and conflicts are answered as usual when full.
        assert c.receive(envelope("A1", "A", 1)).status == "duplicate"


def test_with_both_caps_nothing_is_dropped(new_store: Any) -> None:
    clock = Clock()
    policy = DeliveryPolicy(lease_seconds=10, backoff_base=0.5, backoff_cap=4.0, clock=clock, random=lambda: 1.0)
    flows = [f"F{i:02d}" for i in range(20)]
    with Producer(new_store("p"), RESERVATION, max_backlog=6) as producer, \
            Consumer(new_store("c"), RESERVATION, max_inbox=4) as c:
        todo = [(flow, n) for flow in flows for n in range(3)]  # each flow's steps back to back
        backlog_full = inbox_full = 0
        for step in range(3000):
            for _ in range(2):  # the producer is faster than the relay
                if todo:
                    flow, n = todo[0]
                    r = producer.advance(
                        f"{flow}-{n + 1}", flow, expected_seq=n, kind=KINDS[n], payload={"amount": 5}
                    )
                    if r.status == "committed":
                        todo.pop(0)
                    else:
                        assert r.status == "backlog_full", r
                        backlog_full += 1
            if relay(producer, c, policy=policy).status == "refused":
                inbox_full += 1
            if step % 4 == 3:
                c.process_all(limit=1)
            clock.t += 0.25
            if not todo and all(c.projection(f) == {"state": "released", "last_seq": 3, "held": 0} for f in flows):
                break
        else:
            pytest.fail("the capped pipeline never finished")
        assert (backlog_full > 0, inbox_full > 0) == (True, True), (backlog_full, inbox_full)  # both caps engaged
        assert all(e.accepted for e in producer.outbox()) and len(producer.outbox()) == 60
        assert rows(c.location, "SELECT count(*), count(DISTINCT event_id) FROM effect") == [(60, 60)]
        assert rows(c.location, "SELECT count(*) FROM inbox WHERE state = 'applied'") == [(60,)]


# -- operator actions -------------------------------------------------------------------------


@pytest.fixture
def set_aside(producer: Producer, three: dict[str, Consumer]) -> dict[str, Consumer]:
    """A1 is set aside for 'projection' (its inbox holds a wrong A1), accepted by the others."""
    assert three["projection"].receive(envelope("A1", "A", 1, amount=9)).status == "accepted"
    commit(producer, "A")
    for c in three.values():
        relay_log(producer, c)
    assert delivery(producer, "A1", "projection").state == "set_aside"
    return three


def test_redeliver_after_the_consumer_data_was_fixed(producer: Producer, set_aside: dict[str, Consumer]) -> None:
    projection = set_aside["projection"]
    # The operator repairs the consumer's data: the wrong, never-applied A1 goes.
    execute(projection.location, "DELETE FROM inbox WHERE event_id = 'A1' AND state = 'pending'")
    before = time.time()
    action = producer.admin.redeliver("A1", consumer="projection", actor="alice", reason="removed the stray A1 (TICKET-7)")
    after = time.time()
    assert action.previous_state == "set_aside"
    assert (action.action, action.actor, action.reason, action.consumer, action.event_id) == (
        "redeliver", "alice", "removed the stray A1 (TICKET-7)", "projection", "A1"
    )
    recorded = producer.admin.operator_actions("A1")
    assert len(recorded) == 1
    assert recorded[0] == dataclasses.replace(action, previous_state=None)
    assert before <= recorded[0].at <= after
    assert delivery(producer, "A1", "projection").state == "pending"

    assert relay_log(producer, projection) == ["A1 accepted"]
    assert outbox_entry(producer, "A1").accepted is True
    assert projection.drain("A").applied == 3
    assert projection.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
    assert producer.admin.operator_actions() == recorded  # the relay itself records nothing


def test_redeliver_without_a_fix_is_set_aside_again(producer: Producer, set_aside: dict[str, Consumer]) -> None:
    producer.admin.redeliver("A1", consumer="projection", actor="bob", reason="try again")
    assert relay_log(producer, set_aside["projection"]) == ["A1 id_conflict"]
    d = delivery(producer, "A1", "projection")
    assert (d.state, d.attempts) == ("set_aside", 2)
    assert relay(producer, set_aside["projection"]).status == "idle"


def test_redeliver_puts_a_backing_off_event_back_in_line_now(new_store: Any, producer: Producer) -> None:
    clock = Clock()
    policy = DeliveryPolicy(clock=clock, random=lambda: 1.0, backoff_base=100.0)
    with Unreachable(new_store("c"), RESERVATION) as c:
        commit(producer, "A", 1)
        with pytest.raises(ConnectionError):
            relay(producer, c, policy=policy)
        assert relay(producer, c, policy=policy).status == "idle"
        action = producer.admin.redeliver("A1", consumer="default", actor="ops", reason="link repaired")
        assert action.previous_state == "pending"
        c.down = False
        assert relay(producer, c, policy=policy).event_id == "A1"  # no waiting out the backoff


def test_skip_is_for_one_consumer_only_and_recorded(producer: Producer, set_aside: dict[str, Consumer]) -> None:
    action = producer.admin.skip("A1", consumer="projection", actor="carol", reason="business agreed to drop it")
    assert (action.action, action.previous_state) == ("skip", "set_aside")
    assert delivery(producer, "A1", "projection").state == "skipped"
    assert outbox_entry(producer, "A1", "projection").state == "skipped"
    assert outbox_entry(producer, "A1", "audit").state == "accepted"
    assert outbox_entry(producer, "A1", "notifier").state == "accepted"
    assert relay(producer, set_aside["projection"]).status == "idle"
    [recorded] = producer.admin.operator_actions("A1")
    assert (recorded.action, recorded.actor, recorded.reason, recorded.consumer) == (
        "skip", "carol", "business agreed to drop it", "projection"
    )
    with pytest.raises(NotResolvable):
        producer.admin.skip("A1", consumer="projection", actor="carol", reason="twice")
    assert len(producer.admin.operator_actions()) == 1


def test_operator_actions_refuse_accepted_and_unknown_events(
    producer: Producer, set_aside: dict[str, Consumer]
) -> None:
    for action in (producer.admin.redeliver, producer.admin.skip):
        with pytest.raises(NotResolvable):
            action("A1", consumer="audit", actor="dave", reason="r")  # accepted by audit
        with pytest.raises(NotResolvable):
            action("A2", consumer="projection", actor="dave", reason="r")  # accepted by projection
        with pytest.raises(UnknownEvent):
            action("Q1", consumer="projection", actor="dave", reason="r")
        with pytest.raises(UnknownEvent):
            action("A1", consumer="nobody", actor="dave", reason="r")
        for bad in ({"actor": ""}, {"actor": "   "}, {"reason": ""}, {"reason": None}, {"actor": 7}):
            kwargs: dict[str, Any] = {"consumer": "projection", "actor": "dave", "reason": "r", **bad}
            with pytest.raises(ValueError):
                action("A1", **kwargs)
    assert producer.admin.operator_actions() == []
    assert delivery(producer, "A1", "projection").state == "set_aside"


def test_inspection_shows_set_aside_events(producer: Producer, set_aside: dict[str, Consumer]) -> None:
    report = inspect_files(producer.location, set_aside["projection"].location)
    consumers = report["producer"]["consumers"]
    assert consumers["projection"]["set_aside"] == [
        {"event_id": "A1", "flow_id": "A", "seq": 1, "last_status": "id_conflict", "attempts": 1}
    ]
    assert consumers["projection"]["accepted"] == 2 and consumers["projection"]["pending"] == []
    assert (consumers["audit"]["accepted"], consumers["audit"]["pending"], consumers["audit"]["set_aside"]) == (
        3, [], []
    )
    text = format_report(report)
    assert "set aside" in text and "A1" in text and "id_conflict" in text


def test_inspection_does_not_report_a_skipped_event_as_undelivered(
    producer: Producer, set_aside: dict[str, Consumer]
) -> None:
    producer.admin.skip("A1", consumer="projection", actor="carol", reason="dropped")
    report = inspect_files(producer.location, set_aside["projection"].location)
    mine = report["producer"]["consumers"]["projection"]
    assert (mine["pending"], mine["set_aside"]) == ([], [])
    assert [e["event_id"] for e in mine.get("skipped", [])] == ["A1"]
    text = format_report(report)
    assert "0 undelivered" in text and "1 skipped" in text

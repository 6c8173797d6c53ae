"""The metrics reads of the store contract, for every engine:
``OutboxReads.outbox_counts`` and ``InboxReads.inbox_counts``.

Each test states one promise of the method's docstring (and of the row
types in :mod:`reliable_flow._store.records`) and checks it only through the
store interface.
"""

from __future__ import annotations

from contract_support import add_consumer, append, env

from reliable_flow._envelope import Envelope
from reliable_flow._store.records import DeliveryCounts, InboxCounts, OutboxCounts
from reliable_flow.delivery import Retry
from reliable_flow.statuses import BlockReason, DeliveryState


def groups(counts: OutboxCounts) -> dict[tuple[str, str], DeliveryCounts]:
    return {(g.consumer, g.state): g for g in counts.deliveries}


# -- outbox_counts ------------------------------------------------------------------------


def test_an_empty_outbox_counts_nothing(outbox):
    assert outbox.latest.outbox_counts(0.0) == OutboxCounts(0, 0, (), ())


def test_events_before_any_consumer_have_no_delivery_groups(outbox):
    append(outbox, env("E1"), env("E2", seq=2))
    with outbox.write() as unit:
        unit.put_flow("F", 2, "created", "{}")
    counts = outbox.latest.outbox_counts(0.0)
    assert (counts.events, counts.flows, counts.consumers, counts.deliveries) == (2, 1, (), ())


def test_deliveries_are_counted_per_consumer_and_state(outbox):
    p1, p2, p3, p4, p5 = append(outbox, *(env(f"E{i}", seq=i) for i in range(1, 6)))
    with outbox.write() as unit:
        add_consumer(unit, "c1", "uid-1")
        add_consumer(unit, "c2", "uid-2")
        unit.mark("c1", [(p1, "accepted")], [(p4, "id_conflict")], 10.0)  # accepted; set aside
        unit.set_retry("c1", p2, Retry(1, 50.0, "down"), 20.0)           # failing, tried once
        unit.set_retry("c1", p2, Retry(2, 60.0, "down"), 30.0)           # ... and again: one retry
        unit.claim("c1", [p3], 100.0, "relay-1", 40.0)                    # leased until 100
        unit.resolve("c1", p5, DeliveryState.SKIPPED, 50.0)
    counts = outbox.latest.outbox_counts(45.0)
    assert counts.events == 5 and counts.consumers == ("c1", "c2")
    found = groups(counts)
    assert sorted(found) == [("c1", "accepted"), ("c1", "pending"), ("c1", "set_aside"), ("c1", "skipped"),
                             ("c2", "pending")]
    # c1 pending: p2 (failing, 2 attempts) and p3 (leased, never sent);
    # oldest_touch: the earliest last write among them (p2's at 30).
    assert found[("c1", "pending")] == DeliveryCounts("c1", "pending", 2, 1, 1, 1, 1, 30.0)
    assert found[("c1", "accepted")].count == 1 and found[("c1", "accepted")].retries == 0
    assert found[("c1", "set_aside")].count == 1
    assert found[("c1", "skipped")].count == 1
    # c2: everything pending, never sent, never written.
    assert found[("c2", "pending")] == DeliveryCounts("c2", "pending", 5, 0, 0, 0, 5, None)


def test_a_lease_counts_only_until_it_ends(outbox):
    [pos] = append(outbox, env("E1"))
    with outbox.write() as unit:
        add_consumer(unit, "c1", "uid-1")
        unit.claim("c1", [pos], 100.0, "relay-1", 40.0)
    assert groups(outbox.latest.outbox_counts(99.0))[("c1", "pending")].leased == 1
    assert groups(outbox.latest.outbox_counts(100.0))[("c1", "pending")].leased == 0


def test_a_delivered_event_is_no_longer_failing_or_leased(outbox):
    [pos] = append(outbox, env("E1"))
    with outbox.write() as unit:
        add_consumer(unit, "c1", "uid-1")
        unit.set_retry("c1", pos, Retry(1, 5.0, "down"), 1.0)
        unit.claim("c1", [pos], 100.0, "relay-1", 6.0)
        unit.mark("c1", [(pos, "accepted")], [], 7.0)
    [group] = outbox.latest.outbox_counts(8.0).deliveries
    assert (group.state, group.count, group.retries, group.failing, group.leased, group.untried) == (
        "accepted", 1, 1, 0, 0, 0)


def test_counts_in_a_snapshot_see_one_commit(outbox_store):
    store = outbox_store()
    other = outbox_store(same_as=store)
    append(store, env("E1"))
    with store.read() as reads:
        assert reads.outbox_counts(0.0).events == 1
        append(other, env("E2", seq=2))
        assert reads.outbox_counts(0.0).events == 1
    assert store.latest.outbox_counts(0.0).events == 2


# -- inbox_counts -------------------------------------------------------------------------


def insert(store, *envs: Envelope) -> None:
    with store.write() as unit:
        for e in envs:
            unit.insert(e)


def apply(store, e: Envelope) -> None:
    with store.write() as unit:
        unit.put_projection(e.flow_id, e.kind, e.seq, "{}", "{}")
        unit.record_applied(e.event_id, e.flow_id, e.seq, e.kind)


def test_an_empty_inbox_counts_nothing(inbox):
    assert inbox.latest.inbox_counts() == InboxCounts({}, {}, 0)


def test_rows_are_counted_per_state_and_blocked_ones_per_reason(inbox):
    a1, a2, a3, b1 = env("A1", "A", 1), env("A2", "A", 2), env("A3", "A", 3), env("B1", "B", 1)
    insert(inbox, a1, a2, a3, b1)
    apply(inbox, a1)
    with inbox.write() as unit:
        unit.block("A2", BlockReason.UNSUPPORTED_SCHEMA)
        unit.block("B1", BlockReason.INVALID_TRANSITION)
    counts = inbox.latest.inbox_counts()
    assert counts.by_state == {"applied": 1, "blocked": 2, "pending": 1}
    assert counts.blocked == {"invalid_transition": 1, "unsupported_schema": 1}
    assert counts.gaps == 0  # A waits at a block, B at a block: no missing seq


def test_a_flow_is_at_a_gap_when_its_first_waiting_row_is_past_the_next_seq(inbox):
    g2 = env("G2", "G", 2)                                   # nothing applied, seq 1 missing: gap
    h1, h3 = env("H1", "H", 1), env("H3", "H", 3)            # 1 applied, seq 2 missing: gap
    k1 = env("K1", "K", 1)                                   # next step there: no gap
    m1 = env("M1", "M", 1)                                   # all applied: no gap
    insert(inbox, g2, h1, h3, k1, m1)
    apply(inbox, h1)
    apply(inbox, m1)
    assert inbox.latest.inbox_counts().gaps == 2
    insert(inbox, env("G1", "G", 1), env("H2", "H", 2))
    assert inbox.latest.inbox_counts().gaps == 0


def test_inbox_counts_in_a_snapshot_see_one_commit(inbox_store):
    store = inbox_store()
    other = inbox_store(same_as=store)
    insert(store, env("A1", "A", 1))
    with store.read() as reads:
        assert reads.inbox_counts().by_state == {"pending": 1}
        insert(other, env("A2", "A", 2))
        assert reads.inbox_counts().by_state == {"pending": 1}
    assert store.latest.inbox_counts().by_state == {"pending": 2}

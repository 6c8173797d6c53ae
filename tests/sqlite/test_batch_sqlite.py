"""The batch APIs on SQLite only: what the tests see through the store's own
``sqlite3`` connection -- statements traced with ``set_trace_callback`` (one
transaction per batch), SQL failures injected with TEMP triggers (RAISE(ABORT)
and RAISE(ROLLBACK)), and ``setlimit`` (the old SQLite variable limit).

Moved from tests/test_batch.py, whose helpers they share; the behaviour
itself runs on both engines there.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from contextlib import ExitStack
from typing import Any

import pytest

from children.batch_child import TICKER
from reliable_flow import Consumer, Producer, ReliableFlowError, relay_batch, snapshot
from reliable_flow.reservation import RESERVATION
from support import KINDS, advance_step, envelope, outbox_entry
from test_batch import (
    commit_steps,
    count,
    flow_invariant,
    pair,
    tick,
    traced,
    transactions,
)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_sql_failure_on_the_kth_outbox_insert_rolls_back_the_whole_batch(new_store: Any, k: int) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        commit_steps(producer, ("A1", "A", 1))
        before = snapshot(producer.location, consumer.location)
        conn = producer._store._db.conn
        conn.execute("CREATE TEMP TABLE outbox_inserts(n INTEGER NOT NULL)")
        conn.execute("INSERT INTO outbox_inserts VALUES (0)")
        conn.execute("CREATE TEMP TRIGGER count_inserts AFTER INSERT ON main.outbox "
                     "BEGIN UPDATE outbox_inserts SET n = n + 1; END")
        conn.execute(f"CREATE TEMP TRIGGER fail_kth BEFORE INSERT ON main.outbox "
                     f"WHEN (SELECT n FROM outbox_inserts) = {k - 1} "
                     f"BEGIN SELECT RAISE(ABORT, 'injected outbox failure'); END")
        batch = [("A2", "A", 2), ("B1", "B", 1), ("A3", "A", 3), ("C1", "C", 1)]
        reached = []
        with pytest.raises(sqlite3.IntegrityError, match="injected outbox failure"), producer.batch() as b:
            for event in batch:
                reached.append(advance_step(b, *event).status)
        assert reached == ["committed"] * (k - 1)
        assert conn.in_transaction is False
        assert snapshot(producer.location, consumer.location) == before
        conn.execute("DROP TRIGGER temp.fail_kth")
        with producer.batch() as b:
            for event in batch:
                advance_step(b, *event)
        assert [str(r.status) for r in b.results] == ["committed"] * 4
        flow_invariant(producer)


def test_a_batch_whose_transaction_sqlite_rolled_back_refuses_to_go_on_or_commit(producer: Producer) -> None:
    """RAISE(ROLLBACK) ends the whole transaction under the batch: later advances
    must not run in autocommit, and the block must not report success."""
    conn = producer._store._db.conn
    conn.execute(
        "CREATE TEMP TRIGGER kill_tx BEFORE INSERT ON main.outbox WHEN NEW.event_id = 'B1' "
        "BEGIN SELECT RAISE(ROLLBACK, 'injected rollback'); END")
    with pytest.raises((RuntimeError, ReliableFlowError)), producer.batch() as b:
        assert advance_step(b, "A1", "A", 1).status == "committed"
        with pytest.raises(sqlite3.IntegrityError, match="injected rollback"):
            advance_step(b, "B1", "B", 1)
        with pytest.raises((RuntimeError, ReliableFlowError)):
            advance_step(b, "C1", "C", 1)
    assert conn.in_transaction is False
    conn.execute("DROP TRIGGER temp.kill_tx")
    assert producer.flows() == [] and producer.outbox() == []


def test_a_batch_is_one_transaction(producer: Producer) -> None:
    with traced(producer._store._db.conn) as seen, producer.batch() as b:
        for n, f in enumerate("ABCDE"):
            advance_step(b, f"{f}1", f, 1, amount=n + 1)
        advance_step(b, "A1", "A", 1, amount=1)                    # existing: no write
    [tx] = transactions(seen)
    assert tx[-1] == "COMMIT"
    assert count(tx, "INSERT INTO outbox") == 5
    assert count(seen, "BEGIN") == 1
    assert [str(r.status) for r in b.results] == ["committed"] * 5 + ["existing"]


def test_relay_batch_is_one_transaction_on_each_side(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        assert relay_batch(producer, consumer).idle  # binds the consumer
        commit_steps(producer, *[(f"{f}1", f, 1) for f in "ABCDEF"])
        with traced(producer._store._db.conn) as p_sql, traced(consumer._store._db.conn) as c_sql:
            r = relay_batch(producer, consumer, limit=100)
        assert r.counts == {"accepted": 6}
        [c_tx] = transactions(c_sql)
        [p_tx] = transactions(p_sql)
        assert c_tx[-1] == p_tx[-1] == "COMMIT"
        # Every event is stored inside that one transaction (by set-based
        # statements: the trace shows each statement once, its values inline).
        inserts = [s for s in c_tx if s.strip().upper().startswith("INSERT INTO INBOX")]
        assert inserts and all(any(f"'{f}1'" in s for s in inserts) for f in "ABCDEF"), inserts
        assert [[e.event_id for e in consumer.inbox(f)] for f in "ABCDEF"] == [[f"{f}1"] for f in "ABCDEF"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Connection.setlimit needs Python 3.11")
def test_relay_batch_with_a_large_limit_does_not_depend_on_the_sql_variable_limit(new_store: Any) -> None:
    """Regression: one bound variable per picked event broke any limit >= 1000 on
    SQLite 3.24-3.31 builds (SQLITE_MAX_VARIABLE_NUMBER defaulted to 999)."""
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        # Emulate the compile-time default of SQLite 3.24-3.31 on this connection.
        producer._store._db.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
        with producer.batch() as b:
            for i in range(1000):
                advance_step(b, f"E{i}", f"F{i:04d}", 1)
        r = relay_batch(producer, consumer, limit=1000)
        assert r.counts == {"accepted": 1000}


def test_relay_batch_sql_failure_while_marking_leaves_events_unmarked_then_duplicate(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        commit_steps(producer, ("A1", "A", 1), ("B1", "B", 1), ("A2", "A", 2))
        assert relay_batch(producer, consumer).counts == {"accepted": 3}  # binds the consumer
        commit_steps(producer, ("C1", "C", 1), ("D1", "D", 1))
        producer._store._db.conn.execute(
            "CREATE TEMP TRIGGER fail_mark BEFORE UPDATE ON main.delivery WHEN NEW.state = 'accepted' "
            "BEGIN SELECT RAISE(ABORT, 'injected mark failure'); END")
        with pytest.raises(sqlite3.IntegrityError, match="injected mark failure"):
            relay_batch(producer, consumer, limit=100)
        assert producer._store._db.conn.in_transaction is False
        assert [outbox_entry(producer, e, "default").state for e in ("C1", "D1")] == ["pending", "pending"]
        assert [len(consumer.inbox(f)) for f in "CD"] == [1, 1]  # the consumer owns them
        producer._store._db.conn.execute("DROP TRIGGER temp.fail_mark")
        r = relay_batch(producer, consumer, limit=100)
        assert [(x.event_id, str(x.status)) for x in r.results] == [("C1", "duplicate"), ("D1", "duplicate")]
        assert all(e.accepted for e in producer.outbox())


def test_process_all_with_batch_size_over_250_flows_applies_everything_in_full_batches(new_store: Any) -> None:
    envelopes = []
    sizes = {}
    for i in range(250):
        flow_id = f"F{i:03d}"
        sizes[flow_id] = 1 + i % 3
        envelopes += [envelope(f"{flow_id}-{n}", flow_id, n, amount=i + 1) for n in range(1, sizes[flow_id] + 1)]
    total = sum(sizes.values())
    with Consumer(new_store("c"), RESERVATION) as consumer:
        assert len(consumer.receive_many(envelopes)) == total
        with traced(consumer._store._db.conn) as seen:
            results = consumer.process_all(limit=1000, batch_size=100)
        assert list(results) == sorted(sizes)
        for flow_id, result in results.items():
            assert (result.flow_id, result.applied, str(result.stop)) == (flow_id, sizes[flow_id], "idle")
            i = int(flow_id[1:])
            held = 0 if sizes[flow_id] == 3 else i + 1
            assert consumer.projection(flow_id) == {
                "state": KINDS[sizes[flow_id] - 1], "last_seq": sizes[flow_id], "held": held}
            assert [e.seq for e in consumer.applied(flow_id)] == list(range(1, sizes[flow_id] + 1))
        per_tx = [count(tx, "INSERT INTO effect") for tx in transactions(seen)]
        applying = [n for n in per_tx if n]
        assert max(applying) <= 100
        assert len(applying) == math.ceil(total / 100), per_tx
        assert consumer.process_all(batch_size=100) == {}


def test_drain_commits_batch_size_applies_per_transaction(new_store: Any) -> None:
    with Consumer(new_store("c"), TICKER) as consumer:
        consumer.receive_many([tick("T", n) for n in range(1, 13)])
        with traced(consumer._store._db.conn) as seen:
            assert consumer.drain("T", limit=100, batch_size=5).applied == 12
        per_tx = [count(tx, "INSERT INTO effect") for tx in transactions(seen)]
        assert [n for n in per_tx if n] == [5, 5, 2]

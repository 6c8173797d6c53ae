"""Round trips of the producer's calls on PostgreSQL, counted, not timed.

libpq's protocol trace (``pgconn.trace``) logs every message the client sends
(``F``) and receives (``B``).  A round trip is the client sending and then
waiting for the server: each run of ``F`` lines followed by a ``B`` line.
The method is checked on ``SELECT 1`` (one round trip) before it counts an
``advance``.

An ``advance`` that commits is two: BEGIN + the event id's advisory lock +
the event / tombstone read + the flow's advisory lock + its row read ``FOR
UPDATE``; the flow and outbox writes + the registry lock + COMMIT (psycopg's
pipeline mode).  It was ten, one per statement, then three.  The locks stay
statements of their own, so each read's snapshot is taken after its lock was
granted (``tests/test_races.py`` and ``tests/test_kill.py`` prove the races
and the crashes on this engine).

The consumer's units are pipelined too (issue 23; before, in round trips):
``receive`` of a new event 2 (3): BEGIN + the INSERT, COMMIT; receive and
apply 3: that, the flow's lock + its projection read, the writes + COMMIT;
``apply_next`` 2 (8): BEGIN + the flow's lock + one statement reading its
projection (locked) and next row, the writes + COMMIT; ``receive_many`` of
independent events 2 whatever their number (one per event before).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from pg_cluster import import_psycopg, pg_location

psycopg = import_psycopg()

from reliable_flow import Consumer, Producer
from reliable_flow._store.postgres.location import lock_key
from reliable_flow.errors import CommitOutcomeUnknown, DatabaseBusy
from reliable_flow.reservation import RESERVATION
from support import envelope

pytestmark = pytest.mark.postgres

T = TypeVar("T")


def traced(conn: Any, call: Callable[[], T]) -> tuple[T, list[str]]:
    """``call()``'s result and the protocol messages it exchanged on ``conn``."""
    fd, path = tempfile.mkstemp(prefix="rf-trace-")
    try:
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            result = call()
        finally:
            conn.pgconn.untrace()
        with open(path, encoding="utf-8", errors="replace") as log:
            return result, log.read().splitlines()
    finally:
        os.close(fd)
        os.unlink(path)


def round_trips(lines: list[str]) -> int:
    """How many times the client waited for the server: ``F`` lines followed by a ``B`` line."""
    count, last = 0, ""
    for line in lines:
        direction = line.split("\t", 1)[0]
        if direction == "B" and last == "F":
            count += 1
        if direction in ("F", "B"):
            last = direction
    return count


def statements(lines: list[str]) -> int:
    """Statements sent: one ``Execute`` (extended protocol) or ``Query`` (simple) each."""
    return sum(1 for line in lines if line.split("\t")[2:3] in (["Execute"], ["Query"]))


def connection_of(side: Producer | Consumer) -> Any:
    return side.store._db.conn  # type: ignore[attr-defined]


def advance(producer: Producer, event_id: str, flow_id: str) -> Any:
    return producer.advance(event_id, flow_id, expected_seq=0, kind="reserved", payload={"amount": 3})


def test_the_counting_method_sees_one_round_trip_for_select_1(pg_cluster: Any) -> None:
    with Producer(pg_location("rt_select"), RESERVATION) as producer:
        conn = connection_of(producer)
        row, lines = traced(conn, lambda: conn.execute("SELECT 1").fetchone())
    assert row == (1,)
    assert (round_trips(lines), statements(lines)) == (1, 1), lines


def test_an_advance_that_commits_takes_at_most_two_round_trips(pg_cluster: Any) -> None:
    with Producer(pg_location("rt_commit"), RESERVATION) as producer:
        conn = connection_of(producer)
        # Past psycopg's prepare threshold too: prepared statements must not add any.
        for n in range(8):
            result, lines = traced(conn, lambda n=n: advance(producer, f"A{n}", f"F{n}"))  # type: ignore[misc]
            assert result.status == "committed"
            assert round_trips(lines) <= 2, (n, round_trips(lines), lines)
        assert statements(lines) <= 9, lines
        # The next step of a flow that has a row (an UPDATE of it) is no different.
        result, lines = traced(conn, lambda: producer.advance(
            "A0-2", "F0", expected_seq=1, kind="confirmed", payload={"amount": 3}))
        assert result.status == "committed"
        assert round_trips(lines) <= 2, lines
        assert producer.flow("F0") == {"state": "confirmed", "seq": 2, "amount": 3}
        assert [e.event_id for e in producer.outbox("F0")] == ["A0", "A0-2"]


def test_a_repeated_or_stale_advance_takes_at_most_two_round_trips(pg_cluster: Any) -> None:
    with Producer(pg_location("rt_again"), RESERVATION) as producer:
        conn = connection_of(producer)
        assert advance(producer, "A1", "F").status == "committed"
        again, lines = traced(conn, lambda: advance(producer, "A1", "F"))
        assert again.status == "existing"
        assert round_trips(lines) <= 2, lines  # the event read answers it; nothing to write
        stale, lines = traced(conn, lambda: advance(producer, "B1", "F"))
        assert stale.status == "stale"
        assert round_trips(lines) <= 2, lines
        differs, lines = traced(conn, lambda: producer.advance(
            "A1", "F", expected_seq=0, kind="reserved", payload={"amount": 4}))
        assert differs.status == "conflict"
        assert round_trips(lines) <= 2, lines
        assert [e.event_id for e in producer.outbox()] == ["A1"]


def test_a_lock_timeout_in_the_commit_round_trip_is_database_busy_and_writes_nothing(pg_cluster: Any) -> None:
    """The registry lock is taken in the round trip that carries COMMIT: its
    timeout must still be ``DatabaseBusy`` (the server never ran the COMMIT),
    never ``CommitOutcomeUnknown``, and leave nothing and a usable store."""
    location = pg_location("rt_busy")
    schema = location.partition("#")[2]
    with Producer(location, RESERVATION, busy_timeout=0.2) as producer:
        assert advance(producer, "A1", "A").status == "committed"
        with psycopg.connect(location.partition("#")[0], autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("reliable_flow", schema, "registry", ""),))
            with pytest.raises(DatabaseBusy) as raised:
                advance(producer, "B1", "B")
            assert not isinstance(raised.value, CommitOutcomeUnknown)
            holder.execute("ROLLBACK")
        assert producer.flow("B") is None
        assert [e.event_id for e in producer.outbox()] == ["A1"]
        assert advance(producer, "B1", "B").status == "committed"
        assert [e.event_id for e in producer.outbox()] == ["A1", "B1"]


def test_a_receive_of_a_new_event_takes_at_most_two_round_trips(pg_cluster: Any) -> None:
    with Consumer(pg_location("rt_receive"), RESERVATION) as consumer:
        conn = connection_of(consumer)
        for n in range(8):  # past psycopg's prepare threshold too
            result, lines = traced(conn, lambda n=n: consumer.receive(envelope(f"E{n}", f"F{n}", 1)))  # type: ignore[misc]
            assert result.status == "accepted"
            assert round_trips(lines) <= 2, (n, round_trips(lines), lines)
        again, lines = traced(conn, lambda: consumer.receive(envelope("E0", "F0", 1)))
        assert again.status == "duplicate"
        assert round_trips(lines) <= 3, lines  # the INSERT; the event's lock + its row; COMMIT
        assert [r.event_id for r in consumer.inbox("F0")] == ["E0"]


def test_a_receive_and_apply_takes_at_most_three_round_trips(pg_cluster: Any) -> None:
    with Consumer(pg_location("rt_receive_apply"), RESERVATION, apply_on_receive=True) as consumer:
        conn = connection_of(consumer)
        for n in range(8):
            result, lines = traced(conn, lambda n=n: consumer.receive(envelope(f"E{n}", f"F{n}", 1)))  # type: ignore[misc]
            assert result.status == "accepted" and result.applied
            assert round_trips(lines) <= 3, (n, round_trips(lines), lines)
        result, lines = traced(conn, lambda: consumer.receive(envelope("E0-2", "F0", 2)))
        assert result.status == "accepted" and result.applied
        assert round_trips(lines) <= 3, lines
        projection = consumer.projection("F0")
        assert projection is not None and (projection["state"], projection["last_seq"]) == ("confirmed", 2)


def test_apply_next_takes_at_most_two_round_trips(pg_cluster: Any) -> None:
    with Consumer(pg_location("rt_apply"), RESERVATION) as consumer:
        conn = connection_of(consumer)
        for n in range(8):
            assert consumer.receive(envelope(f"E{n}", f"F{n}", 1)).status == "accepted"
            assert consumer.receive(envelope(f"E{n}-2", f"F{n}", 2)).status == "accepted"
        for n in range(8):
            for seq in (1, 2):
                result, lines = traced(conn, lambda n=n: consumer.apply_next(f"F{n}"))  # type: ignore[misc]
                assert (result.status, result.seq) == ("applied", seq)
                assert round_trips(lines) <= 2, (n, seq, round_trips(lines), lines)
        idle, lines = traced(conn, lambda: consumer.apply_next("F0"))
        assert idle.status == "idle"
        assert round_trips(lines) <= 2, lines
        assert consumer.receive(envelope("G3", "G", 3)).status == "accepted"
        gap, lines = traced(conn, lambda: consumer.apply_next("G"))
        assert gap.status == "gap"
        assert round_trips(lines) <= 2, lines
        assert consumer.receive(envelope("H1", "H", 1, schema=7)).status == "accepted"
        blocked, lines = traced(conn, lambda: consumer.apply_next("H"))
        assert blocked.status == "blocked"
        assert round_trips(lines) <= 2, lines
        projection = consumer.projection("F7")
        assert projection is not None and (projection["state"], projection["last_seq"]) == ("confirmed", 2)
        assert consumer.projection("G") is None


def test_a_batch_of_receives_takes_two_round_trips_in_all(pg_cluster: Any) -> None:
    with Consumer(pg_location("rt_receive_many"), RESERVATION) as consumer:
        conn = connection_of(consumer)
        assert consumer.receive(envelope("old", "F0", 1)).status == "accepted"
        batch = [envelope(f"E{n}", f"F{n}", 1) for n in range(50)]
        results, lines = traced(conn, lambda: consumer.receive_many(batch))
        assert [r.status for r in results] == ["sequence_conflict"] + ["accepted"] * 49
        # The INSERT; F0's refusal: the event's lock + its row and tombstone,
        # the flow's lock + the slot's holder; COMMIT.
        assert round_trips(lines) <= 4, lines
        results, lines = traced(conn, lambda: consumer.receive_many(
            [envelope(f"E{n}-2", f"F{n}", 2) for n in range(1, 50)]))
        assert all(r.status == "accepted" for r in results)
        assert round_trips(lines) <= 2, lines
        # Drained in batches: one round trip per event (the next row's read,
        # which carries the previous apply's writes), plus the first read and COMMIT.
        drained, lines = traced(conn, lambda: consumer.drain("F1", batch_size=100))
        assert drained.applied == 2
        assert round_trips(lines) <= 2 + 2, lines


def test_a_batch_of_receive_and_apply_takes_one_round_trip_per_event(pg_cluster: Any) -> None:
    with Consumer(pg_location("rt_accept_many"), RESERVATION) as consumer:
        conn = connection_of(consumer)
        batch = [envelope(f"E{n}", f"F{n}", 1) for n in range(20)]
        results, lines = traced(conn, lambda: consumer.applying().accept_many([json.dumps(e) for e in batch]))
        assert all(r.status == "accepted" and r.applied for r in results)
        # the INSERT; each flow's lock + projection read (carrying the writes before it); COMMIT
        assert round_trips(lines) <= 1 + 20 + 1, lines

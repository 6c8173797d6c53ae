"""Round trips of the producer's calls on PostgreSQL, counted, not timed.

libpq's protocol trace (``pgconn.trace``) logs every message the client sends
(``F``) and receives (``B``).  A round trip is the client sending and then
waiting for the server: each run of ``F`` lines followed by a ``B`` line.
The method is checked on ``SELECT 1`` (one round trip) before it counts an
``advance``.

An ``advance`` that commits is three: BEGIN + the event id's advisory lock
+ the event / tombstone read; the flow's advisory lock + its row read
``FOR UPDATE``; the flow and outbox writes + the registry lock + COMMIT
(psycopg's pipeline mode).  It was ten, one per statement.  The locks stay
statements of their own, so each read's snapshot is taken after its lock was
granted (``tests/test_races.py`` and ``tests/test_kill.py`` prove the races
and the crashes on this engine).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from pg_cluster import import_psycopg, pg_location

psycopg = import_psycopg()

from reliable_flow import Producer
from reliable_flow._store.postgres.location import lock_key
from reliable_flow.errors import CommitOutcomeUnknown, DatabaseBusy
from reliable_flow.reservation import RESERVATION

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


def connection_of(producer: Producer) -> Any:
    return producer.store._db.conn  # type: ignore[attr-defined]


def advance(producer: Producer, event_id: str, flow_id: str) -> Any:
    return producer.advance(event_id, flow_id, expected_seq=0, kind="reserved", payload={"amount": 3})


def test_the_counting_method_sees_one_round_trip_for_select_1(pg_cluster: Any) -> None:
    with Producer(pg_location("rt_select"), RESERVATION) as producer:
        conn = connection_of(producer)
        row, lines = traced(conn, lambda: conn.execute("SELECT 1").fetchone())
    assert row == (1,)
    assert (round_trips(lines), statements(lines)) == (1, 1), lines


def test_an_advance_that_commits_takes_at_most_three_round_trips(pg_cluster: Any) -> None:
    with Producer(pg_location("rt_commit"), RESERVATION) as producer:
        conn = connection_of(producer)
        # Past psycopg's prepare threshold too: prepared statements must not add any.
        for n in range(8):
            result, lines = traced(conn, lambda n=n: advance(producer, f"A{n}", f"F{n}"))  # type: ignore[misc]
            assert result.status == "committed"
            assert round_trips(lines) <= 3, (n, round_trips(lines), lines)
        assert statements(lines) <= 9, lines
        # The next step of a flow that has a row (an UPDATE of it) is no different.
        result, lines = traced(conn, lambda: producer.advance(
            "A0-2", "F0", expected_seq=1, kind="confirmed", payload={"amount": 3}))
        assert result.status == "committed"
        assert round_trips(lines) <= 3, lines
        assert producer.flow("F0") == {"state": "confirmed", "seq": 2, "amount": 3}
        assert [e.event_id for e in producer.outbox("F0")] == ["A0", "A0-2"]


def test_a_repeated_or_stale_advance_takes_at_most_three_round_trips(pg_cluster: Any) -> None:
    with Producer(pg_location("rt_again"), RESERVATION) as producer:
        conn = connection_of(producer)
        assert advance(producer, "A1", "F").status == "committed"
        again, lines = traced(conn, lambda: advance(producer, "A1", "F"))
        assert again.status == "existing"
        assert round_trips(lines) <= 2, lines  # the event read answers it; nothing to write
        stale, lines = traced(conn, lambda: advance(producer, "B1", "F"))
        assert stale.status == "stale"
        assert round_trips(lines) <= 3, lines
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

"""The consumer's pipelined units on PostgreSQL (issue 23) keep their promises.

Writes nobody reads the result of are only sent, and answered with the next
read or the COMMIT; these tests pin what must not change with that: a
handler's SQL sees what the apply wrote before it and its error is raised by
its own call; a failed write rolls the whole unit back and propagates; the
set-based ``insert_new_many`` refuses exactly what ``insert_new`` refuses.
"""

from __future__ import annotations

from typing import Any

import pytest

from pg_cluster import import_psycopg, pg_location

psycopg = import_psycopg()

from reliable_flow import Consumer
from reliable_flow._envelope import Envelope, parse
from reliable_flow._handlers import ApplyContext
from reliable_flow._store.postgres import PgInboxStore
from reliable_flow.errors import ReliableFlowError
from reliable_flow.reservation import RESERVATION
from support import envelope

pytestmark = pytest.mark.postgres


def env(event_id: str, flow_id: str, seq: int) -> Envelope:
    return parse(envelope(event_id, flow_id, seq, kind="reserved"))


def test_a_handlers_sql_sees_the_apply_written_before_it(pg_cluster: Any) -> None:
    seen: list[tuple[Any, ...]] = []

    def look(ctx: ApplyContext) -> None:
        seen.extend(ctx.execute("SELECT state FROM inbox WHERE event_id = ?", [ctx.event.event_id]))
        seen.extend(ctx.execute("SELECT last_seq FROM projection WHERE flow_id = ?", [ctx.event.flow_id]))
        seen.extend(ctx.execute("SELECT count(*) FROM effect WHERE event_id = ?", [ctx.event.event_id]))

    with Consumer(pg_location("pipe_sees"), RESERVATION, handlers=[look]) as consumer:
        assert consumer.receive(envelope("E1", "F", 1)).status == "accepted"
        assert consumer.apply_next("F").status == "applied"
        assert seen == [("applied",), (1,), (1,)]
        seen.clear()
        with Consumer(consumer.location, RESERVATION, handlers=[look], apply_on_receive=True) as arriving:
            result = arriving.receive(envelope("E2", "F", 2))
            assert result.status == "accepted" and result.applied
        assert seen == [("applied",), (2,), (1,)]


def test_a_handlers_failing_sql_raises_at_its_call_and_leaves_nothing(pg_cluster: Any) -> None:
    calls: list[str] = []

    def broken(ctx: ApplyContext) -> None:
        calls.append("before")
        try:
            ctx.execute("INSERT INTO no_such_table VALUES (1)")
        except psycopg.errors.UndefinedTable:
            calls.append("raised at the call")
            raise
        calls.append("after")  # never reached

    with Consumer(pg_location("pipe_fails"), RESERVATION, handlers=[broken]) as consumer:
        assert consumer.receive(envelope("E1", "F", 1)).status == "accepted"
        with pytest.raises((psycopg.Error, ReliableFlowError)):
            consumer.apply_next("F")
        assert calls == ["before", "raised at the call"]
        assert consumer.projection("F") is None
        assert consumer.applied("F") == []
        assert [e.state for e in consumer.inbox("F")] == ["pending"]


def test_a_failed_write_of_an_apply_propagates_and_leaves_nothing(pg_cluster: Any) -> None:
    """The effect record is only sent (its error comes back with the COMMIT's
    round trip): a taken event id there must still fail the whole apply."""
    location = pg_location("pipe_write_fails")
    with Consumer(location, RESERVATION) as consumer:
        assert consumer.receive(envelope("E1", "F", 1)).status == "accepted"
        with psycopg.connect(location.partition("#")[0], autocommit=True) as raw:
            schema = location.partition("#")[2]
            raw.execute(f'INSERT INTO "{schema}".effect(event_id, flow_id, seq, kind) VALUES (%s, %s, %s, %s)',
                        ("E1", "other", 9, "reserved"))
            with pytest.raises((psycopg.Error, ReliableFlowError)):
                consumer.apply_next("F")
            assert consumer.projection("F") is None
            assert [e.state for e in consumer.inbox("F")] == ["pending"]
            raw.execute(f'DELETE FROM "{schema}".effect WHERE event_id = %s', ("E1",))
        assert consumer.apply_next("F").status == "applied"  # the store is usable after it


def test_insert_new_many_refuses_what_insert_new_refuses(pg_cluster: Any) -> None:
    store = PgInboxStore(pg_location("pipe_many"), RESERVATION.name)
    try:
        with store.write() as unit:
            assert unit.insert_new(env("taken", "A", 1), 1.0)
            assert unit.insert_new(env("slot", "B", 1), 1.0)
            unit.put_projection("C", "reserved", 2, "{}", "{}")
            unit._bury([(0, "pruned", "D", 1, '{"x": 1}')], 1.0)
        batch = [
            env("taken", "Z", 5),  # the id is in the inbox
            env("B1-other", "B", 1),  # the (flow, seq) slot is held by a live row
            env("C2", "C", 2),  # at the flow's last applied seq
            env("C1", "C", 1),  # before it
            env("pruned", "D", 1),  # the id was pruned (tombstone)
            env("new1", "C", 3),
            env("new2", "E", 1),
        ]
        with store.write() as unit:
            stored = unit.insert_new_many(batch, 2.0)
        assert stored == [False, False, False, False, False, True, True]
        with store.read() as view:
            assert [r.event_id for r in view.inbox_rows("C")] == ["new1"]
            assert [r.event_id for r in view.inbox_rows("E")] == ["new2"]
            assert view.inbox_rows("Z") == [] and view.inbox_rows("D") == []
            # In the order given: arrival follows the batch.
            arrivals = [r[0] for r in view._rows("SELECT event_id FROM inbox ORDER BY arrival")]
        assert arrivals == ["taken", "slot", "new1", "new2"]
        assert [r.received_at for r in store.latest.inbox_rows("E")] == [2.0]
    finally:
        store.close()

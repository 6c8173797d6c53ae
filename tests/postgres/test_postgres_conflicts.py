"""A deadlock on PostgreSQL is broken by the server and the library runs its
own transaction again (bounded), so the call still answers.

The cycle is made on purpose: another connection holds flow B's lock, the
consumer's ``process_all(batch_size=2)`` applies flow A and waits for B, and
then the other connection asks for A.  PostgreSQL aborts one side; the other
connection waits a minute before it even looks for a cycle
(``deadlock_timeout``), so the aborted side is the library's transaction.
``pg_stat_database.deadlocks`` shows the server really saw the cycle.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pg_cluster import import_psycopg
from reliable_flow import Consumer
from reliable_flow._core import conflicts
from reliable_flow.errors import TransactionConflict
from reliable_flow.reservation import RESERVATION
from support import envelope

pytestmark = pytest.mark.postgres

# Before anything that imports the engine: without psycopg this module skips
# (saying what to install), or fails under RELIABLE_FLOW_REQUIRE_POSTGRES.
psycopg = import_psycopg()

from reliable_flow._store.postgres.location import lock_key, parse


def _deadlocks(conn: Any) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()[0])


@pytest.fixture
def setting(pg_schema_location: str) -> Iterator[tuple[Consumer, Any, str]]:
    consumer = Consumer(pg_schema_location, RESERVATION)
    target = parse(pg_schema_location, "consumer")
    other = psycopg.connect(target.conninfo, autocommit=True)
    other.execute("SET deadlock_timeout = '60s'")  # never the side that gives up
    try:
        yield consumer, other, target.schema
    finally:
        other.close()
        consumer.close()


def _flow_key(schema: str, flow: str) -> int:
    return lock_key("reliable_flow", schema, "flow", flow)


def _cycle(consumer: Consumer, other: Any, schema: str) -> tuple[dict[str, Any], int]:
    """Run process_all into the cycle; what it returned (or raised), and how
    many deadlocks the server counted meanwhile."""
    assert [r.status for r in consumer.receive_many([envelope("A1", "A", 1), envelope("B1", "B", 1)])] == [
        "accepted", "accepted"]
    before = _deadlocks(other)
    other.execute("BEGIN")
    other.execute("SELECT pg_advisory_xact_lock(%s)", (_flow_key(schema, "B"),))
    out: dict[str, Any] = {}

    def drain() -> None:  # a consumer object belongs to the thread that opened it
        with Consumer(consumer.location, RESERVATION) as mine:
            try:
                out["result"] = mine.process_all(batch_size=2)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                out["error"] = exc

    worker = threading.Thread(target=drain)
    worker.start()
    deadline = time.monotonic() + 30
    while not _waits_for_lock(other) and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.05)  # until the consumer applied A and waits for B
    assert _waits_for_lock(other), f"the consumer never waited for flow B's lock: {out}"
    other.execute("SELECT pg_advisory_xact_lock(%s)", (_flow_key(schema, "A"),))  # the cycle
    other.execute("COMMIT")
    worker.join(60)
    assert not worker.is_alive()
    return out, _deadlocks(other) - before


def _waits_for_lock(other: Any) -> bool:
    rows = other.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory'").fetchone()
    return int(rows[0]) > 0


def test_a_deadlocked_apply_batch_is_run_again_and_applies_both_flows(setting: tuple[Consumer, Any, str]) -> None:
    consumer, other, schema = setting
    out, deadlocks = _cycle(consumer, other, schema)
    assert deadlocks >= 1, "the server saw no deadlock: the test did not make the cycle"
    assert "error" not in out, out
    assert {flow: (r.applied, str(r.stop)) for flow, r in out["result"].items()} == {
        "A": (1, "idle"), "B": (1, "idle")}
    assert [e.event_id for f in "AB" for e in consumer.applied(f)] == ["A1", "B1"]


def test_without_the_rerun_the_same_cycle_raises_transaction_conflict_and_writes_nothing(
    setting: tuple[Consumer, Any, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the cycle really aborts the library's transaction."""
    consumer, other, schema = setting
    def once_only(work: Any, attempts: int = 1) -> Any:
        return work()

    # The consumer's face runs its units again where it opens them (one shape of operation).
    for module in (conflicts, importlib.import_module("reliable_flow._consumer")):
        monkeypatch.setattr(module, "rerun_on_conflict", once_only)
    out, deadlocks = _cycle(consumer, other, schema)
    assert deadlocks >= 1
    assert isinstance(out.get("error"), TransactionConflict), out
    assert isinstance(out["error"].__cause__, psycopg.errors.DeadlockDetected)
    assert consumer.applied("A") == [] and consumer.projection("A") is None  # A's apply rolled back too
    assert consumer.drain("A").applied == 1 and consumer.drain("B").applied == 1

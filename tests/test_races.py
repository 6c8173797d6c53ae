"""Six real processes race for the same write (SPEC section 6, seed section 8).

Each child is a ``spawn`` process that opens its own Producer / Consumer,
waits at a shared barrier and then makes one call (or, for the relay race,
relays until idle).  Who wins is up to the scheduler, so the tests check
only the allowed set of answers and the final records, never which process
won.  A watchdog turns a hang into a failure; every child reports its
exception, and none may fail with "database is locked" at the default busy
timeout.  Then: what happens beyond the busy timeout, and six processes
creating the same new files at once.

Every race runs on both engines: SQLite files, and PostgreSQL schemas in one
database of the session's private server (``tests/pg_cluster.py``), where
each process opens its own connections, so the guarding reads must hold
under READ COMMITTED with many writers instead of SQLite's one.  The
registration race (an event committed while a consumer name is being
registered must still be delivered to it) was a reproduced hazard on
PostgreSQL; the lock timeout's counterpart of the busy timeout test is
PostgreSQL's own.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from children.racers import REGISTER_ADVANCES, race_child
from engine_reads import effect_counts as stored_effect_counts
from engine_reads import is_pg, new_location, rows
from reliable_flow import Consumer, Producer, relay
from reliable_flow.crash import ENV_VAR
from reliable_flow.errors import DatabaseBusy, StorageError
from reliable_flow.records import AppliedEvent, InboxEntry
from reliable_flow.reservation import RESERVATION
from support import start_on_barrier

RACERS = 6
WATCHDOG_SECONDS = 90.0
Location = Path | str  # a SQLite file, or a postgresql://...#schema location


def race(kind: str, producer_path: Location, consumer_path: Location) -> list[list[str]]:
    """Run six ``race_child(kind)`` processes released together; return their statuses.

    Fails (instead of blocking) if a child hangs, and fails if any child raised.
    """
    run = start_on_barrier(
        race_child, [(kind, str(producer_path), str(consumer_path), i) for i in range(RACERS)],
        WATCHDOG_SECONDS, name=f"race-{kind}",
    )
    errors = run.errors
    locked = {i: r for i, r in errors.items()
              if r.sqlite_error in ("SQLITE_BUSY", "SQLITE_LOCKED") or "DatabaseBusy" in r.error}
    assert not locked, f"{kind}: 'database is locked' at the default busy timeout: {locked}"
    assert not errors, f"{kind}: children failed: " + "\n".join(r.error for r in errors.values())
    assert run.exitcodes == [0] * RACERS, run.exitcodes
    return [list(statuses) for statuses in run.values()]


@pytest.fixture(autouse=True)
def no_crash_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned children inherit os.environ: make sure no crash point is armed in them."""
    monkeypatch.delenv(ENV_VAR, raising=False)




@pytest.fixture
def paths(engine: str, tmp_path: Path) -> tuple[Location, Location]:
    """Both stores created up front, so the race is about the call, not the store's creation."""
    producer_path, consumer_path = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    Producer(producer_path, RESERVATION).close()
    Consumer(consumer_path, RESERVATION).close()
    return producer_path, consumer_path


@pytest.fixture
def sqlite_paths(tmp_path: Path) -> tuple[Path, Path]:
    producer_path, consumer_path = tmp_path / "producer.db", tmp_path / "consumer.db"
    Producer(producer_path, RESERVATION).close()
    Consumer(consumer_path, RESERVATION).close()
    return producer_path, consumer_path


def effect_counts(consumer_path: Location) -> Counter[str]:
    """Effects per event id, read directly: the public API has no per-event count."""
    return stored_effect_counts(consumer_path)


def test_same_event_advanced_six_times_commits_once(paths: tuple[Location, Location]) -> None:
    producer_path = paths[0]
    statuses = Counter(s for child in race("advance_same", *paths) for s in child)
    assert statuses == {"committed": 1, "existing": 5}
    with Producer(producer_path, RESERVATION) as producer:
        assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
        assert [e.event_id for e in producer.outbox("A")] == ["A1"]


def test_six_new_ids_at_expected_seq_0_one_commits_five_are_stale(paths: tuple[Location, Location]) -> None:
    producer_path = paths[0]
    results = race("advance_new_ids", *paths)
    statuses = Counter(s for child in results for s in child)
    assert statuses == {"committed": 1, "stale": 5}
    winner = next(i for i, child in enumerate(results) if child == ["committed"])
    with Producer(producer_path, RESERVATION) as producer:
        assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
        assert [(e.event_id, e.seq) for e in producer.outbox("A")] == [(f"A1-{winner}", 1)]


def test_six_receives_of_one_envelope_store_it_once(paths: tuple[Location, Location]) -> None:
    consumer_path = paths[1]
    statuses = Counter(s for child in race("receive", *paths) for s in child)
    assert statuses == {"accepted": 1, "duplicate": 5}
    with Consumer(consumer_path, RESERVATION) as consumer:
        assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]


def test_six_apply_next_on_one_pending_event_leave_exactly_one_effect(paths: tuple[Location, Location]) -> None:
    producer_path, consumer_path = paths
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert relay(producer, consumer).status == "accepted"
    statuses = Counter(s for child in race("apply", *paths) for s in child)
    assert statuses == {"applied": 1, "idle": 5}
    with Consumer(consumer_path, RESERVATION) as consumer:
        assert consumer.applied("A") == [AppliedEvent(event_id="A1", flow_id="A", seq=1, kind="reserved")]
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
        assert consumer.inbox("A")[0].state == "applied"
    assert effect_counts(consumer_path) == {"A1": 1}


def test_six_relays_over_several_pending_events_accept_each_event_once(paths: tuple[Location, Location]) -> None:
    producer_path, consumer_path = paths
    events = [("A1", "A", 0, "reserved"), ("A2", "A", 1, "confirmed"), ("B1", "B", 0, "reserved"),
              ("C1", "C", 0, "reserved"), ("A3", "A", 2, "released"), ("B2", "B", 1, "confirmed")]
    with Producer(producer_path, RESERVATION) as producer:
        for event_id, flow_id, expected, kind in events:
            r = producer.advance(event_id, flow_id, expected_seq=expected, kind=kind, payload={"amount": 5})
            assert r.status == "committed"
    # The consumer is not bound yet: the six relays also race to register it.
    results = race("relay", *paths)
    answers = [line.split(" ") for child in results for line in child]
    assert {status for status, _ in answers} <= {"accepted", "duplicate", "idle"}
    assert all(child[-1] == "idle None" for child in results), results
    accepted = Counter(event_id for status, event_id in answers if status == "accepted")
    assert accepted == {event_id: 1 for event_id, *_ in events}, results
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        assert all(e.accepted for e in producer.outbox())
        for flow_id in ("A", "B", "C"):
            inbox = consumer.inbox(flow_id)
            ids = [e for e, f, *_ in events if f == flow_id]
            assert [(row.event_id, row.seq, row.state) for row in inbox] == [
                (event_id, seq, "pending") for seq, event_id in enumerate(ids, start=1)
            ]
        assert relay(producer, consumer).status == "idle"
        drained = consumer.process_all()
        assert {f: r.applied for f, r in drained.items()} == {"A": 3, "B": 2, "C": 1}


def test_beyond_the_busy_timeout_a_call_fails_cleanly_and_a_retry_succeeds(sqlite_paths: tuple[Path, Path]) -> None:
    """What the docs promise past the busy timeout: the lock error propagates,
    nothing is half-written, and the same call succeeds once the lock is free.
    (The other writer here is a plain sqlite3 connection holding the write lock.)"""
    producer_path, consumer_path = sqlite_paths
    envelope = {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1,
                "payload": {"amount": 3}}
    with Producer(producer_path, RESERVATION, busy_timeout=0.05) as producer, \
            Consumer(consumer_path, RESERVATION, busy_timeout=0.05) as consumer:
        calls = (
            ("advance", producer_path, lambda: producer.advance(
                "A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})),
            ("receive", consumer_path, lambda: consumer.receive(envelope)),
            ("apply_next", consumer_path, lambda: consumer.apply_next("A")),
        )
        for name, path, call in calls:
            with closing(sqlite3.connect(path, isolation_level=None)) as holder:
                holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the timeout
                with pytest.raises(DatabaseBusy) as caught:
                    call()
                holder.execute("ROLLBACK")
            # DatabaseBusy: a StorageError chaining SQLite's own SQLITE_BUSY.
            assert isinstance(caught.value, DatabaseBusy), (name, caught.value)
            assert getattr(caught.value.__cause__, "sqlite_errorname", None) == "SQLITE_BUSY", name
            assert "database is locked" in str(caught.value), name
            # Rolled back: nothing of the failed call was written.
            if name == "advance":
                assert producer.flow("A") is None and producer.outbox("A") == []
            if name == "receive":
                assert consumer.inbox("A") == []
            assert consumer.applied("A") == [] and consumer.projection("A") is None, name
            retried = call()  # the same call, retried once the lock is free
            assert retried.status in ("committed", "accepted", "applied"), (name, retried)
        assert [e.event_id for e in producer.outbox("A")] == ["A1"]
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
        assert consumer.applied("A") == [AppliedEvent(event_id="A1", flow_id="A", seq=1, kind="reserved")]


def test_six_processes_creating_the_same_new_files_all_open_them(engine: str, tmp_path: Path) -> None:
    """40 rounds of six processes opening the same two brand-new paths at once.

    Regression: the switch to WAL used to answer SQLITE_BUSY at once (no busy
    handler there), and the file check read application_id, user_version and
    the table count outside one snapshot, so a creator committing in between
    made a good file look foreign (WrongFile)."""
    base: Location = tmp_path if engine == "sqlite" else str(new_location(engine, tmp_path, "create"))
    results = race("create", base, base)
    failures = Counter(answer for child in results for answer in child if answer != "ok")
    assert not failures, f"{sum(failures.values())} failed opens: {failures.most_common(3)}"


def test_opening_a_new_file_waits_the_busy_timeout_like_every_other_call(tmp_path: Path) -> None:
    """Another connection holds the write lock of a new file for longer than the
    timeout: the open must wait ``busy_timeout`` and then fail, not fail at once."""
    path = tmp_path / "producer.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises((sqlite3.OperationalError, StorageError)):
            Producer(path, RESERVATION, busy_timeout=1.0).close()
        waited = time.monotonic() - started
        holder.execute("ROLLBACK")
    assert waited >= 0.9, f"gave up after {waited:.3f}s, busy_timeout is 1.0s"


def test_an_event_committed_while_a_consumer_registers_is_delivered_to_it(paths: tuple[Location, Location]) -> None:
    """The registration race: one process registers consumer names (each from
    the first event) while five others commit events.  Every event must be
    pending for every name registered from the first event, whichever
    committed first; an event that committed during a registration and was
    pending for nobody new would never be delivered to that consumer.  On
    PostgreSQL this needs the registry lock (``_store/postgres/registry.py``):
    without it this test fails."""
    producer_path = paths[0]
    results = race("register", *paths)
    names, committed = results[0], {event_id for child in results[1:] for event_id in child}
    assert len(committed) == (RACERS - 1) * REGISTER_ADVANCES and names, (len(committed), names)
    with Producer(producer_path, RESERVATION) as producer:
        assert {e.event_id for e in producer.outbox()} == committed
        missing = {
            name: sorted(e.event_id for e in producer.outbox() if name not in e.deliveries) for name in names
        }
        missing = {name: ids for name, ids in missing.items() if ids}
        assert not missing, f"events never to be delivered to a consumer registered meanwhile: {missing}"
        assert {c.name for c in producer.admin.consumers()} == set(names)
        # And delivered: the last name registered (it overlapped the most commits) gets every event.
        last = names[-1]
        location = (Path(str(paths[1])).with_name("late.db") if not is_pg(paths[1])
                    else str(paths[1]) + "_late")
        with Consumer(location, RESERVATION, name=last) as late:
            for _ in range(len(committed) + 1):
                if relay(producer, late).status == "idle":
                    break
            assert {e.event_id for f in late.flows() for e in late.inbox(f)} == committed


@pytest.mark.postgres
def test_beyond_the_lock_timeout_a_call_fails_cleanly_and_a_retry_succeeds_on_postgres(pg_cluster) -> None:
    """PostgreSQL's counterpart of the busy timeout test: another session
    holds a lock on the table a call must write past ``busy_timeout`` (the
    session's ``lock_timeout``): DatabaseBusy chaining the lock-timeout error
    (SQLSTATE 55P03), nothing half-written, and the same call succeeds once
    the lock is free."""
    psycopg = pytest.importorskip("psycopg")
    from pg_cluster import pg_location

    producer_path, consumer_path = pg_location("busy_p"), pg_location("busy_c")
    envelope = {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1,
                "payload": {"amount": 3}}
    with Producer(producer_path, RESERVATION, busy_timeout=0.05) as producer, \
            Consumer(consumer_path, RESERVATION, busy_timeout=0.05) as consumer:
        calls = (
            ("advance", producer_path, "flow", lambda: producer.advance(
                "A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})),
            ("receive", consumer_path, "inbox", lambda: consumer.receive(envelope)),
            ("apply_next", consumer_path, "projection", lambda: consumer.apply_next("A")),
        )
        for name, location, table, call in calls:
            url, _, schema = str(location).partition("#")
            with psycopg.connect(url, autocommit=True) as holder:
                holder.execute("BEGIN")
                holder.execute(f'LOCK TABLE "{schema}".{table} IN ACCESS EXCLUSIVE MODE')
                with pytest.raises(DatabaseBusy) as caught:
                    call()
                holder.execute("ROLLBACK")
            assert getattr(caught.value.__cause__, "sqlstate", None) == "55P03", (name, caught.value)
            if name == "advance":
                assert producer.flow("A") is None and producer.outbox("A") == []
            if name == "receive":
                assert consumer.inbox("A") == []
            assert consumer.applied("A") == [] and consumer.projection("A") is None, name
            retried = call()
            assert retried.status in ("committed", "accepted", "applied"), (name, retried)
        assert [e.event_id for e in producer.outbox("A")] == ["A1"]
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
        assert rows(consumer_path, "SELECT event_id FROM effect") == [("A1",)]

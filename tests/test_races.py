"""Six real processes race for the same write (SPEC section 6, seed section 8).

Each child is a ``spawn`` process that opens its own Producer / Consumer,
waits at a shared barrier and then makes one call (or, for the relay race,
relays until idle).  Who wins is up to the scheduler, so the tests check
only the allowed set of answers and the final records, never which process
won.  A watchdog turns a hang into a failure; every child reports its
exception, and none may fail with "database is locked" at the default busy
timeout.  Then: what happens beyond the busy timeout, and six processes
creating the same new files at once.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from children.racers import race_child
from reliable_flow import (
    Consumer,
    DatabaseBusy,
    EffectRecord,
    InboxEntry,
    Producer,
    StorageError,
    relay,
)
from reliable_flow.crash import ENV_VAR
from reliable_flow.reservation import RESERVATION
from support import sql_rows, start_on_barrier

RACERS = 6
WATCHDOG_SECONDS = 90.0


def race(kind: str, producer_path: Path, consumer_path: Path) -> list[list[str]]:
    """Run six ``race_child(kind)`` processes released together; return their statuses.

    Fails (instead of blocking) if a child hangs, and fails if any child raised.
    """
    run = start_on_barrier(
        race_child, [(kind, str(producer_path), str(consumer_path), i) for i in range(RACERS)],
        WATCHDOG_SECONDS, name=f"race-{kind}",
    )
    errors = run.errors
    locked = {i: r for i, r in errors.items() if r.sqlite_error in ("SQLITE_BUSY", "SQLITE_LOCKED")}
    assert not locked, f"{kind}: 'database is locked' at the default busy timeout: {locked}"
    assert not errors, f"{kind}: children failed: " + "\n".join(r.error for r in errors.values())
    assert run.exitcodes == [0] * RACERS, run.exitcodes
    return [list(statuses) for statuses in run.values()]


@pytest.fixture(autouse=True)
def no_crash_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned children inherit os.environ: make sure no crash point is armed in them."""
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    """Both files created up front, so the race is about the call, not the file's creation."""
    producer_path, consumer_path = tmp_path / "producer.db", tmp_path / "consumer.db"
    Producer(producer_path, RESERVATION).close()
    Consumer(consumer_path, RESERVATION).close()
    return producer_path, consumer_path


def effect_counts(consumer_path: Path) -> Counter[str]:
    """Effects per event id, read directly: the public API has no per-event count."""
    return Counter(dict(sql_rows(consumer_path, "SELECT event_id, count(*) FROM effect GROUP BY event_id")))


def test_same_event_advanced_six_times_commits_once(paths: tuple[Path, Path]) -> None:
    producer_path = paths[0]
    statuses = Counter(s for child in race("advance_same", *paths) for s in child)
    assert statuses == {"committed": 1, "existing": 5}
    with Producer(producer_path, RESERVATION) as producer:
        assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
        assert [e.event_id for e in producer.outbox("A")] == ["A1"]


def test_six_new_ids_at_expected_seq_0_one_commits_five_are_stale(paths: tuple[Path, Path]) -> None:
    producer_path = paths[0]
    results = race("advance_new_ids", *paths)
    statuses = Counter(s for child in results for s in child)
    assert statuses == {"committed": 1, "stale": 5}
    winner = next(i for i, child in enumerate(results) if child == ["committed"])
    with Producer(producer_path, RESERVATION) as producer:
        assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
        assert [(e.event_id, e.seq) for e in producer.outbox("A")] == [(f"A1-{winner}", 1)]


def test_six_receives_of_one_envelope_store_it_once(paths: tuple[Path, Path]) -> None:
    consumer_path = paths[1]
    statuses = Counter(s for child in race("receive", *paths) for s in child)
    assert statuses == {"accepted": 1, "duplicate": 5}
    with Consumer(consumer_path, RESERVATION) as consumer:
        assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]


def test_six_apply_next_on_one_pending_event_leave_exactly_one_effect(paths: tuple[Path, Path]) -> None:
    producer_path, consumer_path = paths
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert relay(producer, consumer).status == "accepted"
    statuses = Counter(s for child in race("apply", *paths) for s in child)
    assert statuses == {"applied": 1, "idle": 5}
    with Consumer(consumer_path, RESERVATION) as consumer:
        assert consumer.effects("A") == [EffectRecord(event_id="A1", flow_id="A", seq=1, kind="reserved")]
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
        assert consumer.inbox("A")[0].state == "applied"
    assert effect_counts(consumer_path) == {"A1": 1}


def test_six_relays_over_several_pending_events_accept_each_event_once(paths: tuple[Path, Path]) -> None:
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


def test_beyond_the_busy_timeout_a_call_fails_cleanly_and_a_retry_succeeds(paths: tuple[Path, Path]) -> None:
    """What the docs promise past the busy timeout: the lock error propagates,
    nothing is half-written, and the same call succeeds once the lock is free.
    (The other writer here is a plain sqlite3 connection holding the write lock.)"""
    producer_path, consumer_path = paths
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
            assert consumer.effects("A") == [] and consumer.projection("A") is None, name
            retried = call()  # the same call, retried once the lock is free
            assert retried.status in ("committed", "accepted", "applied"), (name, retried)
        assert [e.event_id for e in producer.outbox("A")] == ["A1"]
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
        assert consumer.effects("A") == [EffectRecord(event_id="A1", flow_id="A", seq=1, kind="reserved")]


def test_six_processes_creating_the_same_new_files_all_open_them(tmp_path: Path) -> None:
    """40 rounds of six processes opening the same two brand-new paths at once.

    Regression: the switch to WAL used to answer SQLITE_BUSY at once (no busy
    handler there), and the file check read application_id, user_version and
    the table count outside one snapshot, so a creator committing in between
    made a good file look foreign (WrongFile)."""
    results = race("create", tmp_path, tmp_path)
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

"""Storage faults: full disk, read-only files, failing statements, failed fsync, busy locks, fork.

Every test drives real SQLite files under ``tmp_path`` through the public
objects; faults are injected into SQLite itself, never by mocking:

* **disk full**: ``PRAGMA max_page_count`` lowered to the current page count
  on the object's own connection, so the next write that needs a page fails
  with SQLITE_FULL (SQLite rolls the transaction back itself); a real
  ``ENOSPC`` from ``write`` comes from the LD_PRELOAD shim described below.
* **read-only file**: ``PRAGMA query_only = ON`` on the object's connection
  (what a read-only mount looks like to SQLite: SQLITE_READONLY; chmod does
  nothing for root), and a real ``mode=ro`` connection for snapshot().
* **a failure at every statement**: a progress handler that interrupts the
  k-th SQLite VM step, for k = 1, 2, ... until the call runs clean
  (SQLITE_INTERRUPT ends the transaction on its own for writes, not for
  reads); and TEMP triggers with ``RAISE(ABORT)`` on each table a transaction
  writes (the statement fails, the transaction stays open: the library must
  roll back).
* **failed fsync / full disk at COMMIT**: a small C shim (``children/fault_shim.c``)
  compiled here with the system compiler and loaded with ``LD_PRELOAD`` into a
  child process (``children/faulty_child.py``) only;
  it makes ``fsync``/``fdatasync`` fail with EIO (or ``pwrite`` with ENOSPC)
  for one database once an "arm" file exists.  The child then dies without
  closing anything; the test reopens the files.
* **busy**: a raw connection holding ``BEGIN IMMEDIATE``.
* **fork**: ``os.fork()``; the child always leaves through ``os._exit``.

docs/storage-faults.md lists each fault, what the caller sees and what to do,
naming the test here that shows it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import Consumer, DeliveryPolicy, Producer, relay, snapshot
from reliable_flow._store.sqlite.connection import Database
from reliable_flow._store.sqlite.errors import BEGIN_RETRIES
from reliable_flow._store.sqlite.schema import CONSUMER, PRODUCER
from reliable_flow.errors import (
    CommitOutcomeUnknown,
    DatabaseBusy,
    ReadOnlyStorage,
    StorageError,
    StorageFull,
    WrongProcess,
)
from reliable_flow.records import InboxEntry
from reliable_flow.reservation import RESERVATION
from support import (
    CHILD_TIMEOUT,
    CHILDREN,
    SRC,
    advance_step,
    envelope,
    in_forked_child,
    run_script,
)

FULL = 2  # PRAGMA synchronous value of FULL
UNLIMITED_PAGES = 1 << 30


# -- helpers ------------------------------------------------------------------------------


def dump(path: str | os.PathLike[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, read through a separate read-only connection."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%' ORDER BY name"
        )]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


def delivery_states(producer: Producer) -> dict[str, str]:
    return {e.event_id: e.state for e in producer.outbox()}


def inbox_ids(consumer: Consumer, flow_id: str) -> list[str]:
    return [r.event_id for r in consumer.inbox(flow_id)]


def effect_ids(consumer: Consumer, flow_id: str) -> list[str]:
    return [e.event_id for e in consumer.applied(flow_id)]


def assert_apply_consistent(consumer: Consumer, flows: list[str]) -> int:
    """Projection, effects and inbox 'applied' marks agree for every flow; returns #applied."""
    total = 0
    for flow in flows:
        proj = consumer.projection(flow)
        applied = [r.event_id for r in consumer.inbox(flow) if r.state == "applied"]
        effects = effect_ids(consumer, flow)
        assert effects == applied, (flow, effects, applied)
        assert (proj["last_seq"] if proj else 0) == len(effects), (flow, proj, effects)
        total += len(effects)
    return total


def conn_of(producer: Producer, consumer: Consumer, side: str) -> sqlite3.Connection:
    return producer._store._db.conn if side == "producer" else consumer._store._db.conn


def path_of(producer: Producer, consumer: Consumer, side: str) -> str:
    return producer.location if side == "producer" else consumer.location


def no_transaction_open(producer: Producer, consumer: Consumer) -> None:
    assert not producer._store._db.conn.in_transaction, "the producer connection was left inside a transaction"
    assert not consumer._store._db.conn.in_transaction, "the consumer connection was left inside a transaction"


# -- the operations every fault is tried against ----------------------------------------------


@dataclass(frozen=True)
class Op:
    """One library call, its preparation, and how to check its end state.

    ``side``: the file (and connection) the call's own transaction writes.
    ``check_between``: invariants that hold after any failed attempt (for
    the *other* file, which the call may legitimately have written).
    ``final``: checks the answer of the call that finally ran clean and the
    end state; ``repeated`` is True if an earlier attempt may already have
    committed (so existing / duplicate / idle is the right answer).
    """

    name: str
    side: str
    setup: Callable[[Producer, Consumer], None]
    call: Callable[[Producer, Consumer], Any]
    final: Callable[[Producer, Consumer, Any, bool], None]
    must_hit: tuple[str, ...]
    check_between: Callable[[Producer, Consumer], None] = lambda p, c: None
    batch_boundaries: Callable[[Producer, Consumer], None] | None = None


def _bind(p: Producer, c: Consumer) -> None:
    assert relay(p, c).status == "idle"  # binds the consumer in the producer file


def _final_advance(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert r.status in (("committed", "existing") if repeated else ("committed",)), r
    assert p.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
    assert [e.event_id for e in p.outbox("A")] == ["A1"]


def _final_advance_next(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert r.status in (("committed", "existing") if repeated else ("committed",)), r
    assert p.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}
    assert [e.event_id for e in p.outbox("A")] == ["A1", "A2"]


def _batch3(p: Producer, c: Consumer | None = None) -> tuple[str, ...]:
    with p.batch() as b:
        advance_results = [
            b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}),
            b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3}),
            b.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}),
        ]
    return tuple(r.status.value for r in advance_results)


def _final_batch(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    allowed = {("committed",) * 3} | ({("existing",) * 3} if repeated else set())
    assert r in allowed, r
    assert [e.event_id for e in p.outbox()] == ["A1", "B1", "A2"]
    assert p.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}


def _final_receive(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert r.status in (("accepted", "duplicate") if repeated else ("accepted",)), r
    assert c.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]


THREE = [envelope("A1", "A", 1), envelope("B1", "B", 1), envelope("A2", "A", 2)]


def _final_receive_many(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    statuses = tuple(x.status.value for x in r)
    allowed = {("accepted",) * 3} | ({("duplicate",) * 3} if repeated else set())
    assert statuses in allowed, statuses
    assert inbox_ids(c, "A") == ["A1", "A2"] and inbox_ids(c, "B") == ["B1"]


def _setup_apply(p: Producer, c: Consumer) -> None:
    assert c.receive(envelope("A1", "A", 1)).status == "accepted"


def _final_apply(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert r.status in (("applied", "idle") if repeated else ("applied",)), r
    assert c.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
    assert effect_ids(c, "A") == ["A1"]
    assert c.inbox("A")[0].state == "applied"


def _setup_blocked(p: Producer, c: Consumer) -> None:
    assert c.receive(envelope("A1", "A", 1, schema=2)).status == "accepted"


def _final_blocked(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert r.status == "blocked" and r.reason == "unsupported_schema", r
    assert c.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="blocked", reason="unsupported_schema")]
    assert c.applied("A") == [] and c.projection("A") is None


def _setup_drain(p: Producer, c: Consumer) -> None:
    assert [r.status for r in c.receive_many([envelope(f"A{s}", "A", s) for s in (1, 2, 3)])] == ["accepted"] * 3


def _final_drain(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    # drain commits its batch of three, then looks once more (idle): a
    # failure in that last look keeps the committed batch.
    assert (r.applied, r.stop) in ((3, "idle"), (0, "idle")), r
    assert effect_ids(c, "A") == ["A1", "A2", "A3"]
    assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}


def _drain_boundaries(p: Producer, c: Consumer) -> None:
    assert assert_apply_consistent(c, ["A"]) in (0, 3), "drain(batch_size=3) committed part of a batch"


def _setup_process_all(p: Producer, c: Consumer) -> None:
    assert [r.status for r in c.receive_many([envelope(f"{f}1", f, 1) for f in "ABC"])] == ["accepted"] * 3


def _final_process_all(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert all(d.stop == "idle" for d in r.values()), r
    assert [effect_ids(c, f) for f in "ABC"] == [["A1"], ["B1"], ["C1"]]


def _process_all_boundaries(p: Producer, c: Consumer) -> None:
    assert assert_apply_consistent(c, list("ABC")) in (0, 3), "process_all(batch_size=3) committed part of a batch"


def _setup_relay(p: Producer, c: Consumer) -> None:
    _bind(p, c)
    assert advance_step(p, "A1", "A", 1).status == "committed"


def _final_relay(p: Producer, c: Consumer, r: Any, repeated: bool) -> None:
    assert r.status in ("accepted", "duplicate", "idle"), r
    assert delivery_states(p) == {"A1": "accepted"}
    assert c.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]
    assert relay(p, c).status == "idle"


def _between_relay_producer_side(p: Producer, c: Consumer) -> None:
    assert inbox_ids(c, "A") in ([], ["A1"])


def _between_relay_consumer_side(p: Producer, c: Consumer) -> None:
    assert delivery_states(p) == {"A1": "pending"}, "an event was marked accepted although receive failed"


OPS = [
    Op("advance", "producer", _bind, lambda p, c: advance_step(p, "A1", "A", 1), _final_advance,
       ("INSERT INTO flow", "INSERT INTO outbox", "INSERT INTO delivery", "COMMIT")),
    Op("advance_next_step", "producer", lambda p, c: (_bind(p, c), advance_step(p, "A1", "A", 1)),
       lambda p, c: advance_step(p, "A2", "A", 2), _final_advance_next,
       ("INSERT INTO flow", "INSERT INTO outbox", "INSERT INTO delivery", "COMMIT")),
    Op("producer_batch", "producer", _bind, _batch3, _final_batch,
       ("INSERT INTO flow", "INSERT INTO outbox", "INSERT INTO delivery", "COMMIT")),
    Op("receive", "consumer", lambda p, c: None, lambda p, c: c.receive(envelope("A1", "A", 1)),
       _final_receive, ("INSERT INTO inbox", "COMMIT")),
    Op("receive_many", "consumer", lambda p, c: None, lambda p, c: c.receive_many(THREE),
       _final_receive_many, ("INSERT INTO inbox", "COMMIT")),
    Op("apply_next", "consumer", _setup_apply, lambda p, c: c.apply_next("A"), _final_apply,
       ("INSERT INTO projection", "INSERT INTO effect", "UPDATE inbox", "COMMIT")),
    Op("apply_next_blocked", "consumer", _setup_blocked, lambda p, c: c.apply_next("A"), _final_blocked,
       ("UPDATE inbox", "COMMIT")),
    Op("drain_batch_size_3", "consumer", _setup_drain, lambda p, c: c.drain("A", batch_size=3), _final_drain,
       ("INSERT INTO projection", "INSERT INTO effect", "UPDATE inbox", "COMMIT"),
       batch_boundaries=_drain_boundaries),
    Op("process_all_batch_size_3", "consumer", _setup_process_all, lambda p, c: c.process_all(batch_size=3),
       _final_process_all, ("SELECT DISTINCT flow_id FROM inbox", "INSERT INTO effect", "COMMIT"),
       batch_boundaries=_process_all_boundaries),
    Op("relay_producer_side", "producer", _setup_relay, lambda p, c: relay(p, c), _final_relay,
       ("SELECT d.pos, o.body, d.prev_seq FROM delivery", "UPDATE delivery", "COMMIT"),
       check_between=_between_relay_producer_side),
    Op("relay_consumer_side", "consumer", _setup_relay, lambda p, c: relay(p, c), _final_relay,
       ("INSERT INTO inbox", "COMMIT"), check_between=_between_relay_consumer_side),
]


# -- injecting a failure at a chosen SQLite VM step ---------------------------------------------


@contextmanager
def interrupt_at_step(conn: sqlite3.Connection, k: int, *, only: str | None = None,
                      skip: str | None = "BEGIN IMMEDIATE") -> Iterator[dict[str, Any]]:
    """Interrupt the k-th VM step run on ``conn`` (counting only statements
    equal to ``only`` if given, and never inside ``skip``).  The returned dict
    says in which statement it fired (``fired_in``) and how many steps ran."""
    state: dict[str, Any] = {"sql": "", "steps": 0, "fired_in": None}

    def trace(sql: str) -> None:
        state["sql"] = sql

    def progress() -> int:
        if (only is not None and state["sql"] != only) or (skip is not None and state["sql"] == skip):
            return 0
        state["steps"] += 1
        if state["steps"] == k:
            state["fired_in"] = state["sql"]
            return 1
        return 0

    conn.set_trace_callback(trace)
    conn.set_progress_handler(progress, 1)
    try:
        yield state
    finally:
        with suppress(sqlite3.ProgrammingError):  # the library may have discarded (closed) it
            conn.set_progress_handler(None, 1)
            conn.set_trace_callback(None)


def run_interrupted(
    p: Producer, c: Consumer, op: Op, k: int, **kw: Any
) -> tuple[Any, BaseException | None, dict[str, Any]]:
    conn = conn_of(p, c, op.side)
    with interrupt_at_step(conn, k, **kw) as state:
        try:
            return op.call(p, c), None, state
        except (sqlite3.Error, StorageError) as exc:  # raw SQL errors, or ours with the sqlite3 one chained
            return None, exc, state


# -- a failure at every statement ----------------------------------------------------------------


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_a_failure_at_every_statement_rolls_back_fully_and_a_retry_succeeds(
    producer: Producer, consumer: Consumer, op: Op
) -> None:
    """Interrupt VM step 1, then 2, ... of the call's own connection until
    it runs clean.  Every interrupted attempt raises, leaves no transaction
    open, keeps synchronous=FULL and changes nothing in its file (a COMMIT
    that failed may have taken effect: then the retry must answer as for a
    repeat); the clean run is the retry, and it succeeds."""
    op.setup(producer, consumer)
    path = path_of(producer, consumer, op.side)
    before = dump(path)
    hit: list[str] = []
    repeated = False
    for k in range(1, 20_000):
        result, error, state = run_interrupted(producer, consumer, op, k)
        no_transaction_open(producer, consumer)
        # (After a failed COMMIT the library may replace the connection: ask for it afresh.)
        conn = conn_of(producer, consumer, op.side)
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == FULL, f"step {k}: synchronous left lowered"
        if error is None:
            assert state["fired_in"] is None, f"step {k} failed inside {state['fired_in']!r} but the call returned {result!r}"
            break
        assert state["fired_in"] is not None, f"step {k}: {error!r} was not the injected failure"
        hit.append(state["fired_in"])
        after = dump(path)
        if isinstance(error, CommitOutcomeUnknown):
            repeated = True  # it may or may not have committed; the final retry says which
            assert isinstance(error, StorageError) and isinstance(error.__cause__, sqlite3.Error)
        else:
            assert isinstance(error, sqlite3.OperationalError) and "interrupt" in str(error), repr(error)
            if op.batch_boundaries is not None:
                op.batch_boundaries(producer, consumer)
                repeated = repeated or after != before
            else:
                assert after == before, f"step {k} (in {state['fired_in']!r}) left a partial write"
        op.check_between(producer, consumer)
        before = after
    else:
        pytest.fail("the call never ran clean")
    op.final(producer, consumer, result, repeated)
    for wanted in op.must_hit:
        assert any(sql.startswith(wanted) for sql in hit), f"no failure was injected into {wanted!r}: {sorted(set(hit))}"


@pytest.mark.parametrize("op", [o for o in OPS if o.name in ("advance", "receive", "apply_next")], ids=lambda op: op.name)
def test_a_failure_inside_begin_immediate_leaves_no_transaction_open(
    producer: Producer, consumer: Consumer, op: Op
) -> None:
    """An interrupt late in BEGIN IMMEDIATE can leave SQLite inside the
    transaction; the library must roll it back, or every later call fails
    with 'cannot start a transaction within a transaction'."""
    op.setup(producer, consumer)
    before = dump(path_of(producer, consumer, op.side))
    for k in range(1, 100):
        result, error, state = run_interrupted(producer, consumer, op, k, only="BEGIN IMMEDIATE", skip=None)
        if error is None:
            break
        assert state["fired_in"] == "BEGIN IMMEDIATE"
        assert dump(path_of(producer, consumer, op.side)) == before
        no_transaction_open(producer, consumer)
    op.final(producer, consumer, result, False)


def _commit_steps(conn: sqlite3.Connection) -> int:
    """How many VM steps a COMMIT takes on this connection."""
    conn.execute("BEGIN IMMEDIATE")
    with interrupt_at_step(conn, 0, only="COMMIT", skip=None) as state:
        conn.execute("COMMIT")
    return int(state["steps"])


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("when", ["before_it_took_effect", "after_it_took_effect"])
def test_commit_that_fails_raises_outcome_unknown_and_the_retry_is_idempotent(
    producer: Producer, consumer: Consumer, op: Op, when: str
) -> None:
    """COMMIT itself fails: first before the transaction took effect, then at
    its last step, when it already had (the in-process twin of an fsync error
    on a write that reached the disk).  Either way CommitOutcomeUnknown, no
    transaction left open, and the same call again gives one copy: committed /
    accepted / applied the first time, existing / duplicate / idle the second."""
    op.setup(producer, consumer)
    conn = conn_of(producer, consumer, op.side)
    path = path_of(producer, consumer, op.side)
    last = _commit_steps(conn)
    before = dump(path)
    # The call's first COMMIT on its own connection fails at the chosen step.
    result, error, _ = run_interrupted(
        producer, consumer, op, 1 if when == "before_it_took_effect" else last, only="COMMIT", skip=None
    )
    assert isinstance(error, CommitOutcomeUnknown), (result, error)
    assert isinstance(error, StorageError) and not isinstance(error, sqlite3.Error)
    assert "may or may not be durable" in str(error)
    assert isinstance(error.__cause__, sqlite3.OperationalError)
    no_transaction_open(producer, consumer)
    took_effect = dump(path) != before
    assert took_effect is (when == "after_it_took_effect")
    retry = op.call(producer, consumer)
    op.final(producer, consumer, retry, took_effect)
    # And once more changes nothing at all.
    settled = dump(path)
    op.call(producer, consumer)
    assert dump(path) == settled


# -- a statement rejected by a trigger: the transaction stays open, the library rolls back -------


TRIGGER_CASES = [
    # (id, setup, side whose connection gets the trigger, trigger target, call, answer of the retry)
    ("advance-flow-insert", _bind, "producer", "INSERT ON main.flow",
     lambda p, c: advance_step(p, "A1", "A", 1).status, "committed"),
    ("advance-outbox-insert", _bind, "producer", "INSERT ON main.outbox",
     lambda p, c: advance_step(p, "A1", "A", 1).status, "committed"),
    ("advance-delivery-insert", _bind, "producer", "INSERT ON main.delivery",
     lambda p, c: advance_step(p, "A1", "A", 1).status, "committed"),
    ("advance-flow-update", lambda p, c: (_bind(p, c), advance_step(p, "A1", "A", 1)), "producer",
     "UPDATE ON main.flow",
     lambda p, c: advance_step(p, "A2", "A", 2).status, "committed"),
    ("batch-outbox-insert-of-the-second", _bind, "producer", "INSERT ON main.outbox WHEN new.flow_id = 'B'",
     lambda p, c: _batch3(p, c), ("committed",) * 3),
    ("relay-bind-consumer-insert", lambda p, c: advance_step(p, "A1", "A", 1), "producer", "INSERT ON main.consumer",
     lambda p, c: relay(p, c).status, "accepted"),
    ("relay-bind-delivery-insert", lambda p, c: advance_step(p, "A1", "A", 1), "producer", "INSERT ON main.delivery",
     lambda p, c: relay(p, c).status, "accepted"),
    ("relay-mark-delivery-update", _setup_relay, "producer", "UPDATE ON main.delivery",
     lambda p, c: relay(p, c).status, "duplicate"),
    ("receive-inbox-insert", lambda p, c: None, "consumer", "INSERT ON main.inbox",
     lambda p, c: c.receive(envelope("A1", "A", 1)).status, "accepted"),
    ("receive_many-inbox-insert-of-the-second", lambda p, c: None, "consumer",
     "INSERT ON main.inbox WHEN new.event_id = 'B1'",
     lambda p, c: tuple(r.status.value for r in c.receive_many(THREE)), ("accepted",) * 3),
    ("apply-projection-insert", _setup_apply, "consumer", "INSERT ON main.projection",
     lambda p, c: c.apply_next("A").status, "applied"),
    ("apply-effect-insert", _setup_apply, "consumer", "INSERT ON main.effect",
     lambda p, c: c.apply_next("A").status, "applied"),
    ("apply-inbox-update", _setup_apply, "consumer", "UPDATE ON main.inbox",
     lambda p, c: c.apply_next("A").status, "applied"),
    ("apply-projection-update",
     lambda p, c: (c.receive_many([envelope("A1", "A", 1), envelope("A2", "A", 2)]), c.apply_next("A")),
     "consumer", "UPDATE ON main.projection", lambda p, c: c.apply_next("A").status, "applied"),
    ("apply-blocked-inbox-update", _setup_blocked, "consumer", "UPDATE ON main.inbox",
     lambda p, c: c.apply_next("A").status, "blocked"),
    ("drain-effect-insert-of-the-third", _setup_drain, "consumer", "INSERT ON main.effect WHEN new.seq = 3",
     lambda p, c: c.drain("A", batch_size=3).applied, 3),
]


@pytest.mark.parametrize(
    "setup, side, target, call, retry_answer", [case[1:] for case in TRIGGER_CASES],
    ids=[case[0] for case in TRIGGER_CASES],
)
def test_a_statement_rejected_by_a_trigger_rolls_back_the_whole_transaction(
    producer: Producer, consumer: Consumer, setup: Callable[..., Any], side: str, target: str,
    call: Callable[[Producer, Consumer], Any], retry_answer: Any,
) -> None:
    setup(producer, consumer)
    conn = conn_of(producer, consumer, side)
    path = path_of(producer, consumer, side)
    before = dump(path)
    on, _, when = target.partition(" WHEN ")
    conn.execute(
        f"CREATE TEMP TRIGGER inject BEFORE {on} {'WHEN ' + when if when else ''} "
        f"BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
    )
    with pytest.raises(sqlite3.IntegrityError, match="injected fault") as raised:
        call(producer, consumer)
    # Not a storage fault: the SQL error propagates unchanged, after a full rollback.
    assert not isinstance(raised.value, StorageError)
    no_transaction_open(producer, consumer)
    assert dump(path) == before, "the statements before the rejected one were kept"
    conn.execute("DROP TRIGGER temp.inject")
    assert call(producer, consumer) == retry_answer
    no_transaction_open(producer, consumer)


def test_a_failed_advance_caught_inside_a_batch_leaves_nothing_of_itself(producer: Producer) -> None:
    """A caller catches a rejected advance inside the block and carries on:
    that advance leaves nothing (no flow row without its outbox event), the
    others commit together."""
    producer._store._db.conn.execute(
        "CREATE TEMP TRIGGER inject BEFORE INSERT ON main.outbox WHEN new.flow_id = 'B' "
        "BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
    )
    with producer.batch() as b:
        assert b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        with pytest.raises(sqlite3.IntegrityError, match="injected fault"):
            b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3})  # caught: carry on
        assert b.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
    producer._store._db.conn.execute("DROP TRIGGER temp.inject")
    assert producer.flow("B") is None and producer.outbox("B") == [], "half an advance was committed"
    assert [e.event_id for e in producer.outbox()] == ["A1", "C1"]
    assert advance_step(producer, "B1", "B", 1).status == "committed"  # not "stale": nothing of B1 was kept


def test_advances_after_a_storage_error_inside_a_batch_are_refused_and_nothing_commits(producer: Producer) -> None:
    """SQLITE_FULL ends the batch's transaction inside SQLite; a caller that
    catches it and carries on must not get the later advances committed one
    statement at a time (autocommit) outside the batch."""
    conn = producer._store._db.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    big = {f"k{i}": "x" * 1800 for i in range(8)}  # a 15 KB body needs new pages
    try:
        with pytest.raises((RuntimeError, StorageError)) as raised, producer.batch() as b:
            b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            with pytest.raises(StorageFull, match="full"):
                b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3}, meta=big)
            b.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 3})
    finally:
        conn.execute(f"PRAGMA max_page_count = {UNLIMITED_PAGES}")
    assert "batch" in str(raised.value)
    assert getattr(raised.value.__cause__, "sqlite_errorname", None) == "SQLITE_FULL"
    assert not producer._store._db.conn.in_transaction
    assert producer.flow("A") is None and producer.flow("C") is None, "part of a failed batch was committed"
    assert producer.outbox() == []
    assert _batch_of_three_again(producer) == ("committed",) * 3


def _batch_of_three_again(producer: Producer) -> tuple[str, ...]:
    with producer.batch() as b:
        results = [b.advance(f"{f}1", f, expected_seq=0, kind="reserved", payload={"amount": 3}) for f in "ABC"]
    return tuple(r.status.value for r in results)


def test_a_failure_in_a_lease_claim_never_leaves_the_connection_less_durable(
    producer: Producer, consumer: Consumer
) -> None:
    _setup_relay(producer, consumer)
    policy = DeliveryPolicy(lease_seconds=30, wait_for_due=False)
    for k in range(1, 5000):
        with interrupt_at_step(producer._store._db.conn, k) as state:
            try:
                relay(producer, consumer, policy=policy)
            except (sqlite3.Error, StorageError):
                pass
        assert producer._store._db.conn.execute("PRAGMA synchronous").fetchone()[0] == FULL, (
            f"after a failure in {state['fired_in']!r} the producer connection is no longer synchronous=FULL"
        )
        if state["fired_in"] is None:
            break
    assert delivery_states(producer) == {"A1": "accepted"}


# -- disk full ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FillOp:
    name: str
    side: str
    setup: Callable[[Producer, Consumer], None]
    attempt: Callable[[Producer, Consumer, int], Any]
    answer: Any  # what the attempt answers once it succeeds
    flows: Callable[[int], list[str]]


LONG = "x" * 100  # long flow ids fill index pages quickly
META = {"note": "y" * 600}


def _fill_receive_for_apply(p: Producer, c: Consumer) -> None:
    c.receive_many([envelope(f"{i}{LONG}-1", f"F{i}{LONG}", 1) for i in range(300)])


FILL_OPS = [
    FillOp("advance", "producer", _bind, lambda p, c, i: advance_step(p, f"E{i}", f"F{i}", 1, meta=META).status,
           "committed", lambda i: [f"F{i}"]),
    FillOp("producer_batch", "producer", _bind,
           lambda p, c, i: _batch_of(p, i), ("committed",) * 3, lambda i: [f"F{i}-{j}" for j in range(3)]),
    FillOp("receive", "consumer", lambda p, c: None,
           lambda p, c, i: c.receive(envelope(f"E{i}", f"F{i}", 1, meta=META)).status,
           "accepted", lambda i: [f"F{i}"]),
    FillOp("receive_many", "consumer", lambda p, c: None,
           lambda p, c, i: tuple(r.status.value for r in c.receive_many(
               [envelope(f"E{i}-{j}", f"F{i}-{j}", 1, meta=META) for j in range(3)])),
           ("accepted",) * 3, lambda i: [f"F{i}-{j}" for j in range(3)]),
    FillOp("apply_next", "consumer", _fill_receive_for_apply,
           lambda p, c, i: c.apply_next(f"F{i}{LONG}").status, "applied", lambda i: [f"F{i}{LONG}"]),
    FillOp("drain_batch_size_3", "consumer",
           lambda p, c: c.receive_many([envelope(f"{i}{LONG}-{s}", f"F{i}{LONG}", s) for i in range(100) for s in (1, 2, 3)]),
           lambda p, c, i: c.drain(f"F{i}{LONG}", batch_size=3).applied, 3, lambda i: [f"F{i}{LONG}"]),
]


def _batch_of(p: Producer, i: int) -> tuple[str, ...]:
    with p.batch() as b:
        results = [b.advance(f"E{i}-{j}", f"F{i}-{j}", expected_seq=0, kind="reserved",
                             payload={"amount": 3}, meta=META) for j in range(3)]
    return tuple(r.status.value for r in results)


@pytest.mark.parametrize("op", FILL_OPS, ids=lambda op: op.name)
def test_disk_full_writes_nothing_partial_and_work_resumes_when_space_returns(
    producer: Producer, consumer: Consumer, op: FillOp
) -> None:
    op.setup(producer, consumer)
    conn = conn_of(producer, consumer, op.side)
    path = path_of(producer, consumer, op.side)
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    try:
        for i in range(300):
            before = dump(path)
            try:
                assert op.attempt(producer, consumer, i) == op.answer
            except StorageFull as exc:
                full_at, error = i, exc
                break
        else:
            pytest.fail("the file never filled up")
        assert isinstance(error, StorageError) and isinstance(error.__cause__, sqlite3.OperationalError)
        assert not isinstance(error, CommitOutcomeUnknown)
        assert error.__cause__.sqlite_errorname == "SQLITE_FULL"  # type: ignore[union-attr]
        assert "full" in str(error) and "nothing was written" in str(error)
        no_transaction_open(producer, consumer)
        assert dump(path) == before, "a failed write left something behind"
        # Still full: the same call fails the same way, still cleanly.
        with pytest.raises(StorageFull):
            op.attempt(producer, consumer, full_at)
        assert dump(path) == before
    finally:
        conn.execute(f"PRAGMA max_page_count = {UNLIMITED_PAGES}")
    assert op.attempt(producer, consumer, full_at) == op.answer
    assert op.attempt(producer, consumer, full_at + 1) == op.answer
    if op.side == "consumer" and op.name.startswith(("apply", "drain")):
        assert assert_apply_consistent(consumer, [f for i in range(full_at + 2) for f in op.flows(i)]) > 0
    no_transaction_open(producer, consumer)


def test_disk_full_on_the_consumer_during_relay_is_recorded_and_delivery_resumes(
    producer: Producer, consumer: Consumer
) -> None:
    _bind(producer, consumer)
    conn = consumer._store._db.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    try:
        for i in range(300):
            assert advance_step(producer, f"E{i}", f"F{i}", 1, meta=META).status == "committed"
            before = dump(consumer.location)
            try:
                assert relay(producer, consumer).status == "accepted"
            except StorageFull:
                break
        else:
            pytest.fail("the consumer file never filled up")
        no_transaction_open(producer, consumer)
        assert dump(consumer.location) == before
        failed = producer.outbox(f"F{i}")[0]
        assert failed.state == "pending" and not failed.accepted
        assert (failed.deliveries[consumer.name].last_error or "").startswith("StorageFull")
    finally:
        conn.execute(f"PRAGMA max_page_count = {UNLIMITED_PAGES}")
    assert relay(producer, consumer).status == "accepted"
    assert relay(producer, consumer).status == "idle"
    assert producer.outbox(f"F{i}")[0].accepted is True
    assert inbox_ids(consumer, f"F{i}") == [f"E{i}"]


# -- read-only files ------------------------------------------------------------------------


def _assert_read_only(error: BaseException) -> None:
    assert isinstance(error, ReadOnlyStorage) and isinstance(error.__cause__, sqlite3.OperationalError)
    assert error.__cause__.sqlite_errorname == "SQLITE_READONLY"  # type: ignore[union-attr]
    assert "cannot be written" in str(error)


def test_read_only_producer_file_refuses_writes_clearly_and_keeps_reads(producer: Producer) -> None:
    assert advance_step(producer, "A1", "A", 1).status == "committed"
    conn = producer._store._db.conn
    before = dump(producer.location)
    conn.execute("PRAGMA query_only = ON")
    try:
        for call in (lambda: advance_step(producer, "A2", "A", 2),  # a new event
                     lambda: advance_step(producer, "A1", "A", 1),  # even a repeat: the write lock comes first
                     lambda: _batch3(producer)):
            with pytest.raises(ReadOnlyStorage) as raised:
                call()
            _assert_read_only(raised.value)
            assert not conn.in_transaction
        assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
        assert [e.event_id for e in producer.outbox("A")] == ["A1"]
    finally:
        conn.execute("PRAGMA query_only = OFF")
    assert dump(producer.location) == before
    assert advance_step(producer, "A2", "A", 2).status == "committed"


def test_read_only_consumer_file_refuses_writes_clearly_and_keeps_reads(
    producer: Producer, consumer: Consumer
) -> None:
    assert consumer.receive(envelope("A1", "A", 1)).status == "accepted"
    _setup_relay(producer, consumer)  # A1 in the outbox too, consumer bound
    conn = consumer._store._db.conn
    before = dump(consumer.location)
    conn.execute("PRAGMA query_only = ON")
    try:
        for call in (lambda: consumer.receive(envelope("A2", "A", 2)),
                     lambda: consumer.receive_many([envelope("B1", "B", 1)]),
                     lambda: consumer.apply_next("A"),
                     lambda: consumer.drain("A"),
                     lambda: consumer.process_all()):
            with pytest.raises(ReadOnlyStorage) as raised:
                call()
            _assert_read_only(raised.value)
            assert not conn.in_transaction
        # relay: the consumer's refusal is recorded in the producer file, never marked accepted.
        with pytest.raises(ReadOnlyStorage):
            relay(producer, consumer)
        entry = producer.outbox("A")[0]
        assert entry.state == "pending"
        assert entry.deliveries[consumer.name].last_error.startswith("ReadOnlyStorage")
        assert inbox_ids(consumer, "A") == ["A1"] and consumer.projection("A") is None
    finally:
        conn.execute("PRAGMA query_only = OFF")
    assert dump(consumer.location) == before
    assert relay(producer, consumer).status == "duplicate"
    assert consumer.apply_next("A").status == "applied"


def test_read_only_producer_during_relay_leaves_the_event_unmarked_until_writable(
    producer: Producer, consumer: Consumer
) -> None:
    _setup_relay(producer, consumer)
    conn = producer._store._db.conn
    before = dump(producer.location)
    conn.execute("PRAGMA query_only = ON")
    try:
        with pytest.raises(ReadOnlyStorage) as raised:
            relay(producer, consumer)
        _assert_read_only(raised.value)
        no_transaction_open(producer, consumer)
        # The consumer owns the event now; the producer simply could not record it.
        assert inbox_ids(consumer, "A") == ["A1"]
        assert delivery_states(producer) == {"A1": "pending"}
    finally:
        conn.execute("PRAGMA query_only = OFF")
    assert dump(producer.location) == before
    assert relay(producer, consumer).status == "duplicate"
    assert delivery_states(producer) == {"A1": "accepted"}
    assert inbox_ids(consumer, "A") == ["A1"]


def test_snapshot_reads_through_read_only_connections_that_cannot_write(
    producer: Producer, consumer: Consumer
) -> None:
    _setup_relay(producer, consumer)
    assert relay(producer, consumer).status == "accepted"
    files = [Path(producer.location), Path(consumer.location)]
    raw = {f: f.read_bytes() for f in files} | {Path(f"{f}-wal"): Path(f"{f}-wal").read_bytes() for f in files}
    snap = snapshot(producer.location, consumer.location)
    assert snap["consumer"]["inbox"]["A"][0]["event_id"] == "A1"
    assert {f: f.read_bytes() for f in raw} == raw, "snapshot() changed a byte"
    for path, kind in ((producer.location, PRODUCER), (consumer.location, CONSUMER)):
        db = Database(path, kind, readonly=True)
        try:
            with pytest.raises(ReadOnlyStorage) as raised, db.write() as conn:
                conn.execute("DELETE FROM meta")
            _assert_read_only(raised.value)
            assert not db.conn.in_transaction
        finally:
            db.close()
    assert {f: f.read_bytes() for f in raw} == raw


# -- busy -------------------------------------------------------------------------------------


@contextmanager
def write_lock_held(path: str) -> Iterator[sqlite3.Connection]:
    with closing(sqlite3.connect(path, isolation_level=None)) as blocker:
        blocker.execute("BEGIN IMMEDIATE")
        try:
            yield blocker
        finally:
            if blocker.in_transaction:
                blocker.execute("ROLLBACK")


@contextmanager
def traced(conn: sqlite3.Connection, hook: Callable[[str], None]) -> Iterator[None]:
    conn.set_trace_callback(hook)
    try:
        yield
    finally:
        conn.set_trace_callback(None)


BUSY_CALLS = {
    "advance": ("producer", lambda p, c: advance_step(p, "A1", "A", 1).status, "committed"),
    "receive": ("consumer", lambda p, c: c.receive(envelope("A1", "A", 1)).status, "accepted"),
    "apply_next": ("consumer", lambda p, c: c.apply_next("B").status, "applied"),
}


@pytest.mark.parametrize("name", sorted(BUSY_CALLS))
def test_busy_beyond_every_retry_is_a_clear_error_and_the_retry_after_release_commits(
    tmp_path: Path, name: str
) -> None:
    side, call, answer = BUSY_CALLS[name]
    timeout = 0.2
    with Producer(tmp_path / "producer.db", RESERVATION, busy_timeout=timeout) as p, \
            Consumer(tmp_path / "consumer.db", RESERVATION, busy_timeout=timeout) as c:
        assert c.receive(envelope("B1", "B", 1)).status == "accepted"
        conn, path = conn_of(p, c, side), path_of(p, c, side)
        before = dump(path)
        begins: list[str] = []
        with write_lock_held(path), traced(conn, lambda sql: begins.append(sql)):
            started = time.monotonic()
            with pytest.raises(DatabaseBusy) as raised:
                call(p, c)
            elapsed = time.monotonic() - started
        error = raised.value
        assert isinstance(error.__cause__, sqlite3.OperationalError) and "database is locked" in str(error)
        assert error.__cause__.sqlite_errorname == "SQLITE_BUSY"  # type: ignore[union-attr]
        # Bounded: the first BEGIN IMMEDIATE and BEGIN_RETRIES more, each waiting the busy timeout.
        assert begins == ["BEGIN IMMEDIATE"] * (BEGIN_RETRIES + 1)
        assert (BEGIN_RETRIES + 1) * timeout * 0.9 <= elapsed < 20
        no_transaction_open(p, c)
        assert dump(path) == before
        assert call(p, c) == answer


def test_a_lock_released_between_begin_retries_lets_the_call_succeed(tmp_path: Path) -> None:
    with Producer(tmp_path / "producer.db", RESERVATION, busy_timeout=0.1) as p:
        conn = p._store._db.conn
        begins: list[str] = []
        with write_lock_held(p.location) as blocker:
            def release_on_second_begin(sql: str) -> None:
                if sql == "BEGIN IMMEDIATE":
                    begins.append(sql)
                    if len(begins) == 2:
                        blocker.execute("COMMIT")  # the other writer finishes while we back off

            with traced(conn, release_on_second_begin):
                assert advance_step(p, "A1", "A", 1).status == "committed"
        assert begins == ["BEGIN IMMEDIATE", "BEGIN IMMEDIATE"]
        assert [e.event_id for e in p.outbox("A")] == ["A1"]


def test_busy_consumer_during_relay_is_recorded_and_delivery_resumes(tmp_path: Path) -> None:
    with Producer(tmp_path / "producer.db", RESERVATION) as p, \
            Consumer(tmp_path / "consumer.db", RESERVATION, busy_timeout=0.05) as c:
        _setup_relay(p, c)
        with write_lock_held(c.location), pytest.raises(DatabaseBusy):
            relay(p, c)
        entry = p.outbox("A")[0]
        assert entry.state == "pending"
        assert entry.deliveries[c.name].last_error.startswith("DatabaseBusy")
        assert inbox_ids(c, "A") == []
        assert relay(p, c).status == "accepted"
        assert delivery_states(p) == {"A1": "accepted"}


# -- failed fsync and a full disk at COMMIT: LD_PRELOAD shim in a child process ------------------


@pytest.fixture(scope="module")
def fault_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (gcc or cc) on PATH: cannot build the LD_PRELOAD fsync/write fault shim")
    if not sys.platform.startswith("linux"):
        pytest.skip("the fault shim reads /proc/self/fd and relies on glibc LD_PRELOAD: Linux only")
    build = tmp_path_factory.mktemp("shim")
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(build / "fault_shim.so"),
         str(CHILDREN / "fault_shim.c"), "-ldl"],
        capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False,
    )
    assert done.returncode == 0, f"{compiler} could not build the shim:\n{done.stderr}"
    return build / "fault_shim.so"


def run_faulty_child(tmp_path: Path, shim: Path, op: str, mode: str, kind: str = "fsync",
                     side: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Run the child with the shim failing fsync (or write) on one file: by
    default the file whose commit makes ``op`` durable (for relay, the
    consumer's: the producer's mark waits for no fsync)."""
    producer_path = os.path.realpath(tmp_path / "producer.db")
    consumer_path = os.path.realpath(tmp_path / "consumer.db")
    if side is None:
        side = "producer" if op == "advance" else "consumer"
    target = consumer_path if side == "consumer" else producer_path
    log = tmp_path / "shim.log"
    env = {  # deliberately minimal: nothing but what the child and the shim need
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(SRC),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LD_PRELOAD": str(shim),
        "FAULT_SHIM_KIND": kind,
        "FAULT_SHIM_ARM": str(tmp_path / "armed"),
        "FAULT_SHIM_MATCH": target,
        "FAULT_SHIM_LOG": str(log),
    }
    done = run_script(CHILDREN / "faulty_child.py", op, mode, producer_path, consumer_path, str(tmp_path / "armed"),
                      env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    injected = log.read_text().splitlines() if log.exists() else []
    return json.loads(done.stdout.strip().splitlines()[-1]), injected


def _reopened_state(tmp_path: Path, op: str) -> tuple[bool, Producer, Consumer]:
    """Reopen both files after the crash; say whether the op's write is there, checking it is whole."""
    p = Producer(tmp_path / "producer.db", RESERVATION)
    c = Consumer(tmp_path / "consumer.db", RESERVATION)
    if op == "advance":
        present = p.event("A1") is not None
        assert [e.event_id for e in p.outbox("A")] == (["A1"] if present else [])
        assert p.flow("A") == ({"state": "reserved", "seq": 1, "amount": 3} if present else None)
    elif op == "receive":
        present = bool(c.inbox("A"))
        assert c.inbox("A") == ([InboxEntry(event_id="A1", seq=1, state="pending", reason=None)] if present else [])
    elif op == "apply_next":
        present = c.projection("A") is not None
        assert effect_ids(c, "A") == (["A1"] if present else [])
        assert c.inbox("A")[0].state == ("applied" if present else "pending")
    else:  # relay: the consumer's commit failed; the producer marks only what the consumer answered
        present = inbox_ids(c, "A") == ["A1"]
        assert inbox_ids(c, "A") in ([], ["A1"])
        if present:
            assert c.inbox("A")[0].state == "pending"
        assert delivery_states(p) in ({"A1": "accepted"}, {"A1": "pending"})
    return present, p, c


RETRY_ANSWER = {  # (write present after the crash, write absent)
    "advance": ("existing", "committed"),
    "receive": ("duplicate", "accepted"),
    "apply_next": ("idle", "applied"),
    "relay": ("duplicate", "accepted"),
}


def _retry_in_parent(p: Producer, c: Consumer, op: str) -> str:
    if op == "advance":
        return str(advance_step(p, "A1", "A", 1).status)
    if op == "receive":
        return str(c.receive(envelope("A1", "A", 1)).status)
    if op == "apply_next":
        return str(c.apply_next("A").status)
    return str(relay(p, c, event_id="A1").status)


@pytest.mark.parametrize("mode", ["crash", "retry_then_crash"])
@pytest.mark.parametrize("op", ["advance", "receive", "apply_next", "relay"])
def test_fsync_eio_at_commit_is_outcome_unknown_and_after_a_crash_each_event_is_there_once_or_not_at_all(
    tmp_path: Path, fault_shim: Path, op: str, mode: str
) -> None:
    report, injected = run_faulty_child(tmp_path, fault_shim, op, "retry" if mode == "retry_then_crash" else "crash")
    assert injected, f"the shim never failed an fsync: {report}"
    assert report["first"] == "CommitOutcomeUnknown", report
    assert report["cause"].startswith("SQLITE_IOERR"), report
    assert report["is_storage_error"] is True
    assert report["in_transaction"] == [False, False]
    if mode == "retry_then_crash":
        # Same process, same objects, fsync working again: never a second copy, never a conflict.
        allowed = {"advance": {"committed", "existing"}, "receive": {"accepted", "duplicate"},
                   "apply_next": {"applied", "idle"}, "relay": {"accepted", "duplicate"}}[op]
        assert report["retry"] in allowed, report
    present, p, c = _reopened_state(tmp_path, op)
    try:
        if mode == "retry_then_crash":
            assert present, "the retry's answer was lost in the crash"
        answer = _retry_in_parent(p, c, op)
        assert answer == RETRY_ANSWER[op][0 if present else 1], (present, answer)
        present_now, p2, c2 = _reopened_state(tmp_path, op)
        p2.close()
        c2.close()
        assert present_now
        if op == "relay":
            assert relay(p, c).status == "idle"
    finally:
        p.close()
        c.close()


def test_the_relay_mark_waits_for_no_fsync(tmp_path: Path, fault_shim: Path) -> None:
    """With every fsync of the producer file failing, relay still succeeds:
    its only producer-side commit (the accepted mark) never asks for one.
    The durable commit of a relay is the consumer's (the test above)."""
    report, injected = run_faulty_child(tmp_path, fault_shim, "relay", "crash", side="producer")
    assert injected == [], injected
    assert report["first"] == "accepted", report
    assert report["in_transaction"] == [False, False]
    present, p, c = _reopened_state(tmp_path, "relay")
    try:
        assert present
        # The child left through os._exit: the mark survived the process
        # crash (it was in the WAL), as it does unless the OS itself goes down.
        assert delivery_states(p) == {"A1": "accepted"}
        assert relay(p, c).status == "idle"
    finally:
        p.close()
        c.close()


def test_fsync_shim_unarmed_changes_nothing(tmp_path: Path, fault_shim: Path) -> None:
    """Control: the same child with the shim loaded but never armed commits normally."""
    report, injected = run_faulty_child(tmp_path, fault_shim, "advance", "unarmed")
    assert injected == []
    assert report["first"] == "committed", report
    present, p, c = _reopened_state(tmp_path, "advance")
    p.close()
    c.close()
    assert present


def test_disk_full_while_commit_writes_the_wal_is_outcome_unknown_and_the_retry_commits_once(
    tmp_path: Path, fault_shim: Path
) -> None:
    """A real ENOSPC from write() during COMMIT (not max_page_count) surfaces as
    CommitOutcomeUnknown caused by SQLITE_FULL; after space returns the same
    call commits, exactly once."""
    report, injected = run_faulty_child(tmp_path, fault_shim, "advance", "retry", kind="write")
    assert injected, f"the shim never failed a write: {report}"
    assert report["first"] == "CommitOutcomeUnknown" and report["cause"] == "SQLITE_FULL", report
    assert report["in_transaction"] == [False, False]
    assert report["retry"] in ("committed", "existing"), report
    present, p, c = _reopened_state(tmp_path, "advance")
    try:
        assert present
        assert advance_step(p, "A1", "A", 1).status == "existing"
    finally:
        p.close()
        c.close()


# -- fork ---------------------------------------------------------------------------------------


def in_forked_child_reporting(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` in a forked child that always leaves through os._exit; return its report
    (``{"crashed": ...}`` if it raised)."""

    def report() -> str:
        try:
            out = work()
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            out = {"crashed": f"{type(exc).__name__}: {exc}"}
        return json.dumps(out)

    code, text = in_forked_child(report)
    assert code == 0
    return dict(json.loads(text))


def test_objects_used_after_fork_refuse_with_wrong_process_and_reopen_works_in_the_child(
    producer: Producer, consumer: Consumer
) -> None:
    _setup_relay(producer, consumer)
    parent = os.getpid()
    calls: dict[str, Callable[[], Any]] = {
        "advance": lambda: advance_step(producer, "B1", "B", 1),
        "flow": lambda: producer.flow("A"),
        "outbox": lambda: producer.outbox("A"),
        "batch": lambda: _batch3(producer, consumer),
        "relay": lambda: relay(producer, consumer),
        "receive": lambda: consumer.receive(envelope("B1", "B", 1)),
        "apply_next": lambda: consumer.apply_next("A"),
        "drain": lambda: consumer.drain("A"),
        "process_all": lambda: consumer.process_all(),
        "projection": lambda: consumer.projection("A"),
    }

    def work() -> dict[str, Any]:
        report: dict[str, Any] = {}
        for name, call in calls.items():
            try:
                call()
                report[name] = "no error"
            except WrongProcess as exc:
                report[name] = str(exc)
            except Exception as exc:  # noqa: BLE001
                report[name] = f"{type(exc).__name__}: {exc}"
        producer.reopen()
        consumer.reopen()
        try:
            report["after_reopen"] = [
                relay(producer, consumer).status.value,
                consumer.apply_next("A").status.value,
                advance_step(producer, "A2", "A", 2).status.value,
            ]
        finally:
            producer.close()
            consumer.close()
        return report

    report = in_forked_child_reporting(work)
    for name in calls:
        message = report[name]
        assert f"opened in process {parent}" in message and "reopen()" in message, (name, message)
    assert report["after_reopen"] == ["accepted", "applied", "committed"]
    # Nothing the child refused was written, and the child's reopened work is visible here.
    assert producer.flow("B") is None and inbox_ids(consumer, "B") == []
    assert producer.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}
    assert delivery_states(producer) == {"A1": "accepted", "A2": "pending"}
    assert effect_ids(consumer, "A") == ["A1"]
    # The parent's own objects were never touched by the child and still work.
    assert relay(producer, consumer).status == "accepted"
    assert consumer.drain("A").applied == 1
    assert consumer.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}
    no_transaction_open(producer, consumer)


def test_a_child_that_only_touches_an_inherited_object_writes_nothing(
    producer: Producer, consumer: Consumer
) -> None:
    _setup_relay(producer, consumer)
    before = (dump(producer.location), dump(consumer.location))

    def work() -> dict[str, Any]:
        outcomes = {}
        for name, call in (("advance", lambda: advance_step(producer, "A2", "A", 2)),
                           ("relay", lambda: relay(producer, consumer)),
                           ("receive", lambda: consumer.receive(envelope("A1", "A", 1)))):
            try:
                call()
                outcomes[name] = "wrote"
            except WrongProcess:
                outcomes[name] = "WrongProcess"
        return outcomes

    assert in_forked_child_reporting(work) == {
        "advance": "WrongProcess", "relay": "WrongProcess", "receive": "WrongProcess"
    }
    assert (dump(producer.location), dump(consumer.location)) == before
    assert relay(producer, consumer).status == "accepted"

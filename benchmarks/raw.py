"""Two minimal hand-written pipelines: the references below the project's floor.

The floor (``floor.py``) does the library's exact commits on the library's
exact schema.  These two pipelines ask a different question: what does the
*design* cost at its cheapest, written by hand with plain ``sqlite3``?

**Schema: the fewest tables and indexes the design needs.**  Two files, and
in them only what the protocol relies on:

* producer: ``flow`` (the current seq per flow: guards the sequence, so no
  ``UNIQUE(flow_id, seq)`` on the outbox is needed) and ``outbox`` (commit
  order ``pos`` as the rowid, ``event_id UNIQUE`` for idempotent
  ``advance``, a ``delivered`` flag instead of a delivery table), plus a
  partial index of undelivered rows, so a relay finds its next event
  without scanning the outbox;
* consumer: ``inbox`` (``event_id`` primary key for deduplication,
  ``UNIQUE(flow_id, seq)`` for the one-event-per-slot rule, an ``applied``
  flag) plus a partial index of unapplied rows (what is left to apply after
  a restart), and ``projection``.
* no effect table, no delivery table, no ``AUTOINCREMENT`` counters, no
  meta rows, no timestamps, no attempt counters; ``WITHOUT ROWID`` where the
  key is the only access path.

So per event: 3 tables and 4 indexes written (7 b-trees; the two partial
indexes get an insert and, when the work is done, a delete).

**Same pragmas and row bytes as the library**: WAL, ``synchronous=FULL``,
``isolation_level=None``, explicit ``BEGIN IMMEDIATE`` ... ``COMMIT``; the
canonical bodies, flow data and projection views of :class:`common.Event`,
computed before the clock starts.  Like the floor, these pipelines know
which event they just wrote and never look it up, and they do no
validation, no guarding reads, no JSON.

**Minimal raw 4-commit pipeline** (:class:`Raw4`), one event:

1. producer: upsert flow row + insert outbox row (durable);
2. consumer: insert inbox row (durable);
3. producer: mark the outbox row delivered (durable);
4. consumer: upsert projection + mark the inbox row applied (durable).

**Raw 2-durable-commit pipeline** (:class:`Raw2`), the physical limit for
two files:

1. producer: upsert flow row + insert outbox row (durable);
2. consumer: insert the inbox row already applied + upsert projection, one
   transaction (durable);
3. producer: mark delivered, committed with ``PRAGMA synchronous=NORMAL`` on
   that connection for that commit (in WAL mode NORMAL does not fsync at
   commit; the next FULL commit makes it durable), then back to FULL.

Both have a batched form: the same commits over 100 events each, with
``executemany``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from common import Event

__all__ = ["CONSUMER_DDL", "PRODUCER_DDL", "Raw2", "Raw4", "create_raw_files"]

PRODUCER_DDL = (
    """CREATE TABLE flow(
        flow_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        data TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE outbox(
        pos INTEGER PRIMARY KEY,
        event_id TEXT NOT NULL UNIQUE,
        flow_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        delivered INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX outbox_pending ON outbox(pos) WHERE delivered = 0",
)

CONSUMER_DDL = (
    """CREATE TABLE inbox(
        event_id TEXT PRIMARY KEY,
        flow_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL,
        applied INTEGER NOT NULL DEFAULT 0,
        UNIQUE (flow_id, seq)
    ) WITHOUT ROWID""",
    "CREATE INDEX inbox_pending ON inbox(flow_id, seq) WHERE applied = 0",
    """CREATE TABLE projection(
        flow_id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        data TEXT NOT NULL,
        view TEXT NOT NULL
    ) WITHOUT ROWID""",
)

UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)
INSERT_OUTBOX = "INSERT INTO outbox(pos, event_id, flow_id, seq, body) VALUES (?, ?, ?, ?, ?)"
LAST_POS = "SELECT max(pos) FROM outbox"
MARK_DELIVERED = "UPDATE outbox SET delivered = 1 WHERE pos = ?"
INSERT_INBOX = "INSERT INTO inbox(event_id, flow_id, seq, body) VALUES (?, ?, ?, ?)"
INSERT_INBOX_APPLIED = (
    "INSERT INTO inbox(event_id, flow_id, seq, body, applied) VALUES (?, ?, ?, ?, 1)"
)
UPSERT_PROJECTION = (
    "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, last_seq = excluded.last_seq, "
    "data = excluded.data, view = excluded.view"
)
MARK_APPLIED = "UPDATE inbox SET applied = 1 WHERE event_id = ?"


def connect(path: str) -> sqlite3.Connection:
    """WAL, synchronous=FULL, explicit transactions: the library's durability settings."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert str(mode).lower() == "wal", mode
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def create_raw_files(producer_path: str, consumer_path: str) -> None:
    """Create an empty producer/consumer pair with the minimal schema."""
    for path, ddl in ((producer_path, PRODUCER_DDL), (consumer_path, CONSUMER_DDL)):
        conn = connect(path)
        conn.execute("BEGIN IMMEDIATE")
        for statement in ddl:
            conn.execute(statement)
        conn.execute("COMMIT")
        conn.close()


class _Pipeline:
    """Both files' connections; the commits of one event or one batch."""

    def __init__(self, producer_path: str, consumer_path: str) -> None:
        self.p = connect(producer_path)
        self.c = connect(consumer_path)
        self.pos: dict[str, int] = {}

    @property
    def conns(self) -> list[sqlite3.Connection]:
        return [self.p, self.c]

    # commit 1, producer: flow row + outbox row
    def advance(self, e: Event) -> None:
        p = self.p
        p.execute("BEGIN IMMEDIATE")
        p.execute(UPSERT_FLOW, (e.flow_id, e.seq, e.kind, e.data))
        self.pos[e.event_id] = p.execute(  # type: ignore[assignment]
            INSERT_OUTBOX, (None, e.event_id, e.flow_id, e.seq, e.body)
        ).lastrowid
        p.execute("COMMIT")

    def advance_many(self, events: Sequence[Event]) -> None:
        p = self.p
        p.execute("BEGIN IMMEDIATE")
        last = p.execute(LAST_POS).fetchone()[0] or 0  # under the write lock
        positions = range(last + 1, last + 1 + len(events))
        self.pos.update(zip((e.event_id for e in events), positions))
        p.executemany(UPSERT_FLOW, [(e.flow_id, e.seq, e.kind, e.data) for e in events])
        p.executemany(
            INSERT_OUTBOX,
            [(q, e.event_id, e.flow_id, e.seq, e.body) for q, e in zip(positions, events)],
        )
        p.execute("COMMIT")

    def close(self) -> None:
        self.p.close()
        self.c.close()


class Raw4(_Pipeline):
    """The minimal raw 4-commit pipeline: every commit durable."""

    durable_commits = 4

    def receive(self, e: Event) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.execute(INSERT_INBOX, (e.event_id, e.flow_id, e.seq, e.body))
        c.execute("COMMIT")

    def mark(self, e: Event) -> None:
        p = self.p
        p.execute("BEGIN IMMEDIATE")
        p.execute(MARK_DELIVERED, (self.pos.pop(e.event_id),))
        p.execute("COMMIT")

    def apply(self, e: Event) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.execute(UPSERT_PROJECTION, (e.flow_id, e.kind, e.seq, e.data, e.view))
        c.execute(MARK_APPLIED, (e.event_id,))
        c.execute("COMMIT")

    def one(self, e: Event) -> None:
        """One event through all four commits."""
        self.advance(e)
        self.receive(e)
        self.mark(e)
        self.apply(e)

    def receive_many(self, events: Sequence[Event]) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.executemany(INSERT_INBOX, [(e.event_id, e.flow_id, e.seq, e.body) for e in events])
        c.execute("COMMIT")

    def mark_many(self, events: Sequence[Event]) -> None:
        p, pos = self.p, self.pos
        p.execute("BEGIN IMMEDIATE")
        p.executemany(MARK_DELIVERED, [(pos.pop(e.event_id),) for e in events])
        p.execute("COMMIT")

    def apply_many(self, events: Sequence[Event]) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.executemany(
            UPSERT_PROJECTION, [(e.flow_id, e.kind, e.seq, e.data, e.view) for e in events]
        )
        c.executemany(MARK_APPLIED, [(e.event_id,) for e in events])
        c.execute("COMMIT")

    def batch(self, events: Sequence[Event]) -> None:
        """``len(events)`` events through the four commits, one transaction each."""
        self.advance_many(events)
        self.receive_many(events)
        self.mark_many(events)
        self.apply_many(events)


class Raw2(_Pipeline):
    """The raw 2-durable-commit pipeline: receive and apply in one consumer
    commit, the producer's mark committed without fsync."""

    durable_commits = 2

    def receive_apply(self, e: Event) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.execute(INSERT_INBOX_APPLIED, (e.event_id, e.flow_id, e.seq, e.body))
        c.execute(UPSERT_PROJECTION, (e.flow_id, e.kind, e.seq, e.data, e.view))
        c.execute("COMMIT")

    def mark(self, e: Event) -> None:
        p = self.p
        p.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: no fsync at this commit
        p.execute("BEGIN IMMEDIATE")
        p.execute(MARK_DELIVERED, (self.pos.pop(e.event_id),))
        p.execute("COMMIT")
        p.execute("PRAGMA synchronous=FULL")

    def one(self, e: Event) -> None:
        """One event: two durable commits and one that is not."""
        self.advance(e)
        self.receive_apply(e)
        self.mark(e)

    def receive_apply_many(self, events: Sequence[Event]) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.executemany(
            INSERT_INBOX_APPLIED, [(e.event_id, e.flow_id, e.seq, e.body) for e in events]
        )
        c.executemany(
            UPSERT_PROJECTION, [(e.flow_id, e.kind, e.seq, e.data, e.view) for e in events]
        )
        c.execute("COMMIT")

    def mark_many(self, events: Sequence[Event]) -> None:
        p, pos = self.p, self.pos
        p.execute("PRAGMA synchronous=NORMAL")
        p.execute("BEGIN IMMEDIATE")
        p.executemany(MARK_DELIVERED, [(pos.pop(e.event_id),) for e in events])
        p.execute("COMMIT")
        p.execute("PRAGMA synchronous=FULL")

    def batch(self, events: Sequence[Event]) -> None:
        self.advance_many(events)
        self.receive_apply_many(events)
        self.mark_many(events)


def check(pipeline: _Pipeline, events: Sequence[Event]) -> None:
    """After the clock: every event delivered and applied, every projection at its seq."""
    p, c = pipeline.p, pipeline.c
    undelivered = p.execute("SELECT count(*) FROM outbox WHERE delivered = 0").fetchone()[0]
    unapplied = c.execute("SELECT count(*) FROM inbox WHERE applied = 0").fetchone()[0]
    if undelivered or unapplied:
        raise AssertionError(f"raw pipeline left {undelivered} undelivered, {unapplied} unapplied")
    last = {e.flow_id: e.seq for e in events}
    marks = ",".join("?" * len(last))
    got = dict(
        c.execute(
            f"SELECT flow_id, last_seq FROM projection WHERE flow_id IN ({marks})", list(last)
        ).fetchall()
    )
    if got != last:
        raise AssertionError("raw pipeline: projections do not match the events")

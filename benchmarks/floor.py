"""The raw-SQLite floor: the same commits as the library, and nothing else.

The floor is what a careful hand-written pipeline would cost on this
machine: the same two files, the same tables and indexes (the library's own
DDL from ``reliable_flow._store.sqlite.schema``, executed with plain
``sqlite3``), the same pragmas (WAL, ``synchronous=FULL``,
``isolation_level=None``, explicit ``BEGIN IMMEDIATE``; see
``reliable_flow._store.sqlite.connection``), the same rows with the same
bytes (canonical bodies, flow data, projection view), and the same number of
durable commits (the relay's accepted mark, like the library's, is committed
at ``synchronous=NORMAL``: no fsync).

What it leaves out is exactly the library's own work: validating and
canonicalising envelopes, parsing JSON, the guarding reads (duplicate id,
sequence slot, current flow seq, projection), protocol checks, result
objects.  Row values are computed before the clock starts; the floor knows
which event it just wrote, so it never searches for it, except in
``process_all`` where finding the pending rows is part of the job (one scan
of the same partial index the library uses).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence

from common import Event
from reliable_flow._store.sqlite.schema import CONSUMER, PRODUCER, FileKind

__all__ = ["FloorConsumer", "FloorProducer", "connect", "create_files"]

CONSUMER_NAME = "default"  # the library's default consumer name


def connect(path: str) -> sqlite3.Connection:
    """A connection configured like the library's (see reliable_flow/_store/sqlite/connection.py)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    assert str(mode).lower() == "wal", mode
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _create(path: str, kind: FileKind, meta: list[tuple[str, str]]) -> sqlite3.Connection:
    conn = connect(path)
    conn.execute("BEGIN IMMEDIATE")
    for statements in kind.migrations:  # the library's exact DDL, in order
        for statement in statements:
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {int(kind.application_id)}")
    conn.execute(f"PRAGMA user_version = {int(kind.version)}")
    conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", meta)
    conn.execute("COMMIT")
    return conn


def create_files(producer_path: str, consumer_path: str, uid: str = "0" * 32) -> None:
    """Create an empty producer/consumer pair with the library's schema, bound together."""
    conn = _create(
        consumer_path,
        CONSUMER,
        [("protocol", "reservation"), ("name", CONSUMER_NAME), ("uid", uid)],
    )
    conn.close()
    conn = _create(producer_path, PRODUCER, [("protocol", "reservation")])
    conn.execute("INSERT INTO consumer(name, uid) VALUES (?, ?)", (CONSUMER_NAME, uid))
    conn.close()


# The statements: the same rows and columns the library writes.
UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)
INSERT_OUTBOX = "INSERT INTO outbox(pos, event_id, flow_id, seq, body) VALUES (?, ?, ?, ?, ?)"
LAST_POS = "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'"
INSERT_DELIVERY = "INSERT INTO delivery(consumer, pos) VALUES (?, ?)"
MARK = (
    "UPDATE delivery SET state = 'accepted', last_status = 'accepted', attempts = attempts + 1, "
    "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = ? WHERE consumer = ? AND pos = ?"
)
INSERT_INBOX = "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) VALUES (?, ?, ?, ?, ?)"
UPSERT_PROJECTION = (
    "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, last_seq = excluded.last_seq, "
    "data = excluded.data, view = excluded.view"
)
INSERT_EFFECT = "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (?, ?, ?, ?)"
MARK_APPLIED = "UPDATE inbox SET state = 'applied', reason = NULL, detail = NULL WHERE event_id = ?"
PENDING = "SELECT event_id FROM inbox WHERE state IN ('pending','blocked') ORDER BY flow_id, seq"


class FloorProducer:
    """Producer-file commits: advance (flow + outbox + delivery rows) and the accepted mark."""

    def __init__(self, path: str) -> None:
        self.conn = connect(path)
        self.pos: dict[str, int] = {}

    def _advance_rows(self, e: Event) -> None:
        self.conn.execute(UPSERT_FLOW, (e.flow_id, e.seq, e.kind, e.data))
        pos = self.conn.execute(
            INSERT_OUTBOX, (None, e.event_id, e.flow_id, e.seq, e.body)
        ).lastrowid
        self.conn.execute(INSERT_DELIVERY, (CONSUMER_NAME, pos))
        self.pos[e.event_id] = pos  # type: ignore[assignment]

    def advance(self, e: Event) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self._advance_rows(e)
        self.conn.execute("COMMIT")

    def advance_many(self, events: Sequence[Event]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        row = self.conn.execute(
            LAST_POS
        ).fetchone()  # AUTOINCREMENT's counter, under the write lock
        positions = range((row[0] if row else 0) + 1, (row[0] if row else 0) + 1 + len(events))
        self.pos.update(zip((e.event_id for e in events), positions))
        self.conn.executemany(UPSERT_FLOW, [(e.flow_id, e.seq, e.kind, e.data) for e in events])
        self.conn.executemany(
            INSERT_OUTBOX,
            [(p, e.event_id, e.flow_id, e.seq, e.body) for p, e in zip(positions, events)],
        )
        self.conn.executemany(INSERT_DELIVERY, [(CONSUMER_NAME, p) for p in positions])
        self.conn.execute("COMMIT")

    # The accepted mark is committed without fsync, as the library commits it
    # (``durable=False``: synchronous=NORMAL for that commit, then FULL again).
    def mark(self, e: Event) -> None:
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(MARK, (time.time(), CONSUMER_NAME, self.pos[e.event_id]))
        self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA synchronous=FULL")

    def mark_many(self, events: Sequence[Event]) -> None:
        now = time.time()
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(MARK, [(now, CONSUMER_NAME, self.pos[e.event_id]) for e in events])
        self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA synchronous=FULL")

    def close(self) -> None:
        self.conn.close()


class FloorConsumer:
    """Consumer-file commits: receive (inbox row) and apply (projection + effect + inbox mark)."""

    def __init__(self, path: str) -> None:
        self.conn = connect(path)

    def receive(self, e: Event) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(INSERT_INBOX, (e.event_id, e.flow_id, e.seq, e.body, time.time()))
        self.conn.execute("COMMIT")

    def receive_many(self, events: Sequence[Event]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        now = time.time()
        self.conn.executemany(
            INSERT_INBOX, [(e.event_id, e.flow_id, e.seq, e.body, now) for e in events]
        )
        self.conn.execute("COMMIT")

    def _apply_rows(self, events: Sequence[Event]) -> None:
        self.conn.executemany(
            UPSERT_PROJECTION, [(e.flow_id, e.kind, e.seq, e.data, e.view) for e in events]
        )
        self.conn.executemany(
            INSERT_EFFECT, [(e.event_id, e.flow_id, e.seq, e.kind) for e in events]
        )
        self.conn.executemany(MARK_APPLIED, [(e.event_id,) for e in events])

    def apply(self, e: Event) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(UPSERT_PROJECTION, (e.flow_id, e.kind, e.seq, e.data, e.view))
        self.conn.execute(INSERT_EFFECT, (e.event_id, e.flow_id, e.seq, e.kind))
        self.conn.execute(MARK_APPLIED, (e.event_id,))
        self.conn.execute("COMMIT")

    def apply_many(self, events: Sequence[Event]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self._apply_rows(events)
        self.conn.execute("COMMIT")

    def process_all(self, by_id: dict[str, Event], batch_size: int) -> int:
        """Find every pending inbox row (one scan of the partial index) and
        apply them, ``batch_size`` per commit.  Returns how many were applied."""
        pending = [by_id[r[0]] for r in self.conn.execute(PENDING)]
        for start in range(0, len(pending), batch_size):
            self.apply_many(pending[start : start + batch_size])
        return len(pending)

    def close(self) -> None:
        self.conn.close()


def fsync_file(path: str) -> None:
    """Flush a freshly written file to disk, so its writeback does not land
    inside a later timed section as extra fsync latency."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Build producer/consumer files that already hold a history of ``n`` events.

The files are created by the library itself (``Producer`` / ``Consumer``
open them once: schema, meta rows, consumer uid), closed, and then filled
with plain ``sqlite3`` in one bulk transaction, in exactly the layout the
library writes: flows of three steps (reserved, confirmed, released) with
random hex ids, every event committed, delivered (``accepted``) and applied.

Producer file: ``outbox`` (n rows), ``delivery`` (n rows), ``flow`` (n/3).
Consumer file: ``inbox`` (n rows, applied), ``effect`` (n), ``projection`` (n/3).

The bulk load runs with ``journal_mode=OFF`` and ``synchronous=OFF`` (it is
a throw-away build, not a measurement); the files are switched back to WAL
and fsynced before anyone times anything on them.

Also: ``pending_inbox`` builds a consumer file with ``flows`` flows that each
have one pending (received, not applied) event, for ``process_all``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sqlite3
import time
from collections.abc import Iterator

from common import Event, event_rows, new_id
from floor import CONSUMER_NAME, UPSERT_FLOW, UPSERT_PROJECTION, fsync_file
from reliable_flow import Consumer, Producer
from reliable_flow.reservation import RESERVATION

__all__ = ["history", "pending_inbox"]

_CHUNK = 20_000


def _history_events(n: int, rng: random.Random) -> Iterator[Event]:
    made = 0
    while made < n:
        flow_id = "flow-" + new_id(rng, 64)
        amount = rng.randint(1, 1000)
        for seq in (1, 2, 3):
            if made == n:
                return
            # check=True (envelope.make) only on a sample: same canonical text.
            yield event_rows(new_id(rng), flow_id, seq, amount, check=made % 10_000 == 0)
            made += 1


def _bulk(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")  # leave WAL, so journal_mode=OFF is allowed
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-1000000")  # 1 GB: random-key index inserts stay in memory
    return conn


def _finish(conn: sqlite3.Connection, path: str) -> None:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    fsync_file(path)


def _fill_producer(path: str, n: int, seed: int, name: str, uid: str) -> None:
    now = time.time()
    conn = _bulk(path)
    conn.execute("BEGIN")
    conn.execute(
        "INSERT INTO consumer(name, uid) VALUES (?, ?)", (name, uid)
    )  # as relay's first bind does
    pos = 0
    for batch in _batches(n, seed):
        positions = range(pos + 1, pos + len(batch) + 1)
        pos += len(batch)
        conn.executemany(
            "INSERT INTO outbox(pos, event_id, flow_id, seq, body) VALUES (?, ?, ?, ?, ?)",
            [(p, e.event_id, e.flow_id, e.seq, e.body) for p, e in zip(positions, batch)],
        )
        conn.executemany(
            "INSERT INTO delivery(consumer, pos, state, last_status, attempts, updated_at) "
            "VALUES (?, ?, 'accepted', 'accepted', 1, ?)",
            [(name, p, now) for p in positions],
        )
        # Events are in seq order within a flow: the last upsert leaves the final state.
        conn.executemany(UPSERT_FLOW, [(e.flow_id, e.seq, e.kind, e.data) for e in batch])
    conn.execute("COMMIT")
    _finish(conn, path)


def _fill_consumer(path: str, n: int, seed: int) -> None:
    conn = _bulk(path)
    conn.execute("BEGIN")
    pos = 0
    for batch in _batches(n, seed):
        positions = range(pos + 1, pos + len(batch) + 1)
        pos += len(batch)
        conn.executemany(
            "INSERT INTO inbox(event_id, flow_id, seq, body, state) VALUES (?, ?, ?, ?, 'applied')",
            [(e.event_id, e.flow_id, e.seq, e.body) for e in batch],
        )
        conn.executemany(
            "INSERT INTO effect(id, event_id, flow_id, seq, kind) VALUES (?, ?, ?, ?, ?)",
            [(p, e.event_id, e.flow_id, e.seq, e.kind) for p, e in zip(positions, batch)],
        )
        conn.executemany(
            UPSERT_PROJECTION, [(e.flow_id, e.kind, e.seq, e.data, e.view) for e in batch]
        )
    conn.execute("COMMIT")
    _finish(conn, path)


def _batches(n: int, seed: int) -> Iterator[list[Event]]:
    batch: list[Event] = []
    for event in _history_events(n, random.Random(seed)):
        batch.append(event)
        if len(batch) >= _CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def history(directory: str, n: int, seed: int, *, parallel: bool = True) -> tuple[str, str]:
    """A producer and a consumer file in ``directory`` holding ``n`` past events.

    With ``parallel`` the producer file is filled in a forked child while
    this process fills the consumer file (both generate the same events
    from ``seed``), which halves the build time on two cores.
    """
    producer_path = os.path.join(directory, "producer.db")
    consumer_path = os.path.join(directory, "consumer.db")
    Producer(producer_path, RESERVATION).close()
    consumer = Consumer(consumer_path, RESERVATION)
    uid, name = consumer.uid, consumer.name
    consumer.close()
    assert name == CONSUMER_NAME
    args = (producer_path, n, seed, name, uid)
    if parallel and hasattr(os, "fork"):
        child = multiprocessing.get_context("fork").Process(target=_fill_producer, args=args)
        child.start()
        try:
            _fill_consumer(consumer_path, n, seed)
        finally:
            child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"building {producer_path} failed (exit code {child.exitcode})")
    else:
        _fill_producer(*args)
        _fill_consumer(consumer_path, n, seed)
    return producer_path, consumer_path


def pending_inbox(path: str, flows: int, seed: int) -> dict[str, Event]:
    """A consumer file at ``path`` with ``flows`` flows, each with one pending
    event (seq 1, received but not applied).  Returns the events by id."""
    Consumer(path, RESERVATION).close()
    rng = random.Random(seed)
    events = {}
    for _ in range(flows):
        e = event_rows(new_id(rng), "flow-" + new_id(rng, 64), 1, rng.randint(1, 1000), check=False)
        events[e.event_id] = e
    conn = _bulk(path)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO inbox(event_id, flow_id, seq, body) VALUES (?, ?, ?, ?)",
        [(e.event_id, e.flow_id, e.seq, e.body) for e in events.values()],
    )
    conn.execute("COMMIT")
    _finish(conn, path)
    return events

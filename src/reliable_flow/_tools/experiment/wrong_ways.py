"""COUNTER-EXAMPLES.  NEVER COPY THIS CODE.  IT IS WRONG ON PURPOSE.

This private module exists only so that ``python -m reliable_flow
experiment`` can *show*, on real SQLite files and real processes, the two
mistakes the rest of the library is built to prevent.  It is not exported
from :mod:`reliable_flow`, it is not part of the API, and nothing outside
:mod:`reliable_flow._tools.experiment` may import it.

1. :func:`unsafe_advance` commits the flow's new state in one
   transaction and would write the outbox event in a *second* one.  A process
   exit between the two (here a deliberate ``os._exit(81)``) leaves the flow
   advanced with no event: nothing will ever tell the consumer, and the relay
   honestly reports ``idle``.  The right way is ``Producer.advance``: state
   and outbox row in ONE transaction.

2. :class:`NaiveLastWriteConsumer` deduplicates by event id only and
   overwrites its state in arrival order.  Fed 3, 1, 2, 3 it ignores the
   repeated 3 correctly and still ends on the wrong answer (confirmed,
   last_seq 2, held 3) because dedup never promised order.  The right way is
   ``Consumer.apply_next``: apply exactly seq ``last_seq + 1`` or wait.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any

from ... import _envelope as envelope

__all__ = [
    "UNSAFE_EXIT_CODE",
    "NaiveLastWriteConsumer",
    "unsafe_advance",
    "unsafe_dual_write_then_die",
]

#: Exit code of the child that dies between the two writes of the unsafe dual write.
UNSAFE_EXIT_CODE = 81


def unsafe_advance(
    producer_path: str,
    event_id: str,
    flow_id: str,
    kind: str,
    amount: int,
    between_the_two_commits: Callable[[], None] = lambda: None,
) -> None:
    """WRONG: commit a new flow's state, then write its outbox event in a second transaction.

    ``producer_path`` must be an existing producer file.  Whatever happens in
    ``between_the_two_commits`` (a crash, a kill, a deploy) leaves the flow
    advanced and the event missing, forever.
    """
    data = envelope.canonical({"amount": amount})
    event = envelope.make(
        event_id=event_id, flow_id=flow_id, seq=1, kind=kind, schema=1, payload={"amount": amount}
    )
    conn = sqlite3.connect(producer_path, isolation_level=None, timeout=30.0)
    try:
        # Transaction 1: the flow's state.  Committed, durable.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, 1, ?, ?)", (flow_id, kind, data)
        )
        conn.execute("COMMIT")
        between_the_two_commits()
        # Transaction 2: the outbox event that should have gone out together
        # with the state.  Too late if the process died above.  (Being
        # hand-written SQL it also skips the producer's per-consumer delivery
        # rows: one more reason never to copy it.)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, ?, 1, ?)",
            (event.event_id, flow_id, event.body),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def unsafe_dual_write_then_die(producer_path: str) -> None:
    """Child process body: the unsafe dual write of A1, dying between the two commits (exit 81)."""
    unsafe_advance(
        producer_path,
        "A1",
        "A",
        "reserved",
        3,
        between_the_two_commits=lambda: os._exit(UNSAFE_EXIT_CODE),
    )


class NaiveLastWriteConsumer:
    """WRONG: dedup by event id, then overwrite the flow's state in arrival order.

    Really runs on SQLite, with proper transactions: the storage is fine, the
    *logic* is the mistake.  ``receive`` answers ``applied`` or
    ``ignored_duplicate``.
    """

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
        self._conn.execute("CREATE TABLE IF NOT EXISTS seen(event_id TEXT PRIMARY KEY)")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS state(flow_id TEXT PRIMARY KEY, state TEXT NOT NULL, "
            "last_seq INTEGER NOT NULL, held INTEGER NOT NULL)"
        )

    def receive(self, event: dict[str, Any]) -> str:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute(
                "SELECT 1 FROM seen WHERE event_id = ?", (event["event_id"],)
            ).fetchone():
                conn.execute("COMMIT")
                return "ignored_duplicate"
            conn.execute("INSERT INTO seen(event_id) VALUES (?)", (event["event_id"],))
            held = event["payload"]["amount"] if event["kind"] in ("reserved", "confirmed") else 0
            # The mistake: whatever arrived last wins, whatever its seq.
            conn.execute(
                "INSERT INTO state(flow_id, state, last_seq, held) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, "
                "last_seq = excluded.last_seq, held = excluded.held",
                (event["flow_id"], event["kind"], event["seq"], held),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return "applied"

    def state(self, flow_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT state, last_seq, held FROM state WHERE flow_id = ?", (flow_id,)
        ).fetchone()
        return None if row is None else {"state": row[0], "last_seq": row[1], "held": row[2]}

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> NaiveLastWriteConsumer:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

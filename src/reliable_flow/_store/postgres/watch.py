"""A PostgreSQL schema's signal for ``wait``: ``LISTEN`` on a connection of its own.

Every advance notifies the schema's channel (:func:`reliable_flow._store.watch.channel`)
with the flow's id when its transaction commits; the server pushes the
notification to every listening session at once, so a waiter hears it
within a round trip of the commit.  A pool's connection is given back
with ``UNLISTEN *`` first.
"""

from __future__ import annotations

import contextlib

import psycopg
from psycopg import sql

from ...errors import StorageError
from ..watch import channel
from .errors import storage_error
from .location import Location

__all__ = ["PgSignal"]


class PgSignal:
    """Notifications of the producer schema of ``where``; ``shown`` names it in errors."""

    def __init__(self, where: Location, shown: str) -> None:
        try:
            self._conn = where.connect()
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {shown} to wait: {exc}") from exc
        self._where = where
        try:
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(where.schema))))
        except BaseException:
            where.give_back(self._conn)
            raise

    def fileno(self) -> int:
        return self._conn.fileno()

    def news(self, flow_id: str) -> bool:
        # Read what arrived on the socket (never waits), then every notification it held.
        try:
            self._conn.pgconn.consume_input()
        except psycopg.Error as exc:
            raise storage_error(exc, "waiting for a flow", self._conn) from exc
        heard = [note.extra for note in iter(self._conn.pgconn.notifies, None)]
        return flow_id.encode() in heard

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self._conn.execute("UNLISTEN *")
        self._where.give_back(self._conn)

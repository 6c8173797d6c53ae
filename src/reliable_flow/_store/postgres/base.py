"""What both PostgreSQL stores share: one schema, one connection, and views of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ...errors import StorageError
from .connection import Conn, Database
from .errors import reraise, storage_error
from .location import lock_key

__all__ = ["PgStore", "PgView"]

View = TypeVar("View")
Row = tuple[Any, ...]


class PgView:
    """The connection as the engine's query classes see it: a unit of work
    (``writing``: its guarding reads take locks), a snapshot, or autocommit
    reads.  Locks are transaction-scoped: they end at COMMIT or ROLLBACK."""

    def __init__(self, conn: Conn, schema: str, writing: bool) -> None:
        self._conn = conn
        self._schema = schema
        self._writing = writing
        self.lost: BaseException | None = None

    def _rows(self, query: str, params: Sequence[Any] | None = None) -> list[Row]:
        if self._writing:
            return self._conn.execute(query, params).fetchall()
        try:
            return self._conn.execute(query, params).fetchall()
        except psycopg.Error as exc:
            reraise(exc, "a read", self._conn)

    def _one(self, query: str, params: Sequence[Any] | None = None) -> Row | None:
        if self._writing:
            return self._conn.execute(query, params).fetchone()
        try:
            return self._conn.execute(query, params).fetchone()
        except psycopg.Error as exc:
            # A read outside a unit of work (``latest``) has no transaction
            # to end: a lost connection is a StorageError here, and the
            # store's next call opens a new connection (Database.conn).
            reraise(exc, "a read", self._conn)

    def _run(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> int:
        """Execute a write; the number of rows it touched."""
        return self._conn.execute(query, params).rowcount

    def _lock(self, what: str, name: str = "", *, shared: bool = False) -> None:
        """In a unit of work, take the advisory lock ``what``/``name`` of this
        schema until the transaction ends (no-op in reads)."""
        if not self._writing:
            return
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        self._conn.execute(f"SELECT {fn}(%s)", (lock_key("reliable_flow", self._schema, what, name),))

    def _in_transaction(self) -> bool:
        return self._conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    @contextmanager
    def step(self) -> Iterator[None]:
        """A nested step (a SAVEPOINT): if it raises, none of its writes stay
        and the unit goes on (PostgreSQL's "current transaction is aborted"
        is undone by the rollback to the savepoint).  If the transaction is
        gone instead (the connection lost), :attr:`lost` is set and the
        caller must not go on."""
        conn = self._conn
        if not self._in_transaction():
            # A SAVEPOINT outside a transaction is refused by PostgreSQL; never
            # let a batch split into separate commits.
            self.lost = StorageError("the batch's transaction is gone")
            raise self.lost
        conn.execute("SAVEPOINT rf_step")
        try:
            yield
        except BaseException as exc:
            if not conn.closed and self._in_transaction():
                try:
                    conn.execute("ROLLBACK TO SAVEPOINT rf_step")
                    conn.execute("RELEASE SAVEPOINT rf_step")
                except psycopg.Error as lost:
                    self.lost = lost
                    raise storage_error(lost, "rolling back a step", conn) from exc
                raise
            self.lost = exc
            if isinstance(exc, psycopg.Error):
                translated = storage_error(exc, "a step of a unit of work", conn)
                if translated is not exc:
                    raise translated from exc
            raise
        conn.execute("RELEASE SAVEPOINT rf_step")


class PgStore(Generic[View]):
    """A store kept in one PostgreSQL schema.  ``view(conn, schema, writing)``
    wraps the connection in the engine's query class: a unit of work inside
    :meth:`write`, a snapshot inside :meth:`read`, autocommit reads as
    :attr:`latest`.  A view is valid only inside its with-block
    (:attr:`latest`: until the next ``close`` or ``reopen``)."""

    def __init__(self, db: Database, view: Callable[[Conn, str, bool], View]) -> None:
        self._db = db
        self._view = view

    @property
    def location(self) -> str:
        return self._db.location

    @property
    def schema(self) -> str:
        """The PostgreSQL schema (namespace) the store's tables live in."""
        return self._db.schema

    def write(self, *, durable: bool = True) -> AbstractContextManager[View]:
        """A unit of work: one READ COMMITTED transaction (see :meth:`Database.write_view`)."""
        return self._db.write_view(self._view, durable=durable)

    def read(self) -> AbstractContextManager[View]:
        """A consistent snapshot (REPEATABLE READ, read only), taken at the first read."""
        return self._db.read_view(self._view)

    @property
    def latest(self) -> View:
        """Reads outside any transaction: each sees the latest commit."""
        return self._view(self._db.conn, self._db.schema, False)

    def in_transaction(self) -> bool:
        return self._db.conn.info.transaction_status != TransactionStatus.IDLE

    def close(self) -> None:
        self._db.close()

    def reopen(self) -> None:
        self._db.reopen()

"""What both PostgreSQL stores share: one schema, one connection, and views of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ...errors import StorageError
from .. import rows
from ..repository.dialect import Dialect
from .connection import Conn, Database
from .connection import first_error as _first_error
from .errors import reraise, storage_error
from .location import lock_key

__all__ = ["PgStore", "PgView"]

View = TypeVar("View")
T = TypeVar("T")
Row = tuple[Any, ...]


class PgView(Dialect):
    """The connection as the engine's query classes see it: a unit of work
    (``writing``: its guarding reads take locks), a snapshot, or autocommit
    reads.  Locks are transaction-scoped: they end at COMMIT or ROLLBACK.

    In a pipelined unit (:meth:`_use_pipeline`) statements are sent without
    waiting: a read (``_rows`` / ``_one``) waits for its rows, and with them
    for everything sent before it (BEGIN, the advisory locks); a write whose
    count is needed (``_run``) waits too; a write nobody reads the result of
    (``_send``) goes with the next read, the step's end or the COMMIT.  The
    server runs them in the order sent, each statement on its own snapshot
    (READ COMMITTED), exactly as when each was its own round trip; a failed
    one aborts the transaction and the rest are skipped."""

    def __init__(self, conn: Conn, schema: str, writing: bool) -> None:
        self._conn = conn
        self._schema = schema
        self._writing = writing
        self._pipe: psycopg.Pipeline | None = None
        #: In a pipelined unit: the server has answered something of it (a
        #: read, a counted write, a step's end), so the connection was alive
        #: after BEGIN (see :meth:`Database.write_view`).
        self._answered = False
        self.lost: BaseException | None = None

    def _use_pipeline(self, pipeline: psycopg.Pipeline) -> None:
        """This unit runs in ``pipeline`` (see :meth:`Database.write_view`)."""
        self._pipe = pipeline

    def _execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> psycopg.Cursor[Any]:
        return self._conn.execute(query, params)

    def _cursor(self) -> psycopg.Cursor[Any]:
        """A cursor for ``executemany``."""
        return self._conn.cursor()

    def _rows(self, query: str, params: Sequence[Any] | None = None) -> list[Row]:
        return self._read(query, params, psycopg.Cursor.fetchall)

    def _one(self, query: str, params: Sequence[Any] | None = None) -> Row | None:
        return self._read(query, params, psycopg.Cursor.fetchone)

    def _read(self, query: str, params: Sequence[Any] | None, take: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """``take`` (fetch one or all) of a read's cursor."""
        if self._writing:
            found = take(self._execute(query, params))
            self._answered = True
            return found
        try:
            return take(self._conn.execute(query, params))
        except psycopg.Error as exc:
            # A read outside a unit of work (``latest``) has no transaction
            # to end: a lost connection is a StorageError here, and the
            # store's next call opens a new connection (Database.conn).
            reraise(exc, "a read", self._conn)

    def _many(self, query: str, params: Iterable[Sequence[Any]]) -> int:
        cur = self._cursor()
        cur.executemany(query, params)
        return cur.rowcount

    def _guarded(self, plain: str, locked: str) -> str:
        return locked if self._writing else plain

    def _names(self, sql: str, names: Sequence[str]) -> tuple[str, list[Any]]:
        return sql.format(names="%s"), [list(names)]

    def _keep_tombstone(self, event_id: str, found: Sequence[Sequence[Any]],
                        columns: tuple[int, int, int]) -> Sequence[Any] | None:
        """The id's own row among ``found`` (those whose first column is
        true), else None, keeping the tombstone among the others (its flow,
        seq and body hash at ``columns``) for :meth:`tombstone`."""
        held = [r for r in found if r[0]]
        if held:
            self._looked_up = None
            return held[0]
        tomb = [r for r in found if not r[0]]
        self._looked_up = (event_id, rows.tombstone(tuple(tomb[0][i] for i in columns)) if tomb else None)
        return None

    def _run(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> int:
        """Execute a write; the number of rows it touched (in a pipeline,
        after waiting for it: its error, if any, is raised here)."""
        cur = self._execute(query, params)
        if self._pipe is not None:
            self._pipe.sync()
            self._answered = True
        return cur.rowcount

    def _send(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> None:
        """Execute a write whose result is not needed.  In a pipelined unit
        it is only sent: its error (a taken key, a lock timeout) surfaces
        from the next read, the end of the :meth:`step` or the COMMIT of the
        same unit, and the server skips everything after it, so nothing of
        the unit is written."""
        self._execute(query, params)

    def _lock(self, what: str, name: str = "", *, shared: bool = False) -> None:
        """In a unit of work, take the advisory lock ``what``/``name`` of this
        schema until the transaction ends (no-op in reads).

        Always a statement of its own, never folded into the read it guards:
        a statement's snapshot is taken when it starts, before a lock call
        inside it waits, so a read in the same statement would miss what the
        holder committed while we waited (an event id's original, a flow's
        first row, a consumer just registered).  In a pipelined unit the lock
        is sent with that read, one round trip for both, and the read, a
        statement of its own, starts (and takes its snapshot) only once the
        lock is granted."""
        if not self._writing:
            return
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        self._execute(f"SELECT {fn}(%s)", (lock_key("reliable_flow", self._schema, what, name),))

    def _in_transaction(self) -> bool:
        status = self._conn.info.transaction_status
        if self._pipe is not None and status in (TransactionStatus.IDLE, TransactionStatus.ACTIVE):
            # In pipeline mode libpq knows the status only as of the last
            # Sync: settle what is in flight, then ask.
            self._settle()
            status = self._conn.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def _settle(self) -> BaseException | None:
        """In a pipelined unit, wait for everything sent (a Sync): the first
        error among it, None if none; afterwards the pipeline takes
        statements again (an aborted transaction stays aborted)."""
        first: BaseException | None = None
        for _ in range(4):  # each Sync also reads the answers a failed one left unread
            if self._pipe is None or self._conn.closed:
                break
            try:
                self._pipe.sync()
                self._answered = True
                break
            except psycopg.Error as exc:
                first = first or exc
        return first

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
            if self._pipe is not None:
                # The step's writes answer here, so a failed one is this
                # step's error (rolled back below), never the next one's.
                conn.execute("RELEASE SAVEPOINT rf_step")
                self._pipe.sync()
                self._answered = True
        except BaseException as exc:
            failed = exc
            if self._pipe is not None:
                self._settle()
                if isinstance(exc, psycopg.Error):
                    failed = _first_error(exc)  # the statement that failed, not one skipped after it
            if not conn.closed and self._in_transaction():
                try:
                    conn.execute("ROLLBACK TO SAVEPOINT rf_step")
                    conn.execute("RELEASE SAVEPOINT rf_step")
                    if self._pipe is not None:
                        self._pipe.sync()
                except psycopg.Error as lost:
                    self.lost = lost
                    raise storage_error(lost, "rolling back a step", conn) from failed
                if failed is exc:
                    raise
                raise failed from None
            self.lost = failed
            if isinstance(failed, psycopg.Error):
                translated = storage_error(failed, "a step of a unit of work", conn)
                if translated is not failed:
                    raise translated from failed
            if failed is exc:
                raise
            raise failed from None
        if self._pipe is None:
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
        return self._db.in_unit or self._db.conn.info.transaction_status != TransactionStatus.IDLE

    def close(self) -> None:
        self._db.close()

    def reopen(self) -> None:
        self._db.reopen()

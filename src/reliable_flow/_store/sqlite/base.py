"""What both SQLite stores share: one file, one connection, and views of it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from ..repository.dialect import Dialect, Row
from .connection import Database

__all__ = ["SqliteDialect", "SqliteStore", "Statements"]

View = TypeVar("View")


class Statements:
    """How a view runs its statements: every statement that ``keeps`` does
    not accept first calls ``changing()``.

    A view keeps answers it read ahead or writes it owes (a batch's
    deliveries, the rows a drain read ahead); ``changing`` settles them
    (writes what is owed, forgets what may be stale).  Doing it here, for
    every statement not known to leave them valid, means no method has to
    remember it: a new statement settles them by default."""

    __slots__ = ("_changing", "_keeps", "conn")

    def __init__(self, conn: sqlite3.Connection, keeps: Callable[[str], bool], changing: Callable[[], None]) -> None:
        self.conn = conn
        self._keeps = keeps
        self._changing = changing

    @property
    def in_transaction(self) -> bool:
        """True inside a transaction of the connection."""
        return self.conn.in_transaction

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement (after ``changing()`` unless it keeps the view's state)."""
        if not self._keeps(sql):
            self._changing()
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        """Run one statement for each parameter set (after ``changing()``, as :meth:`execute`)."""
        if not self._keeps(sql):
            self._changing()
        return self.conn.executemany(sql, params)


class SqliteDialect(Dialect):
    """How a statement runs on SQLite, for a view over one connection.

    A unit of work holds the file's write lock from its first statement
    (``BEGIN IMMEDIATE``), so there is no lock to take and no row to lock:
    :meth:`_lock` does nothing and :meth:`_guarded` picks the plain read."""

    def __init__(self, conn: sqlite3.Connection, keeps: Callable[[str], bool]) -> None:
        self._conn = Statements(conn, keeps, self._settle)

    def _settle(self) -> None:
        """Settle what the view holds before a statement that ``keeps`` does not accept (see :class:`Statements`)."""

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._conn.execute(sql, params).fetchall()

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self._conn.execute(sql, params).fetchone()
        return row

    def _run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self._conn.execute(sql, params).rowcount)

    def _send(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(sql, params)

    def _many(self, sql: str, params: Iterable[Sequence[Any]]) -> int:
        return int(self._conn.executemany(sql, params).rowcount)

    def _lock(self, what: str, name: str = "", *, shared: bool = False) -> None:
        pass

    def _guarded(self, plain: str, locked: str) -> str:
        return plain

    def _names(self, sql: str, names: Sequence[str]) -> tuple[str, list[Any]]:
        return sql.format(names=",".join("?" * len(names))), list(names)


class SqliteStore(Generic[View]):
    """A store kept in one SQLite file.  ``view(conn)`` wraps the connection
    in the engine's query class: a unit of work inside :meth:`write`, a
    snapshot inside :meth:`read`, autocommit reads as :attr:`latest`.  A view
    is valid only inside its with-block (:attr:`latest`: until the next
    ``close`` or ``reopen``)."""

    def __init__(self, db: Database, view: Callable[[sqlite3.Connection], View],
                 before_commit: Callable[[View], None] | None = None) -> None:
        # ``before_commit(unit)``: what a unit of work writes last, inside its
        # transaction (the producer's batch: its delivery rows at once).
        self._db = db
        self._view = view
        self._before_commit = before_commit

    @property
    def location(self) -> str:
        return self._db.path

    def write(self, *, durable: bool = True) -> AbstractContextManager[View]:
        """A unit of work: one ``BEGIN IMMEDIATE`` transaction (see :meth:`Database.write`)."""
        return self._db.write_view(self._view, durable=durable, before_commit=self._before_commit)

    def read(self) -> AbstractContextManager[View]:
        """A consistent snapshot: every read inside sees the same commit (taken
        at the first read, as SQLite does)."""
        return self._db.read_view(self._view)

    @property
    def latest(self) -> View:
        """Reads outside any transaction: each sees the latest commit."""
        return self._view(self._db.conn)

    def in_transaction(self) -> bool:
        return self._db.conn.in_transaction

    def close(self) -> None:
        self._db.close()

    def reopen(self) -> None:
        self._db.reopen()

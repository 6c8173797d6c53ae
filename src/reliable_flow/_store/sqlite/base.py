"""What both SQLite stores share: one file, one connection, and views of it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Generic, TypeVar

from .connection import Database

__all__ = ["SqliteStore"]

View = TypeVar("View")


class SqliteStore(Generic[View]):
    """A store kept in one SQLite file.  ``view(conn)`` wraps the connection
    in the engine's query class: a unit of work inside :meth:`write`, a
    snapshot inside :meth:`read`, autocommit reads as :attr:`latest`.  A view
    is valid only inside its with-block (:attr:`latest`: until the next
    ``close`` or ``reopen``)."""

    def __init__(self, db: Database, view: Callable[[sqlite3.Connection], View]) -> None:
        self._db = db
        self._view = view

    @property
    def location(self) -> str:
        return self._db.path

    def write(self, *, durable: bool = True) -> AbstractContextManager[View]:
        """A unit of work: one ``BEGIN IMMEDIATE`` transaction (see :meth:`Database.write`).
        A view with a ``_before_commit`` method has it called when the block
        ends normally, inside the transaction, before it commits."""
        return self._write(durable)

    @contextmanager
    def _write(self, durable: bool) -> Iterator[View]:
        with self._db.write_view(self._view, durable=durable) as view:
            yield view
            before_commit = getattr(view, "_before_commit", None)
            if before_commit is not None:
                before_commit()

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

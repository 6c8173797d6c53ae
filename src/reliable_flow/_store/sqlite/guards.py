"""The SQLite side of the connection checks (:mod:`reliable_flow._store.guards`)."""

from __future__ import annotations

import sqlite3

from ..guards import Opener, check_thread, opener, refuse_nested

__all__ = ["Opener", "check_outside_transaction", "check_thread", "opener"]


def check_outside_transaction(conn: sqlite3.Connection, kind: str, path: str) -> None:
    """Refuse to open a transaction inside one this object already has open
    (SQLite would say "cannot start a transaction within a transaction")."""
    refuse_nested(conn.in_transaction, kind, path)

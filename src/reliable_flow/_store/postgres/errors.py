"""PostgreSQL errors turned into reliable_flow's engine-independent errors.

Classified by SQLSTATE (``exc.sqlstate``) and by whether the connection is
still there, never by message text.  Constraint violations, syntax errors
and every other SQL error propagate unchanged (a taken key is
``psycopg.errors.UniqueViolation``, the contract's integrity error).
"""

from __future__ import annotations

from typing import NoReturn

import psycopg

from ...errors import DatabaseBusy, ReadOnlyStorage, StorageError, StorageFull, TransactionConflict

__all__ = ["connection_lost", "reraise", "storage_error"]

_DISK_FULL = "53100"
_READ_ONLY = "25006"
_LOCK_TIMEOUT = "55P03"
_SERIALIZATION = "40001"
_DEADLOCK = "40P01"
# Classes that mean the server or the storage under it failed: connection
# exceptions (08), insufficient resources (53), operator intervention (57:
# shutdown, terminated backend, cancel), system errors (58: I/O), internal
# errors (XX: corruption).
_STORAGE_CLASSES = ("08", "53", "57", "58", "XX")


def connection_lost(exc: BaseException, conn: psycopg.Connection[object] | None) -> bool:
    """True when ``exc`` means the connection is gone (or no longer trustworthy)."""
    if conn is not None and conn.closed:
        return True
    state = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.OperationalError) and state is None:
        return True  # the driver's own "connection lost" / "consuming input failed"
    return state is not None and (state.startswith("08") or state in ("57P01", "57P02", "57P03"))


def storage_error(exc: psycopg.Error, during: str, conn: psycopg.Connection[object] | None = None) -> BaseException:
    """The reliable_flow error for a storage fault, or ``exc`` itself for any
    other SQL error (constraints, syntax), which must propagate unchanged."""
    state = exc.sqlstate or ""
    said = f"{exc} (SQLSTATE {state or 'none'})"
    if state == _DISK_FULL:
        return StorageFull(f"{during}: {said}: the server's disk is full; nothing was written")
    if state == _READ_ONLY:
        return ReadOnlyStorage(f"{during}: {said}: the server accepts no writes (read-only); nothing was written")
    if state == _LOCK_TIMEOUT:
        return DatabaseBusy(
            f"{during}: {said}: another transaction held a lock this one needs through the lock "
            f"timeout; nothing was written, the call can be retried"
        )
    if state in (_SERIALIZATION, _DEADLOCK):
        return TransactionConflict(
            f"{during}: {said}: PostgreSQL aborted this transaction to break a lock cycle with a "
            f"concurrent one; nothing was written, the transaction can be run again"
        )
    if connection_lost(exc, conn):
        return StorageError(
            f"{during}: {said}: the connection to the server was lost before COMMIT, so nothing "
            f"was written; the next call opens a new connection"
        )
    if state[:2] in _STORAGE_CLASSES:
        return StorageError(f"{during}: {said}")
    return exc


def reraise(exc: psycopg.Error, during: str, conn: psycopg.Connection[object] | None = None) -> NoReturn:
    translated = storage_error(exc, during, conn)
    if translated is exc:
        raise exc
    raise translated from exc

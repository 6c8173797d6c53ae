"""SQLite result codes turned into reliable_flow's engine-independent errors.

Classified by the result code (``sqlite_errorcode``, Python 3.11+), never by
message text, except on Python 3.10 where the code is missing: there, and
only there, it is recovered from SQLite's exact ``sqlite3_errstr()`` texts.
"""

from __future__ import annotations

import sqlite3
from typing import NoReturn

from ...errors import DatabaseBusy, ReadOnlyStorage, StorageError, StorageFull

__all__ = ["BEGIN_RETRIES", "SQLITE_BUSY", "SQLITE_LOCKED", "primary_code", "reraise", "storage_error"]

BEGIN_RETRIES = 3


# Primary result codes (the low byte of an extended code).
SQLITE_BUSY, SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_FULL = 5, 6, 8, 13
_STORAGE_CODES = {SQLITE_BUSY, SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_FULL,
                  10, 11, 14, 26}  # IOERR, CORRUPT, CANTOPEN, NOTADB
# Python 3.10's sqlite3 errors carry no result code.  There, and only there,
# the code is recovered from the message when it is exactly SQLite's own
# sqlite3_errstr() text for that code (never a substring, never a custom
# message): the closest honest stand-in for the missing attribute.
_ERRSTR_CODES = {
    "database is locked": SQLITE_BUSY,
    "database table is locked": SQLITE_LOCKED,
    "attempt to write a readonly database": _SQLITE_READONLY,
    "database or disk is full": _SQLITE_FULL,
    "disk I/O error": 10,
    "database disk image is malformed": 11,
    "unable to open database file": 14,
    "file is not a database": 26,
}


_CODE_NAMES = {5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 8: "SQLITE_READONLY", 13: "SQLITE_FULL",
               10: "SQLITE_IOERR", 11: "SQLITE_CORRUPT", 14: "SQLITE_CANTOPEN", 26: "SQLITE_NOTADB"}


def primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is None:
        code = _ERRSTR_CODES.get(str(exc))
        if code is not None:
            # Give the chained error the attributes it has on 3.11+, so the
            # caller can inspect it the same way on every supported Python.
            setattr(exc, "sqlite_errorcode", code)  # noqa: B010 - not declared on 3.10
            setattr(exc, "sqlite_errorname", _CODE_NAMES[code])  # noqa: B010
        return code
    return int(code) & 0xFF


def storage_error(exc: sqlite3.Error, during: str) -> BaseException:
    """The reliable_flow error for a storage fault, or ``exc`` itself for any
    other SQL error (constraints, triggers), which must propagate unchanged."""
    code = primary_code(exc)
    if code not in _STORAGE_CODES:
        return exc
    said = f"{exc} ({getattr(exc, 'sqlite_errorname', '?')})"
    if code == _SQLITE_FULL:
        return StorageFull(f"{during}: {said}: the disk or database is full; nothing was written")
    if code == _SQLITE_READONLY:
        return ReadOnlyStorage(f"{during}: {said}: the file cannot be written; nothing was written")
    if code in (SQLITE_BUSY, SQLITE_LOCKED):
        return DatabaseBusy(
            f"{during}: {said}: another connection kept the write lock through the busy "
            f"timeout and {BEGIN_RETRIES} retries; nothing was written, the call can be retried"
        )
    return StorageError(f"{during}: {said}")


def reraise(exc: sqlite3.Error, during: str) -> NoReturn:
    translated = storage_error(exc, during)
    if translated is exc:
        raise exc
    raise translated from exc



"""A SQLite file's signal for ``wait``: ``PRAGMA data_version`` on a connection of its own.

SQLite has no notifications.  ``data_version`` changes on a connection
whenever another connection -- of any process -- committed to the file;
reading it is a look at the WAL index in shared memory (about 2 µs, no
disk I/O), so it is checked every :data:`~reliable_flow._store.watch.POLL`
seconds.  It does not say which flow moved: any commit is news.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse

from ...errors import StorageError

__all__ = ["SqliteSignal"]


class SqliteSignal:
    """``data_version`` of the file at ``path``, on a read-only connection opened here."""

    def __init__(self, path: str) -> None:
        # mode=ro: closing it must never checkpoint or remove the -wal file.
        uri = "file:" + urllib.parse.quote(os.fsencode(path)) + "?mode=ro"
        try:
            self._conn = sqlite3.connect(uri, uri=True, isolation_level=None)
            self._version = self._read()
        except sqlite3.Error as exc:
            raise StorageError(f"cannot watch {path}: {exc}") from exc

    def _read(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def fileno(self) -> None:
        return None

    def news(self, flow_id: str) -> bool:
        version = self._read()
        changed, self._version = version != self._version, version
        return changed

    def close(self) -> None:
        self._conn.close()

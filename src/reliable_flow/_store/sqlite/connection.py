"""SQLite connections and transactions: pragmas, locking, file identity and
migrations, for both file kinds.

Every write goes through :meth:`Database.write`, an explicit
``BEGIN IMMEDIATE`` ... ``COMMIT``: the write lock is taken *before* the
guarding reads, so a read-check-write can never interleave with another
writer.  The connection runs with ``isolation_level=None`` so Python never
opens or commits a transaction behind our back.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TypeVar, Union

from ...errors import (
    CommitOutcomeUnknown,
    SchemaTooNew,
    SQLiteTooOld,
    StorageError,
    WrongFile,
    WrongProcess,
)
from .errors import BEGIN_RETRIES, SQLITE_BUSY, SQLITE_LOCKED, primary_code, reraise, storage_error
from .guards import check_outside_transaction, check_thread, opener
from .schema import CONSUMER, PRODUCER, FileKind

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "MIN_SQLITE",
    "Database",
    "PathLike",
    "check_sqlite_version",
]

PathLike = Union[str, "os.PathLike[str]"]
View = TypeVar("View")


def _as_is(conn: sqlite3.Connection) -> sqlite3.Connection:
    return conn
MIN_SQLITE = (3, 24, 0)
# Long enough that six processes queueing for the write lock, each holding it
# for a few fsyncs, never see "database is locked" (see docs/operations.md).
DEFAULT_BUSY_TIMEOUT = 30.0
MAX_BUSY_TIMEOUT = (2**31 - 1) / 1000  # SQLite takes an int of milliseconds

_KINDS_BY_ID = {kind.application_id: kind for kind in (PRODUCER, CONSUMER)}


def check_sqlite_version(version: tuple[int, int, int] = sqlite3.sqlite_version_info) -> None:
    """Raise :class:`SQLiteTooOld` unless the linked SQLite is at least 3.24 (UPSERT)."""
    if tuple(version) < MIN_SQLITE:
        have = ".".join(map(str, version))
        raise SQLiteTooOld(
            f"reliable_flow needs SQLite >= 3.24.0 (for UPSERT); this Python's sqlite3 "
            f"module is linked against SQLite {have}"
        )


class Database:
    """One connection to one reliable_flow file, owned by the opening process.

    ``on_create(conn)`` runs inside the transaction that creates the tables of
    a new file, so a file is never seen half-initialised.  ``check_meta(meta)``
    sees an existing file's ``meta`` table before anything is written
    (migrations included) and returns a problem to refuse the file with.
    """

    def __init__(
        self,
        path: PathLike,
        kind: FileKind,
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        on_create: Callable[[sqlite3.Connection], None] | None = None,
        create: bool = True,
        readonly: bool = False,
        check_meta: Callable[[dict[str, str]], str | None] | None = None,
    ) -> None:
        check_sqlite_version()
        if (
            isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float))
            or not 0 <= busy_timeout <= MAX_BUSY_TIMEOUT  # also refuses NaN
        ):
            raise ValueError(
                f"busy_timeout must be a number of seconds from 0 to {MAX_BUSY_TIMEOUT:g} "
                f"(SQLite's limit), got {busy_timeout!r}"
            )
        self.path = os.fspath(path)
        if not isinstance(self.path, str) or self.path in ("", ":memory:") or self.path.startswith("file:"):
            raise ValueError(f"path must name a file on disk, got {path!r}")
        # Absolute from now on, so that reopen() after an os.chdir() opens this same file.
        self.path = os.path.abspath(self.path)
        self.kind = kind
        self._busy_timeout = float(busy_timeout)
        self._on_create = on_create
        self._check_meta = check_meta
        self._create = create and not readonly
        self._readonly = readonly
        self._conn: sqlite3.Connection | None = None
        self._reopen_on_use = False
        self._pid = os.getpid()
        self._thread = opener()
        self._conn = self._open()

    # -- opening --------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if os.path.isdir(self.path):
            raise WrongFile(f"{self.path} is a directory, not a {self.kind.name} file; give the path of a file")
        if not self._create and not Path(self.path).is_file():
            raise FileNotFoundError(f"no {self.kind.name} file at {self.path}")
        try:
            if self._readonly:
                # mode=ro: a reader must never checkpoint or delete the -wal
                # file, which closing a read-write connection may do.
                # Quote the bytes: a name that is not valid UTF-8 holds surrogates as a str.
                uri = "file:" + urllib.parse.quote(os.fsencode(self.path)) + "?mode=ro"
                conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=self._busy_timeout)
            else:
                conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy_timeout)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self.path}: {exc}") from exc
        try:
            self._identify(conn)
            if self._check_meta is not None and conn.execute("PRAGMA user_version").fetchone()[0] > 0:
                problem = self._check_meta(dict(conn.execute("SELECT key, value FROM meta").fetchall()))
                if problem:
                    raise WrongFile(f"{self.path} {problem}; nothing was changed")
            if self._readonly:
                self._check_current(conn)
                conn.execute("PRAGMA query_only=ON")
                return conn
            self._ensure_wal(conn)
            conn.execute("PRAGMA synchronous=FULL")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _identify(self, conn: sqlite3.Connection) -> None:
        """Refuse, before writing a byte, any file that is not ours or is too new."""
        want = self.kind
        try:
            # One read transaction, so a creator committing in between cannot
            # make a good file look half-made.
            conn.execute("BEGIN")
            try:
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            raise StorageError(f"cannot read {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise WrongFile(f"{self.path} is not a SQLite database, so not a reliable_flow {want.name} file") from exc
        if app_id == want.application_id:
            if version > want.version:
                raise SchemaTooNew(
                    f"{self.path} has {want.name} schema version {version}; this reliable_flow "
                    f"understands up to {want.version}. Upgrade reliable_flow to open it."
                )
            return
        if app_id == 0 and version == 0 and objects == 0:
            if not self._create:
                raise WrongFile(f"{self.path} is an empty database, not a reliable_flow {want.name} file")
            return  # a new, empty file: ours to initialise
        other = _KINDS_BY_ID.get(app_id)
        if other is not None:
            raise WrongFile(f"{self.path} is a reliable_flow {other.name} file, not a {want.name} file")
        raise WrongFile(
            f"{self.path} is a SQLite database but not a reliable_flow {want.name} file "
            f"(application_id={app_id}, {objects} schema objects); refusing to modify it"
        )

    def _ensure_wal(self, conn: sqlite3.Connection) -> None:
        """Switch a new file to WAL, waiting out other openers.

        Changing the journal mode answers SQLITE_BUSY at once, without the
        busy handler, while another connection converts or writes the same
        new file; so wait here, up to the busy timeout, like any other call.
        """
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.001
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                if primary_code(exc) not in (SQLITE_BUSY, SQLITE_LOCKED) or time.monotonic() >= deadline:
                    reraise(exc, f"switching {self.path} to WAL")
                time.sleep(random.uniform(0, pause))
                pause = min(pause * 2, 0.05)
        if str(mode).lower() != "wal":
            raise StorageError(f"{self.path}: could not switch to WAL journal mode (got {mode!r})")

    def _check_current(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != self.kind.version:
            raise WrongFile(
                f"{self.path} has {self.kind.name} schema version {version}, older than "
                f"{self.kind.version}; open it once as a {self.kind.name.capitalize()} to upgrade it"
            )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] >= self.kind.version:
            return
        with _transaction(conn):
            # Re-read under the write lock: another process may have just
            # created or upgraded the file.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version >= self.kind.version:
                return
            if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                raise WrongFile(f"{self.path} gained foreign tables while being opened; refusing it")
            for statements in self.kind.migrations[version:]:
                for statement in statements:
                    conn.execute(statement)
            if version == 0:
                conn.execute(f"PRAGMA application_id = {int(self.kind.application_id)}")
                if self._on_create is not None:
                    self._on_create(conn)
            conn.execute(f"PRAGMA user_version = {int(self.kind.version)}")

    # -- use --------------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, after checking this is still the process that opened it."""
        if os.getpid() != self._pid:
            raise WrongProcess(
                f"this {self.kind.name} object for {self.path} was opened in process {self._pid} "
                f"and is used in process {os.getpid()} (after fork?); call reopen() first"
            )
        check_thread(self._thread, self.kind.name, self.path)
        if self._conn is None:
            if not self._reopen_on_use:
                raise StorageError(f"the {self.kind.name} file {self.path} is closed; call reopen()")
            self._reopen_on_use = False
            self._conn = self._open()
        return self._conn

    def _discard(self) -> None:
        """Drop a connection whose state can no longer be trusted (a failed
        COMMIT, a pragma that could not be restored); the next use reopens."""
        if self._conn is not None:
            try:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the connection is being thrown away; its own error was raised already
            finally:
                self._conn.close()
        self._conn = None
        self._reopen_on_use = True

    def write(self, *, durable: bool = True) -> AbstractContextManager[sqlite3.Connection]:
        """``with db.write() as conn:`` one BEGIN IMMEDIATE transaction.

        ``durable=False`` commits without waiting for fsync (WAL with
        synchronous=NORMAL): the transaction is atomic and is made durable
        by the next durable commit, but a power loss may drop it.  Only for
        hints whose loss is harmless (relay leases, backoff times).
        """
        return self._write(durable, _as_is)

    def write_view(self, view: Callable[[sqlite3.Connection], View], *, durable: bool = True,
                   before_commit: Callable[[View], None] | None = None) -> AbstractContextManager[View]:
        """:meth:`write`, yielding ``view(conn)`` (one context manager, not two);
        ``before_commit(view)`` runs when the block ends normally, inside the
        transaction, just before it commits."""
        return self._write(durable, view, before_commit)

    @contextmanager
    def _write(self, durable: bool, view: Callable[[sqlite3.Connection], View],
               before_commit: Callable[[View], None] | None = None) -> Iterator[View]:
        conn = self.conn
        check_outside_transaction(conn, self.kind.name, self.path)
        try:
            if not durable:
                conn.execute("PRAGMA synchronous=NORMAL")
            with _transaction(conn):
                unit = view(conn)
                yield unit
                if before_commit is not None:
                    before_commit(unit)
        except CommitOutcomeUnknown:
            self._discard()
            raise
        finally:
            if not durable and self._conn is conn:
                try:
                    conn.execute("PRAGMA synchronous=FULL")
                except BaseException:
                    # Never leave a connection that skips fsync behind.
                    self._discard()
                    raise

    def read(self) -> AbstractContextManager[sqlite3.Connection]:
        """A read transaction: every SELECT inside sees the same snapshot."""
        return self._read(_as_is)

    def read_view(self, view: Callable[[sqlite3.Connection], View]) -> AbstractContextManager[View]:
        """:meth:`read`, yielding ``view(conn)``."""
        return self._read(view)

    @contextmanager
    def _read(self, view: Callable[[sqlite3.Connection], View]) -> Iterator[View]:
        conn = self.conn
        check_outside_transaction(conn, self.kind.name, self.path)
        conn.execute("BEGIN")
        try:
            yield view(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta").fetchall())

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        if self._conn is not None and os.getpid() == self._pid:
            check_thread(self._thread, self.kind.name, self.path)
            self._conn.close()
        self._conn = None

    def reopen(self) -> None:
        """Open a fresh connection in this process; use it in a child after fork()."""
        if os.getpid() == self._pid and self._conn is not None:
            check_thread(self._thread, self.kind.name, self.path)
            self._conn.close()
        self._conn = None  # never close a connection inherited across fork()
        self._reopen_on_use = False
        self._pid = os.getpid()
        self._thread = opener()
        self._conn = self._open()


def _begin(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, retried on busy: nothing has run yet, so a retry is safe.

    Each attempt already waits up to the busy timeout inside SQLite; the
    retries add a few jittered pauses for the rare case where SQLite gives
    up early (e.g. a lock held across a WAL checkpoint).
    """
    for attempt in range(BEGIN_RETRIES + 1):
        opened_here = not conn.in_transaction
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except BaseException as exc:
            # An interrupt late in BEGIN can leave the transaction open; but
            # never roll back a transaction that was open before (a batch).
            if opened_here and conn.in_transaction:
                conn.execute("ROLLBACK")
            if not isinstance(exc, sqlite3.Error):
                raise
            busy = primary_code(exc) in (SQLITE_BUSY, SQLITE_LOCKED)
            if not busy or attempt == BEGIN_RETRIES:
                reraise(exc, "BEGIN IMMEDIATE")
        time.sleep(random.uniform(0, 0.05 * 2**attempt))


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    _begin(conn)
    try:
        yield conn
    except BaseException as exc:
        # SQLITE_FULL, IOERR and INTERRUPT end the transaction themselves; a
        # blind ROLLBACK would then fail and hide the real error.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, StorageError):
            translated = storage_error(exc, "write transaction")
            if translated is not exc:
                raise translated from exc
        raise
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        primary_code(exc)  # fills in the result code on Python 3.10
        raise CommitOutcomeUnknown(
            f"COMMIT failed ({getattr(exc, 'sqlite_errorname', type(exc).__name__)}: {exc}); "
            f"the write may or may not be durable. Retrying the same call with the same "
            f"event id is safe: it answers existing / duplicate / the applied state if it was."
        ) from exc

"""PostgreSQL connections and transactions: settings, identity and
migrations of a store's schema, for both kinds.

The connection runs in autocommit mode so the driver never opens or commits
a transaction behind our back; every write is an explicit ``BEGIN`` (READ
COMMITTED) ... ``COMMIT``.  READ COMMITTED holds nothing by itself: each
guarding read of a decision locks what it reads (see the views), so a
read-check-write never interleaves with another writer's.

Durability, checked when a store opens: the server must run with
``fsync=on`` (a server without it can lose committed transactions in a
crash, so the store refuses to open there: :class:`StorageError`); the
session runs with ``synchronous_commit`` at the server's setting unless that
is ``off``, which the session raises to ``on``.  ``write(durable=False)``
alone sets ``synchronous_commit = off`` for its own transaction (``SET
LOCAL``): a crash may drop it, never tear it.

Round trips: every unit of work runs in psycopg's pipeline mode.  ``BEGIN`` (and ``SET LOCAL``) go out with the unit's first
read, an advisory lock with the read after it (still two statements, so the
read's snapshot is taken after the lock was granted: see
:meth:`PgView._lock`), and the writes whose results nobody reads
(:meth:`PgView._send`) with the ``COMMIT``.  A read still waits for its rows,
so every decision is made on what the locked read returned, as before; a
statement that fails before ``COMMIT`` (a taken key, a lock timeout, a
deadlock) aborts the transaction, the server skips the ``COMMIT``, and the
call raises that statement's error exactly as it did when each statement was
its own round trip (never :class:`CommitOutcomeUnknown`): the transaction
status after the pipeline's Sync says which it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from ...errors import CommitOutcomeUnknown, SchemaTooNew, StorageError, WrongFile, WrongProcess
from .errors import connection_lost, storage_error
from .guards import check_outside_transaction, check_thread, opener
from .location import Location, lock_key, shown_from
from .schema import CONSUMER, IDENTITY_TABLE, PRODUCER, PRODUCT, StoreKind

__all__ = ["DEFAULT_LOCK_TIMEOUT", "Conn", "Database"]

Conn = psycopg.Connection[Any]
View = TypeVar("View")


class Pipelined(Protocol):
    """A view that can run in a pipelined unit of work (see :class:`~.base.PgView`)."""

    #: True once the server answered something of this unit (a read, a step's end).
    _answered: bool

    def _use_pipeline(self, pipeline: psycopg.Pipeline) -> None: ...


def first_error(exc: BaseException) -> BaseException:
    """The error a pipeline's failure stands for: psycopg may raise
    ``PipelineAborted`` (a statement skipped after another one failed) with
    the failed statement's own error as its context; that one is the error."""
    seen = exc
    while isinstance(seen, psycopg.errors.PipelineAborted) and isinstance(seen.__context__, psycopg.Error):
        seen = seen.__context__
    return seen
DEFAULT_LOCK_TIMEOUT = 30.0
_KINDS = {kind.name: kind for kind in (PRODUCER, CONSUMER)}
# Connections inherited across fork(): the parent's sockets.  Kept referenced
# so the child never closes (or warns about) them; psycopg never sends a
# Terminate for a connection opened by another process.
_INHERITED: list[Conn] = []


class Database:
    """One connection to one store's schema, owned by the opening process and thread.

    ``on_create(conn)`` runs inside the transaction that creates the schema,
    so a store is never seen half-initialised.  ``check_meta(meta)`` sees an
    existing store's ``meta`` table before anything is written and returns
    a problem to refuse it with.
    """

    def __init__(
        self, location: Location, kind: StoreKind, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        on_create: Callable[[Conn], None] | None = None, create: bool = True, readonly: bool = False,
        check_meta: Callable[[dict[str, str]], str | None] | None = None,
    ) -> None:
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)) or not (
            0 <= lock_timeout <= 2**31 / 1000
        ):
            raise ValueError(f"busy_timeout (PostgreSQL's lock_timeout) must be a number of seconds, got {lock_timeout!r}")
        self._where = location
        self.schema = location.schema
        self.location = location.shown
        self.kind = kind
        self._lock_timeout_ms = int(lock_timeout * 1000)
        self._on_create = on_create
        self._check_meta = check_meta
        self._create = create and not readonly
        self._readonly = readonly
        self._conn: Conn | None = None
        self._in_unit = False  # a unit of work or snapshot is open (pipeline mode hides it from libpq)
        self._reopen_on_use = False
        self._pid = os.getpid()
        self._thread = opener()
        self._conn = self._open()

    # -- opening --------------------------------------------------------------

    def _open(self) -> Conn:
        try:
            conn = self._where.connect()
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {self.location or 'the PostgreSQL server'}: {exc}") from exc
        if not self.location:
            self.location = shown_from(conn, self.schema)
        try:
            self._settings(conn)
            version = self._identify(conn)
            if self._check_meta is not None and version > 0:
                meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
                problem = self._check_meta(meta)
                if problem:
                    raise WrongFile(f"{self.location} {problem}; nothing was changed")
            if self._readonly:
                if version != self.kind.version:
                    raise WrongFile(
                        f"{self.location} has {self.kind.name} schema version {version}, older than "
                        f"{self.kind.version}; open it once as a {self.kind.name.capitalize()} to upgrade it"
                    )
                conn.execute("SET default_transaction_read_only = on")
            elif version < self.kind.version:
                self._migrate(conn)
        except BaseException as exc:
            # Classify while the connection is still open: once given back
            # (closed), any SQL error would read as a lost connection.
            translated = storage_error(exc, f"opening {self.location}", conn) if isinstance(
                exc, psycopg.Error) else exc
            self._where.give_back(conn)
            if translated is not exc:
                raise translated from exc
            raise
        return conn

    def _settings(self, conn: Conn) -> None:
        search_path = sql.Identifier(self.schema).as_string(conn)
        fsync, synchronous = conn.execute(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit')"
        ).fetchone() or ("on", "on")
        if fsync != "on":
            raise StorageError(
                f"{self.location}: the server runs with fsync={fsync}, so a crash can lose committed "
                f"transactions; reliable_flow promises durable commits and refuses such a server"
            )
        conn.execute(
            "SELECT set_config('search_path', %s, false), set_config('lock_timeout', %s, false), "
            "set_config('synchronous_commit', %s, false)",
            (search_path, f"{self._lock_timeout_ms}ms", "on" if synchronous == "off" else synchronous),
        )

    def _identify(self, conn: Conn) -> int:
        """The schema's version (0: absent or empty, ours to create); refuses
        anything that is not ours or is too new, before writing a byte."""
        want = self.kind
        row = conn.execute(
            "SELECT n.oid, (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid), "
            "to_regclass(quote_ident(n.nspname) || '.' || %s) IS NOT NULL "
            "FROM pg_namespace n WHERE n.nspname = %s", (IDENTITY_TABLE, self.schema),
        ).fetchone()
        if row is None:
            if not self._create:
                raise WrongFile(f"no {want.name} store at {self.location} (the schema does not exist)")
            return 0
        _, objects, has_identity = row
        if not has_identity:
            if objects == 0:
                if not self._create:
                    raise WrongFile(f"{self.location} is an empty schema, not a reliable_flow {want.name} store")
                return 0
            raise WrongFile(
                f"{self.location} is a PostgreSQL schema but not a reliable_flow {want.name} store "
                f"({objects} objects, no {IDENTITY_TABLE} table); refusing to modify it"
            )
        columns = {str(name) for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(quote_ident(%s) || '.' || %s) "
            "AND attnum > 0 AND NOT attisdropped", (self.schema, IDENTITY_TABLE),
        ).fetchall()}
        missing = sorted({"product", "kind", "version"} - columns)
        if missing:
            raise WrongFile(
                f"{self.location} has a {IDENTITY_TABLE} table that is not reliable_flow's (no column "
                f"{', '.join(missing)}); refusing to modify it"
            )
        # As text, whatever the columns' types: a foreign table is refused, never an error.
        ident = conn.execute(
            sql.SQL("SELECT product::text, kind::text, version::text FROM {}.{}").format(
                sql.Identifier(self.schema), sql.Identifier(IDENTITY_TABLE))
        ).fetchone()
        if ident is None:
            raise WrongFile(f"{self.location} has an empty {IDENTITY_TABLE} table; refusing to modify it")
        product, kind, text_version = ident
        if product != PRODUCT:
            raise WrongFile(f"{self.location} belongs to {product!r}, not reliable_flow; refusing to modify it")
        if kind != want.name:
            other = _KINDS.get(kind)
            if other is not None:
                raise WrongFile(f"{self.location} is a reliable_flow {other.name} store, not a {want.name} store")
            raise WrongFile(f"{self.location} is a reliable_flow store of unknown kind {kind!r}")
        if text_version is None or not text_version.isdigit():
            raise WrongFile(
                f"{self.location} has a {IDENTITY_TABLE} table with version {text_version!r}, not a "
                f"reliable_flow schema version; refusing to modify it"
            )
        version = int(text_version)
        if version > want.version:
            raise SchemaTooNew(
                f"{self.location} has {want.name} schema version {version}; this reliable_flow "
                f"understands up to {want.version}. Upgrade reliable_flow to open it."
            )
        return int(version)

    def _migrate(self, conn: Conn) -> None:
        """Create or upgrade the schema; two processes opening one fresh
        location at once queue on an advisory lock, and the second finds it made."""
        conn.execute("BEGIN")
        try:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("reliable_flow", self.schema, "create"),))
            version = self._identify(conn)
            if version < self.kind.version:
                if version == 0:
                    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
                for statements in self.kind.migrations[version:]:
                    for statement in statements:
                        conn.execute(statement)
                if version == 0:
                    conn.execute(
                        "INSERT INTO rf_identity(product, kind, version) VALUES (%s, %s, %s)",
                        (PRODUCT, self.kind.name, self.kind.version),
                    )
                    if self._on_create is not None:
                        self._on_create(conn)
                else:
                    conn.execute("UPDATE rf_identity SET version = %s", (self.kind.version,))
        except BaseException:
            if not conn.closed:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # -- use --------------------------------------------------------------------

    @property
    def conn(self) -> Conn:
        """The connection, after checking this is still the process and thread that opened it."""
        if os.getpid() != self._pid:
            raise WrongProcess(
                f"this {self.kind.name} object for {self.location} was opened in process {self._pid} "
                f"and is used in process {os.getpid()} (after fork?); call reopen() first"
            )
        check_thread(self._thread, self.kind.name, self.location)
        if self._conn is not None and self._conn.closed:
            # Lost outside a unit of work (a read outside any transaction, or
            # the server went away between calls): nothing was in flight on
            # it, so the call goes on with a new connection.
            self._conn = None
            self._reopen_on_use = True
        if self._conn is None:
            if not self._reopen_on_use:
                raise StorageError(f"the {self.kind.name} store {self.location} is closed; call reopen()")
            self._conn = self._open()  # may fail (the server is down): the next call tries again
            self._reopen_on_use = False
        return self._conn

    def _discard(self) -> None:
        """Drop a connection that can no longer be trusted; the next use reopens."""
        if self._conn is not None:
            self._where.give_back(self._conn)
        self._conn = None
        self._reopen_on_use = True

    @property
    def in_unit(self) -> bool:
        """True while a unit of work or snapshot of this object is open."""
        return self._in_unit

    def write_view(self, view: Callable[[Conn, str, bool], View], *,
                   durable: bool = True) -> AbstractContextManager[View]:
        """``with db.write_view(view) as unit:`` one READ COMMITTED transaction,
        in pipeline mode (see the module's docstring; the view is :class:`Pipelined`).

        ``durable=False`` commits with ``synchronous_commit = off`` (this
        transaction only): atomic, durable once the WAL writer flushes it
        (well under a second), but a server crash may drop it.  Only for
        hints whose loss is harmless (relay leases, backoff times, marks).
        """
        return self._unit(self._pipelined_steps, view, durable)

    @contextmanager
    def _unit(self, steps: Callable[..., Iterator[View]], *args: Any) -> Iterator[View]:
        """One unit of work or snapshot on this object's connection, never inside another."""
        conn = self.conn
        check_outside_transaction(conn, self.kind.name, self.location, self._in_unit)
        self._in_unit = True
        try:
            yield from steps(conn, *args)
        finally:
            self._in_unit = False

    def _end_failed(self, conn: Conn, exc: BaseException, during: str) -> None:
        """Roll back after ``exc``; translate a storage fault (raising it), or
        let ``exc`` itself propagate (the caller re-raises it)."""
        if conn.closed or (isinstance(exc, psycopg.Error) and connection_lost(exc, conn)):
            self._discard()
        elif conn.info.transaction_status != TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._discard()
        if isinstance(exc, psycopg.Error):
            translated = storage_error(exc, during, conn)
            if translated is not exc:
                raise translated from exc

    def _pipelined_steps(self, conn: Conn, view: Callable[[Conn, str, bool], View], durable: bool
                         ) -> Iterator[View]:
        pipeline = conn.pipeline()
        try:
            pipe = pipeline.__enter__()
        except BaseException as exc:
            self._end_failed(conn, exc, "BEGIN")
            raise
        try:
            # Sent with the unit's first read (one round trip), never alone.
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            if not durable:
                conn.execute("SET LOCAL synchronous_commit = off")
            unit = view(conn, self.schema, True)
            attach: Pipelined = unit  # type: ignore[assignment]
            attach._use_pipeline(pipe)
        except BaseException as exc:
            self._leave_pipeline(conn, pipeline)
            self._end_failed(conn, exc, "BEGIN")
            raise
        try:
            yield unit
            if not attach._answered:
                # Nothing of this unit has reached the server and come back
                # yet (a unit of writes only): wait for them before sending
                # COMMIT, so that a connection lost since the last call is a
                # StorageError with nothing written, never a COMMIT in doubt.
                pipe.sync()
        except BaseException as exc:
            self._leave_pipeline(conn, pipeline)
            failed_in_unit = first_error(exc)  # the statement that failed, not one skipped after it
            self._end_failed(conn, failed_in_unit, "write transaction")
            if failed_in_unit is exc:
                raise
            raise failed_in_unit from None
        failed: BaseException | None = None
        commit: psycopg.Cursor[Any] | None = None
        try:
            # COMMIT goes out with the writes still in flight, and the
            # pipeline's Sync waits for every answer: one round trip.
            commit = conn.cursor()
            commit.execute("COMMIT")
        except psycopg.Error as exc:  # an earlier statement's error, seen while sending
            failed = exc
        try:
            pipeline.__exit__(None, None, None)
        except psycopg.Error as exc:
            failed = failed or exc
        if failed is None:
            return
        if commit is not None and commit.pgresult is not None and not conn.closed:
            return  # the server answered the COMMIT itself: committed
        failed = first_error(failed)
        status = TransactionStatus.UNKNOWN if conn.closed else conn.info.transaction_status
        if status in (TransactionStatus.INERROR, TransactionStatus.INTRANS):
            # A statement before COMMIT failed (a taken key, a lock timeout, a
            # deadlock), so the server skipped the COMMIT: nothing was
            # written, and the call raises that statement's error, as when
            # each statement was its own round trip.
            self._end_failed(conn, failed, "write transaction")
            raise failed
        # The connection failed in the round trip that carried the COMMIT:
        # whether the server ran it is unknown.
        self._discard()
        raise CommitOutcomeUnknown(
            f"COMMIT failed ({type(failed).__name__}, SQLSTATE {getattr(failed, 'sqlstate', None) or 'none'}: "
            f"{failed}); the write may or may not be durable. Retrying the same call with the same event id "
            f"is safe: it answers existing / duplicate / the applied state if it was."
        ) from failed

    @staticmethod
    def _leave_pipeline(conn: Conn, pipeline: AbstractContextManager[Any]) -> None:
        """Leave pipeline mode after a failure, every answer read (their
        errors are the failure's own consequences: the caller handles it)."""
        try:
            pipeline.__exit__(None, None, None)
        except psycopg.Error:
            pass

    def read_view(self, view: Callable[[Conn, str, bool], View]) -> AbstractContextManager[View]:
        """A read-only REPEATABLE READ transaction: every read inside sees one snapshot."""
        return self._unit(self._read_steps, view)

    def _read_steps(self, conn: Conn, view: Callable[[Conn, str, bool], View]) -> Iterator[View]:
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield view(conn, self.schema, False)
        except BaseException as exc:
            self._end_failed(conn, exc, "read transaction")
            raise
        if conn.info.transaction_status != TransactionStatus.IDLE:
            conn.execute("ROLLBACK")

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        if self._conn is not None and os.getpid() == self._pid:
            check_thread(self._thread, self.kind.name, self.location)
            self._where.give_back(self._conn)
        elif self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None

    def reopen(self) -> None:
        """Open a fresh connection in this process; use it in a child after fork()."""
        if os.getpid() == self._pid and self._conn is not None:
            check_thread(self._thread, self.kind.name, self.location)
            self._where.give_back(self._conn)
        elif self._conn is not None:
            _INHERITED.append(self._conn)  # never close a connection inherited across fork()
        self._conn = None
        self._reopen_on_use = True  # if this open fails, the next use tries again
        self._pid = os.getpid()
        self._thread = opener()
        self._conn = self._open()
        self._reopen_on_use = False

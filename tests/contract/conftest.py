"""Engines under the storage contract.

Everything engine-specific lives here, in :data:`ENGINES`: how to make one
engine's stores, keyed by the engine names of the one list of engines,
``tests/engine_reads.ENGINES`` (a new engine adds its name there and its
record here, and every contract test runs against it).
The tests themselves only use the store interface
(:mod:`reliable_flow._store.outbox`, :mod:`reliable_flow._store.inbox`).
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engine_reads import ENGINES as ENGINE_PARAMS
from reliable_flow._store import InboxStore, OutboxStore
from reliable_flow._store.sqlite import SqliteInboxStore, SqliteOutboxStore

PROTOCOL = "contract-protocol"


@dataclass(frozen=True)
class Engine:
    """How to make stores of one engine.

    ``new_location(tmp_path, label)`` names a fresh, empty place for a store;
    ``open_outbox(location, protocol)`` / ``open_inbox(location, protocol,
    name)`` open a store object there (creating it when it is empty).
    ``integrity_error`` is what the engine raises for a taken key.
    """

    new_location: Callable[[Path, str], str]
    open_outbox: Callable[[str, str], OutboxStore]
    open_inbox: Callable[[str, str, str], InboxStore]
    integrity_error: type[Exception]
    #: How the application's own SQL (``user_execute``) writes a placeholder.
    placeholder: str = "?"
    #: Marks the engine's tests carry (``postgres``: needs the private server).
    marks: tuple[str, ...] = ()


def _sqlite_location(tmp_path: Path, label: str) -> str:
    return str(tmp_path / f"{label}.db")


def _pg() -> Any:
    import pg_cluster  # tests/pg_cluster.py: the session's PostgreSQL server

    return pg_cluster


def _pg_stores() -> Any:
    from reliable_flow._store import postgres

    return postgres


try:  # psycopg is an optional extra; without it the PostgreSQL tests skip (or fail under CI)
    from psycopg.errors import UniqueViolation as _UniqueViolation
except ImportError:  # pragma: no cover - only without the postgres extra
    class _UniqueViolation(Exception):  # type: ignore[no-redef]
        """Stands in when psycopg is not installed."""


_RECORDS: dict[str, Engine] = {
    "sqlite": Engine(
        new_location=_sqlite_location,
        open_outbox=lambda location, protocol: SqliteOutboxStore(location, protocol),
        open_inbox=lambda location, protocol, name: SqliteInboxStore(location, protocol, name=name),
        integrity_error=sqlite3.IntegrityError,
    ),
    "postgres": Engine(
        # A fresh schema in the session's private server (started on first use).
        new_location=lambda tmp_path, label: _pg().pg_location(label),
        open_outbox=lambda location, protocol: _pg_stores().PgOutboxStore(location, protocol),
        open_inbox=lambda location, protocol, name: _pg_stores().PgInboxStore(location, protocol, name=name),
        integrity_error=_UniqueViolation,
        placeholder="%s",
        marks=("postgres",),
    ),
}

#: The engine names, in the order (and with the marks) of ``engine_reads.ENGINES``.
ENGINE_NAMES: list[str] = [p if isinstance(p, str) else str(p.values[0]) for p in ENGINE_PARAMS]
assert sorted(ENGINE_NAMES) == sorted(_RECORDS), "tests/engine_reads.ENGINES and the contract's records disagree"
ENGINES: dict[str, Engine] = {name: _RECORDS[name] for name in ENGINE_NAMES}


class StoreFactory:
    """Opens stores for one test and closes them after it.

    ``factory()`` opens a store at a fresh location; ``factory(same_as=s)``
    opens a second, independent store object on ``s``'s location.
    ``factory.release(s)`` closes ``s`` now (e.g. in the thread that used it).
    """

    def __init__(self, opener: Callable[..., Any], new_location: Callable[[str], str]) -> None:
        self._opener = opener
        self._new_location = new_location
        self._open: list[Any] = []
        self._labels = itertools.count(1)

    def __call__(self, *, same_as: Any = None, **kwargs: Any) -> Any:
        if same_as is not None:
            location = same_as.location
        else:
            location = self._new_location(f"store{next(self._labels)}")
        store = self._opener(location, **kwargs)
        self._open.append(store)
        return store

    def release(self, store: Any) -> None:
        self._open.remove(store)
        store.close()

    def close_all(self) -> None:
        while self._open:
            self._open.pop().close()


def _named(engine: Engine, tmp_path: Path, side: str, label: str) -> str:
    return engine.new_location(tmp_path, f"{side}-{label}")


@pytest.fixture(params=ENGINE_PARAMS)
def engine(request: pytest.FixtureRequest) -> str:
    if "postgres" in ENGINES[request.param].marks:
        _pg().get_pg_cluster()  # skips (or fails under CI) when no server can start
    return str(request.param)


@pytest.fixture
def placeholder(engine_spec: Engine) -> str:
    """How the engine's SQL writes a parameter (``?`` / ``%s``)."""
    return engine_spec.placeholder


@pytest.fixture
def engine_spec(engine: str) -> Engine:
    return ENGINES[engine]


@pytest.fixture
def integrity_error(engine_spec: Engine) -> type[Exception]:
    """The engine's error for a taken key (an ``Exception`` subclass)."""
    return engine_spec.integrity_error


@pytest.fixture
def outbox_store(engine_spec: Engine, tmp_path: Path) -> Iterator[StoreFactory]:
    """``outbox_store(protocol=...)`` -> a fresh :class:`OutboxStore`."""

    def open_outbox(location: str, protocol: str = PROTOCOL) -> OutboxStore:
        return engine_spec.open_outbox(location, protocol)

    factory = StoreFactory(open_outbox, functools.partial(_named, engine_spec, tmp_path, "out"))
    yield factory
    factory.close_all()


@pytest.fixture
def inbox_store(engine_spec: Engine, tmp_path: Path) -> Iterator[StoreFactory]:
    """``inbox_store(protocol=..., name=...)`` -> a fresh :class:`InboxStore`."""

    def open_inbox(location: str, protocol: str = PROTOCOL, name: str = "consumer-a") -> InboxStore:
        return engine_spec.open_inbox(location, protocol, name)

    factory = StoreFactory(open_inbox, functools.partial(_named, engine_spec, tmp_path, "in"))
    yield factory
    factory.close_all()


@pytest.fixture
def outbox(outbox_store: StoreFactory) -> OutboxStore:
    """One fresh outbox store."""
    return outbox_store()


@pytest.fixture
def inbox(inbox_store: StoreFactory) -> InboxStore:
    """One fresh inbox store."""
    return inbox_store()

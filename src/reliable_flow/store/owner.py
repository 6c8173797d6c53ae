"""The lifecycle every object that owns a store shares (``Producer``, ``Consumer``)."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

__all__ = ["StoreOwner"]

class _Closable(Protocol):
    @property
    def location(self) -> str: ...

    def close(self) -> None: ...

    def reopen(self) -> None: ...


Owner = TypeVar("Owner", bound="StoreOwner")  # type: ignore[type-arg]
Store = TypeVar("Store", bound=_Closable)


class StoreOwner(Generic[Store]):
    """Owns one store: :meth:`close`, :meth:`reopen` after ``fork()``, and
    use as a context manager that closes it."""

    _store: Store

    @property
    def path(self) -> str:
        """Where the store lives: the file's path, or the PostgreSQL location (password masked)."""
        return self._store.location

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        self._store.close()

    def reopen(self) -> None:
        """Open a new connection in the current process (use after fork())."""
        self._store.reopen()

    def __enter__(self: Owner) -> Owner:  # noqa: PYI019 - Self needs Python 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The SQLite engine: each side in its own file, all of its SQL in this folder."""

from __future__ import annotations

from .inbox import SqliteInboxStore
from .outbox import SqliteOutboxStore

__all__ = ["SqliteInboxStore", "SqliteOutboxStore"]

"""The repositories, written once over an engine's dialect.

An engine supplies a :class:`~.dialect.Dialect` (how one of its statements
runs, its advisory and row locks) and one table of its statement texts:
the shared ones (:mod:`.statements`) rendered for it, and its own where the
SQL truly differs;
the outbox, inbox and effect outbox methods that do the same on every
engine are written here, once.  What an engine still writes itself is what
truly differs: its reads ahead and batching (SQLite), its locks and
pipelined round trips (PostgreSQL), set-based statements, pruning, the
application's SQL, and nested steps.
"""

from __future__ import annotations

from .dialect import Dialect
from .inbox import InboxRepository
from .outbox import OutboxRepository

__all__ = ["Dialect", "InboxRepository", "OutboxRepository"]

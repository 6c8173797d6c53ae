"""Storage: the contract every engine fulfils, and the engines.

:mod:`.outbox` and :mod:`.inbox` define what the decision code may ask of
a producer's and a consumer's storage; :mod:`.sqlite` is the engine that
keeps each in one SQLite file.  A new engine is a new subpackage that
implements the same two protocols and passes ``tests/contract/``.
"""

from __future__ import annotations

from .inbox import InboxReads, InboxStore, InboxUnit
from .outbox import OutboxReads, OutboxStore, OutboxUnit
from .records import FlowState, NextRow, StoredEvent, StoredRow

__all__ = [
    "FlowState",
    "InboxReads",
    "InboxStore",
    "InboxUnit",
    "NextRow",
    "OutboxReads",
    "OutboxStore",
    "OutboxUnit",
    "StoredEvent",
    "StoredRow",
]

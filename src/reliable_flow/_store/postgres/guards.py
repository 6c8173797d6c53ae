"""The PostgreSQL side of the connection checks (:mod:`reliable_flow._store.guards`)."""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus

from ..guards import Opener, check_thread, opener, refuse_nested

__all__ = ["Opener", "check_outside_transaction", "check_thread", "opener"]


def check_outside_transaction(conn: psycopg.Connection[tuple[object, ...]], kind: str, location: str) -> None:
    """Refuse to open a transaction inside one this object already has open."""
    refuse_nested(conn.info.transaction_status != TransactionStatus.IDLE, kind, location)

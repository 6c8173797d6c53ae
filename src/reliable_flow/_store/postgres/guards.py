"""The PostgreSQL side of the connection checks (:mod:`reliable_flow._store.guards`)."""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus

from ..guards import Opener, check_thread, opener, refuse_nested

__all__ = ["Opener", "check_outside_transaction", "check_thread", "opener"]


def check_outside_transaction(
    conn: psycopg.Connection[tuple[object, ...]], kind: str, location: str, in_unit: bool = False,
) -> None:
    """Refuse to open a transaction inside one this object already has open.

    ``in_unit``: the object's own record that a unit is open.  In pipeline
    mode libpq may still report IDLE inside a transaction (its status comes
    from the last Sync's answer, and a pipelined unit syncs only at its end),
    so the status alone would let a nested call through."""
    refuse_nested(in_unit or conn.info.transaction_status != TransactionStatus.IDLE, kind, location)

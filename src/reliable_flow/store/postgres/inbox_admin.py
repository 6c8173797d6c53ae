"""The consumer's inbox as an operator sees and repairs it, on PostgreSQL:
rows in full, skips and replacements, and their record.

A mixin of :class:`~reliable_flow.store.postgres.inbox.PgInbox`.
"""

from __future__ import annotations

from typing import Any

from ...operations import InboxAction, InboxRow
from ...statuses import BlockReason, InboxState
from .base import PgView

__all__ = ["PgInboxAdmin"]

_SKIPPED = InboxState.SKIPPED.value
_REPLACED = InboxState.REPLACED.value
_ROW = "SELECT event_id, flow_id, seq, state, reason, detail, received_at, blocked_at FROM inbox "
_ACTION = (
    "SELECT at, event_id, flow_id, seq, action, previous_state, actor, reason, replacement_event_id "
    "FROM consumer_action "
)


def _row(r: Any) -> InboxRow:
    return InboxRow(r[0], r[1], int(r[2]), InboxState(r[3]), None if r[4] is None else BlockReason(r[4]), *r[5:])


def _action(r: Any) -> InboxAction:
    return InboxAction(r[0], r[1], r[2], int(r[3]), r[4], InboxState(r[5]), r[6], r[7], r[8])


class PgInboxAdmin(PgView):
    """Full inbox rows, and the operator's skips and replacements."""

    def body_of(self, event_id: str) -> str | None:
        """In a unit, the event id is locked first: a receive racing another
        receive of the same event waits, then finds it (``duplicate``)."""
        self._lock("event", event_id)
        row = self._one("SELECT body FROM inbox WHERE event_id = %s", (event_id,))
        return None if row is None else str(row[0])

    def inbox_rows(self, flow_id: str, from_seq: int = 1) -> list[InboxRow]:
        return [_row(r) for r in self._rows(
            _ROW + "WHERE flow_id = %s AND seq >= %s ORDER BY seq, live NULLS FIRST", (flow_id, from_seq)
        )]

    def inbox_row(self, event_id: str) -> InboxRow | None:
        found = self._one(_ROW + "WHERE event_id = %s", (event_id,))
        return None if found is None else _row(found)

    def set_skipped(self, event_id: str) -> None:
        self._run(f"UPDATE inbox SET state = '{_SKIPPED}' WHERE event_id = %s", (event_id,))

    def set_replaced(self, event_id: str) -> None:
        """The row gives up its (flow, seq) slot: live NULL, which the CHECK ties to 'replaced'."""
        self._run(f"UPDATE inbox SET state = '{_REPLACED}', live = NULL WHERE event_id = %s", (event_id,))

    def record_inbox_action(self, action: InboxAction) -> None:
        self._run(
            "INSERT INTO consumer_action(at, event_id, flow_id, seq, action, previous_state, actor, reason, "
            "replacement_event_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (action.at, action.event_id, action.flow_id, action.seq, action.action, action.previous_state.value,
             action.actor, action.reason, action.replacement_event_id),
        )

    def inbox_actions(self, event_id: str | None = None) -> list[InboxAction]:
        if event_id is None:
            return [_action(r) for r in self._rows(_ACTION + "ORDER BY id")]
        return [_action(r) for r in self._rows(
            _ACTION + "WHERE event_id = %s OR replacement_event_id = %s ORDER BY id", (event_id, event_id)
        )]

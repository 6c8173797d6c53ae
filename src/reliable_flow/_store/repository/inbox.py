"""The consumer side's methods that every engine runs the same way, written
once: the inbox as receive, apply and an operator read and repair it, the
effect outbox, and the application's schema versions.

Each picks its statement from the engine's table (its ``inbox_sql``, an
:class:`~.statements.InboxSql` with the shared texts) and runs it through the engine's
:class:`~.dialect.Dialect`.  On PostgreSQL ``holder`` locks the flow,
``unapplied`` the schema's room, ``app_version`` the application's schema
and ``lock_effect_names`` each name (advisory, until the unit ends); on
SQLite a unit holds the file's write lock and these take nothing more.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

from ..._envelope import Envelope
from ...records import AppliedEvent, EffectTransition, OperatorAction, ScheduledEffect
from ...statuses import ActionTarget, BlockReason, EffectState, InboxState
from .. import rows
from ..effects import NewEffect
from ..records import InboxCounts, NextRow, PruneStep, StoredRow, WaitingSummary
from ..shared import effect_changes
from .schedules import ScheduleRepository
from .statements import InboxSql

__all__ = ["InboxRepository"]


class InboxRepository(ScheduleRepository):
    """The consumer side's reads and writes that need no engine of their own."""

    _SQL: ClassVar[type[InboxSql]]

    def meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._rows(self._SQL.META)}

    def projection(self, flow_id: str) -> dict[str, Any] | None:
        row = self._one(self._SQL.PROJECTION, (flow_id,))
        return None if row is None else rows.projection(row)

    def last_seq(self, flow_id: str) -> int:
        row = self._one(self._SQL.LAST_SEQ, (flow_id,))
        return int(row[0]) if row else 0

    def effects(self, flow_id: str) -> list[AppliedEvent]:
        return [rows.effect_record(r) for r in self._rows(self._SQL.EFFECT_RECORDS, (flow_id,))]

    def flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows(self._SQL.INBOX_FLOWS)]

    def projected_flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows(self._SQL.PROJECTED_FLOWS)]

    def open_flows(self) -> list[str]:
        return [str(r[0]) for r in self._rows(self._SQL.OPEN_FLOWS)]

    def inbox_counts(self) -> InboxCounts:
        """Counts for metrics; call inside a read transaction for one snapshot."""
        groups = self._rows(self._SQL.INBOX_COUNTS)
        gaps = self._one(self._SQL.GAPS)
        return rows.inbox_counts(groups, 0 if gaps is None else int(gaps[0]))

    def inbox_rows(self, flow_id: str, from_seq: int = 1) -> list[StoredRow]:
        return [rows.stored_row(r) for r in self._rows(self._SQL.ROWS_OF_FLOW, (flow_id, from_seq))]

    def inbox_row(self, event_id: str) -> StoredRow | None:
        found = self._one(self._SQL.ROW_OF_EVENT, (event_id,))
        return None if found is None else rows.stored_row(found)

    def holder(self, flow_id: str, seq: int) -> str | None:
        """The event id holding (flow, seq), if any (a replaced row does not)."""
        self._lock("flow", flow_id)
        row = self._one(self._SQL.HOLDER, (flow_id, seq))
        return None if row is None else str(row[0])

    def unapplied(self, cap: int) -> int:
        """Rows still waiting (pending or blocked), counted up to ``cap``."""
        self._lock("room")
        row = self._one(self._SQL.UNAPPLIED, (cap,))
        return 0 if row is None else int(row[0])

    def insert(self, env: Envelope, received_at: float | None = None) -> None:
        self._run(self._SQL.INSERT, (env.event_id, env.flow_id, env.seq, env.body, received_at))

    def block(self, event_id: str, reason: BlockReason, detail: str | None = None,
              now: float | None = None) -> None:
        self._send(self._SQL.BLOCK, (now, reason.value, detail, event_id, reason.value, detail))

    def put_projection(self, flow_id: str, state: str, seq: int, data: str, view: str) -> None:
        self._send(self._SQL.UPSERT_PROJECTION, (flow_id, state, seq, data, view))

    def record_applied(self, event_id: str, flow_id: str, seq: int, kind: str) -> None:
        """The event's one effect record, and its inbox row marked applied."""
        self._send(self._SQL.RECORD_EFFECT, (event_id, flow_id, seq, kind))
        self._send(self._SQL.MARK_APPLIED, (event_id,))

    def newest_waiting(self, flow_id: str) -> NextRow | None:
        row = self._one(self._SQL.NEWEST_WAITING, (flow_id,))
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]))

    def oldest_pending(self, flow_id: str) -> NextRow | None:
        row = self._one(self._SQL.OLDEST_PENDING, (flow_id,))
        return None if row is None else (int(row[0]), str(row[1]), str(row[2]))

    def supersede(self, flow_id: str, below: int, detail: str) -> int:
        return self._run(self._SQL.SUPERSEDE, (detail, flow_id, below))

    def set_skipped(self, event_id: str) -> None:
        self._run(self._SQL.SET_SKIPPED, (event_id,))

    def set_replaced(self, event_id: str) -> None:
        """The row gives up its (flow, seq) slot: live NULL, which the CHECK ties to 'replaced'."""
        self._run(self._SQL.SET_REPLACED, (event_id,))

    def record_action(self, action: OperatorAction) -> None:
        if action.target is ActionTarget.INBOX:
            self._run(self._SQL.RECORD_INBOX_ACTION, (
                action.at, action.event_id, action.flow_id, action.seq, action.action,
                InboxState(action.previous_state).value, action.actor, action.reason, action.replacement_event_id,
            ))
        elif action.target is ActionTarget.EFFECT:
            self._run(self._SQL.RECORD_EFFECT_ACTION,
                      (action.at, action.key, action.action, action.actor, action.reason))
        elif action.target is ActionTarget.RETENTION:
            self._record_retention(action)
        elif action.target is ActionTarget.SCHEDULE:
            self._record_schedule_action(action)
        else:
            raise ValueError(f"a consumer records inbox, effect, retention and schedule actions, "
                             f"not {action.target.value!r} ones")

    def inbox_actions(self, event_id: str | None = None) -> list[OperatorAction]:
        found = (self._rows(self._SQL.INBOX_ACTIONS) if event_id is None
                 else self._rows(self._SQL.INBOX_ACTIONS_OF_EVENT, (event_id, event_id)))
        return [rows.inbox_action(r) for r in found]

    def add_effect(self, new: NewEffect) -> ScheduledEffect | None:
        stored = self._run(self._SQL.ADD_EFFECT, (
            new.key, new.name, new.payload, new.event_id, new.flow_id, new.seq, new.meta, int(new.ordered),
            new.deadline, new.version, None if new.fed is None else int(new.fed), new.created_at, new.created_at,
            0.0 if new.due_at is None else new.due_at,  # 0: due at once (the column's default)
        ))
        return None if stored else self.effect(new.key)

    def effect(self, key: str) -> ScheduledEffect | None:
        row = self._one(self._SQL.EFFECT, (key,))
        return None if row is None else rows.effect(row)

    def effect_list(
        self, state: EffectState | None = None, flow_id: str | None = None, limit: int | None = None, *,
        name: str | None = None, after: str | None = None,
    ) -> list[ScheduledEffect]:
        where: list[str] = []
        params: list[Any] = []
        for column, value in (("state", None if state is None else EffectState(state).value), ("flow_id", flow_id),
                              ("name", name)):
            if value is not None:
                where.append(f"{column} = {self._SQL.PARAM}")
                params.append(value)
        if after is not None:
            where.append(self._SQL.EFFECT_AFTER)
            params.append(after)
        sql = self._SQL.EFFECT_LIST.format(where=("WHERE " + " AND ".join(where)) if where else "")
        if limit is not None:
            sql, params = f"{sql} LIMIT {self._SQL.PARAM}", [*params, limit]
        return [rows.effect(r) for r in self._rows(sql, params)]

    def effect_counts(self, cap: int | None = None) -> dict[str, int]:
        if cap is None:
            return {str(s): int(n) for s, n in self._rows(self._SQL.EFFECT_COUNTS)}
        counted = {s.value: self._one(self._SQL.EFFECTS_UP_TO, (s.value, cap)) for s in EffectState}
        return {s: int(row[0]) for s, row in counted.items() if row is not None and row[0]}

    def attention_effects(self, now: float, unfed_before: float, limit: int) -> list[ScheduledEffect]:
        params = (limit, limit, limit, now, limit, unfed_before, limit, limit)
        return [rows.effect(r) for r in self._rows(self._SQL.ATTENTION_EFFECTS, params)]

    # -- the console's bounded reads of the inbox (issue 31, item 5)

    def waiting_flows(self, received_before: float, after: str, limit: int) -> list[str]:
        return [str(r[0]) for r in self._rows(self._SQL.WAITING_FLOWS, (after, received_before, limit))]

    def flows_by_correlation(self, correlation_id: str, limit: int) -> list[str]:
        return [str(r[0]) for r in self._rows(self._SQL.FLOWS_BY_CORRELATION, (correlation_id, limit))]

    def waiting_summary(self, cap: int) -> WaitingSummary:
        found = {str(s): (int(n), None if t is None else float(t))
                 for s, n, t in self._rows(self._SQL.WAITING_SUMMARY, (cap,))}
        times = [t for _, t in found.values() if t is not None]
        return WaitingSummary(found.get(InboxState.PENDING.value, (0, None))[0],
                              found.get(InboxState.BLOCKED.value, (0, None))[0], min(times) if times else None)

    def applies_recorded(self) -> int:
        row = self._one(self._SQL.APPLIES)
        return 0 if row is None or row[0] is None else int(row[0])

    def effect_timers(self, now: float) -> dict[str, tuple[int, float]]:
        return {str(n): (int(count), float(due)) for n, count, due in self._rows(self._SQL.EFFECT_TIMERS, (now,))}

    def effect_actions(self, key: str | None = None) -> list[OperatorAction]:
        found = (self._rows(self._SQL.EFFECT_ACTIONS) if key is None
                 else self._rows(self._SQL.EFFECT_ACTIONS_OF, (key,)))
        return [rows.effect_action(r) for r in found]

    def due_effects(self, now: float, names: Collection[str], limit: int) -> list[ScheduledEffect]:
        """On an engine that locks rows, in a unit the effects returned are
        locked and those another unit holds (being claimed) are skipped: two
        executors never take one."""
        chosen = sorted(names)
        if not chosen:
            return []
        sql, listed = self._names(self._guarded(self._SQL.DUE_EFFECTS, self._SQL.DUE_EFFECTS_LOCKED), chosen)
        return [rows.effect(r) for r in self._rows(sql, (now, *listed, limit))]

    def next_effect_due_at(self, names: Collection[str]) -> float | None:
        chosen = sorted(names)
        if not chosen:
            return None
        sql, listed = self._names(self._SQL.NEXT_EFFECT_DUE, chosen)
        row = self._one(sql, listed)
        return None if row is None else float(row[0])

    def held_effect_counts(self, names: Collection[str], now: float) -> dict[str, int]:
        chosen = sorted(names)
        if not chosen:
            return {}
        sql, listed = self._names(self._SQL.HELD_EFFECTS, chosen)
        return {str(name): int(count) for name, count in self._rows(sql, (now, *listed))}

    def unfed_effects(self, limit: int, now: float) -> list[ScheduledEffect]:
        return [rows.effect(r) for r in self._rows(self._SQL.UNFED, (now, limit))]

    def effect_history(self, key: str) -> list[EffectTransition]:
        return [rows.effect_transition(r) for r in self._rows(self._SQL.EFFECT_HISTORY, (key,))]

    def effect_starts(self, name: str, since: float) -> tuple[int, float | None, float | None]:
        row = self._one(self._SQL.EFFECT_STARTS, (name, since))
        assert row is not None  # an aggregate: one row always
        return int(row[0]), None if row[1] is None else float(row[1]), None if row[2] is None else float(row[2])

    def update_effect(self, key: str, changes: Mapping[str, Any], now: float) -> None:
        columns, values = effect_changes(changes)  # only EFFECT_COLUMNS: safe to name in the text
        assignments = ", ".join(f"{c} = {self._SQL.PARAM}" for c in columns)
        self._send(self._SQL.UPDATE_EFFECT.format(assignments=assignments), (*values, now, key))

    def add_transitions(self, rows: Sequence[EffectTransition]) -> None:
        self._many(self._SQL.ADD_TRANSITION, [
            (t.key, t.name, t.at, t.transition.value, t.attempt, t.owner, t.detail, t.due_at) for t in rows
        ])

    def lock_effect_names(self, names: Collection[str]) -> None:
        """Claimers of these names queue here until the unit ends, so a cap or
        a rate limit is counted and used by one claimer at a time (on
        PostgreSQL READ COMMITTED alone would let two count the same free
        slot; a SQLite unit already holds the file's one write lock)."""
        for name in sorted(names):
            self._lock("effect_name", name)

    def app_version(self, name: str) -> int:
        # In a unit of work, the caller migrates on what it reads here: take the
        # app-schema lock first, so two consumers opening at once migrate one
        # after the other and the second reads the first's version (READ
        # COMMITTED: the SELECT after the lock sees its commit), as SQLite's
        # write lock does.
        self._lock("app_schema")
        row = self._one(self._SQL.APP_VERSION, (name,))
        return 0 if row is None else int(row[0])

    def set_app_version(self, name: str, version: int) -> None:
        self._run(self._SQL.SET_APP_VERSION, (name, version))

    def _record(self, now: float, horizon: float, step: PruneStep) -> None:
        self._run(self._SQL.RECORD_PRUNE, (now, horizon, step.events, step.effect_records, step.effect_rows))

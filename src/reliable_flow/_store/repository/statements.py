"""The statements that read the same on every engine, written once.

Each side's table (:class:`OutboxSql`, :class:`InboxSql`) holds the
statement texts that every engine runs as they are, with ``?`` for each
parameter, and names (annotations without a text) those whose SQL truly
differs per engine: locking reads, engine-specific functions, index hints.
An engine's table derives from it, passing its placeholder
(``class PgOutboxSql(OutboxSql, param="%s")``): the shared texts are
rendered for it once, when the class is made, and the engine writes the
named rest itself.  The texts here use no engine's syntax (checked by
tests/test_architecture.py); the repositories run them through the
engine's :class:`~.dialect.Dialect`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...statuses import DeliveryState, EffectState, InboxState
from ..rows import EFFECT_SELECT, SCHEDULE_SELECT

__all__ = ["InboxSql", "OutboxSql", "SideSql", "StatementTable", "rendered"]

# The shared texts' placeholder.
PARAM = "?"


def rendered(text: str, param: str) -> str:
    """A shared text with each placeholder written as ``param`` (shared texts
    hold no ``?`` but placeholders: no literal, comment or operator has one)."""
    return text.replace(PARAM, param)


class StatementTable:
    """A statement table: its texts as class attributes, upper-case names."""

    #: The placeholder this table's texts are written with.
    PARAM: ClassVar[str] = PARAM

    def __init_subclass__(cls, param: str | None = None, **kwargs: Any) -> None:
        """An engine's table (``param`` given) gets every shared text it does
        not write itself, rendered with its placeholder."""
        super().__init_subclass__(**kwargs)
        if param is None:
            return  # a shared table: its texts stay as written
        own = set(vars(cls))
        for name in dir(cls):
            text = getattr(cls, name)  # the most derived shared table's
            if name.isupper() and name != "PARAM" and isinstance(text, str) and name not in own:
                setattr(cls, name, rendered(text, param))
        cls.PARAM = param


class SideSql(StatementTable):
    """What every side's table names: its ``meta`` table (key, value) and its tombstones."""

    #: The value of key ``?``.
    META_VALUE = "SELECT value FROM meta WHERE key = ?"
    #: Insert key ``?`` with value ``?`` unless the key is there (the row already there stays).
    ADD_META = "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
    #: The tombstone of an event id (flow, seq, body hash).
    TOMBSTONE: str
    #: Forget tombstones stamped before ``?``, at most ``?``.
    TOMBSTONE_FORGET: str
    #: Bury a pruned row (event id, flow, seq, body hash, stamp).
    TOMBSTONE_BURY: str
    #: Tombstones stamped before ``?``, counted up to ``?``.
    TOMBSTONES_BEFORE: str
    #: Every recorded prune, oldest first.
    RETENTION_ACTIONS = "SELECT at, action, horizon, forget_before, actor, reason FROM retention_action ORDER BY id"
    #: Record a prune (at, action, horizon, forget_before, actor, reason).
    RECORD_RETENTION_ACTION = (
        "INSERT INTO retention_action(at, action, horizon, forget_before, actor, reason) VALUES (?, ?, ?, ?, ?, ?)"
    )


_ACCEPTED, _SET_ASIDE = DeliveryState.ACCEPTED.value, DeliveryState.SET_ASIDE.value


class OutboxSql(SideSql):
    """The producer side's statements."""

    TOMBSTONE = "SELECT flow_id, seq, body_hash FROM outbox_tombstone WHERE event_id = ?"
    TOMBSTONE_BURY = "INSERT INTO outbox_tombstone(event_id, flow_id, seq, body_hash, pruned_at) VALUES (?, ?, ?, ?, ?)"
    TOMBSTONES_BEFORE = "SELECT count(*) FROM (SELECT 1 FROM outbox_tombstone WHERE pruned_at < ? LIMIT ?) t"
    FLOW = "SELECT state, seq, data FROM flow WHERE flow_id = ?"
    MARK_DELIVERED = (
        f"UPDATE delivery SET state = '{_ACCEPTED}', last_status = ?, attempts = attempts + 1, "
        "failures = 0, lease_owner = NULL, last_error = NULL, updated_at = ? WHERE consumer = ? AND pos = ?"
    )
    # A conflict never turns into "accepted", and never undoes one.
    MARK_CONFLICT = (
        f"UPDATE delivery SET state = CASE state WHEN '{_ACCEPTED}' THEN state ELSE '{_SET_ASIDE}' END, "
        "last_status = ?, attempts = attempts + 1, lease_owner = NULL, updated_at = ? "
        "WHERE consumer = ? AND pos = ?"
    )
    RECORD_PRUNE = "INSERT INTO prune_action(at, horizon, events, deliveries) VALUES (?, ?, ?, ?)"
    FLOWS = "SELECT flow_id FROM flow ORDER BY flow_id"
    EVENTS = "SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o ORDER BY o.pos"
    EVENTS_OF_FLOW = "SELECT o.pos, o.event_id, o.flow_id, o.seq FROM outbox o WHERE o.flow_id = ? ORDER BY o.pos"
    COUNT_EVENTS = "SELECT count(*) FROM outbox"
    COUNT_FLOWS = "SELECT count(*) FROM flow"
    CONSUMER_NAMES = "SELECT name FROM consumer ORDER BY name"
    OPERATOR_ACTIONS = "SELECT at, consumer, event_id, action, actor, reason FROM operator_action ORDER BY id"
    OPERATOR_ACTIONS_OF_EVENT = (
        "SELECT at, consumer, event_id, action, actor, reason FROM operator_action WHERE event_id = ? ORDER BY id"
    )
    RECORD_ACTION = (
        "INSERT INTO operator_action(at, consumer, event_id, action, actor, reason) VALUES (?, ?, ?, ?, ?, ?)"
    )
    REGISTRY_ACTIONS = "SELECT at, consumer, action, actor, reason, topics FROM registry_action ORDER BY id"
    REGISTRY_ACTIONS_OF = (
        "SELECT at, consumer, action, actor, reason, topics FROM registry_action WHERE consumer = ? ORDER BY id"
    )
    RECORD_REGISTRY_ACTION = (
        "INSERT INTO registry_action(at, consumer, action, actor, reason, topics) VALUES (?, ?, ?, ?, ?, ?)"
    )
    # Topics and subscriptions (issue 32).  A meta row that may change (the declared topics).
    SET_META = "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    SUBSCRIPTIONS = "SELECT name, topics FROM consumer WHERE topics IS NOT NULL ORDER BY name"
    FLOW_HEADS = "SELECT consumer, seq FROM flow_head WHERE flow_id = ?"
    PUT_HEAD = (
        "INSERT INTO flow_head(flow_id, consumer, seq) VALUES (?, ?, ?) "
        "ON CONFLICT (flow_id, consumer) DO UPDATE SET seq = excluded.seq"
    )
    FORGET_HEADS_OF = "DELETE FROM flow_head WHERE consumer = ?"
    DELIVER_ROUTED = "INSERT INTO delivery(consumer, pos, prev_seq) SELECT ?, pos, ? FROM outbox WHERE event_id = ?"
    DELIVER_AT = "INSERT INTO delivery(consumer, pos, prev_seq) VALUES (?, ?, ?)"
    LAST_POS = "SELECT coalesce(max(pos), 0) FROM outbox"
    SUBSCRIBE = "UPDATE consumer SET topics = ?, topics_from = ? WHERE name = ?"
    EVENT_BODIES = "SELECT pos, flow_id, seq, body FROM outbox ORDER BY pos"
    # Per-topic retention: the first event committed after a time (the walk the pruning step's horizon makes).
    FIRST_AFTER = "SELECT pos FROM outbox WHERE committed_at > ? ORDER BY pos LIMIT 1"
    # An event as one consumer gets it: its delivery's prev_seq, whether it
    # has a delivery, and whether the consumer subscribes to topics.
    EVENT_FOR = (
        "SELECT o.pos, o.body, d.prev_seq, d.pos, c.topics FROM outbox o "
        "LEFT JOIN delivery d ON d.pos = o.pos AND d.consumer = ? LEFT JOIN consumer c ON c.name = ? "
        "WHERE o.event_id = ?"
    )
    ANY_CONSUMER = "SELECT 1 FROM consumer LIMIT 1"
    IS_REGISTERED = "SELECT 1 FROM consumer WHERE name = ?"
    REGISTER = (
        "INSERT INTO consumer(name, uid, registered_at, from_pos) "
        "SELECT ?, NULL, ?, CASE WHEN ? THEN (SELECT coalesce(max(pos), 0) FROM outbox) END"
    )
    PENDING_FOR_ALL = "INSERT INTO delivery(consumer, pos) SELECT ?, pos FROM outbox"
    BOUND_UID = "SELECT uid FROM consumer WHERE name = ?"
    BIND = "UPDATE consumer SET uid = ? WHERE name = ? AND uid IS NULL"
    FORGET_DELIVERIES_OF = "DELETE FROM delivery WHERE consumer = ?"
    REMOVE_CONSUMER = "DELETE FROM consumer WHERE name = ?"
    SET_RETRY = (
        "UPDATE delivery SET attempts = attempts + 1, failures = ?, due_at = ?, lease_owner = NULL, "
        "last_error = ?, updated_at = ? WHERE consumer = ? AND pos = ?"
    )
    RESOLVE = (
        "UPDATE delivery SET state = ?, due_at = 0, failures = 0, lease_owner = NULL, updated_at = ? "
        "WHERE consumer = ? AND pos = ?"
    )
    PENDING_FAILURES = "SELECT failures FROM delivery WHERE consumer = ? AND pos = ? AND state = ?"
    DELIVERY_STATE = (
        "SELECT d.pos, d.state FROM outbox o JOIN delivery d ON d.pos = o.pos WHERE o.event_id = ? AND d.consumer = ?"
    )
    # The console's bounded reads (issue 31, item 5), each through an index:
    # set-aside deliveries (delivery_set_aside), counts that stop at a cap.
    SET_ASIDE = (
        "SELECT d.consumer, o.event_id, o.flow_id, o.seq, d.last_status FROM delivery d "
        f"JOIN outbox o ON o.pos = d.pos WHERE d.state = '{_SET_ASIDE}' ORDER BY d.consumer, d.pos LIMIT ?"
    )
    EVENTS_UP_TO = "SELECT count(*) FROM (SELECT 1 FROM outbox LIMIT ?) t"
    FLOWS_UP_TO = "SELECT count(*) FROM (SELECT 1 FROM flow LIMIT ?) t"
    # Each engine's own: how it joins or counts deliveries, its index hints
    # and, for the ``_LOCKED`` reads of a unit, its row locks.
    DELIVERIES: str
    DELIVERIES_OF_FLOW: str
    DELIVERY_COUNTS: str
    CONSUMERS: str
    NEXT_DUE: str
    NEXT_DUE_LOCKED: str
    NEXT_DUE_AT: str
    PENDING_FAILURES_LOCKED: str
    DELIVERY_STATE_LOCKED: str
    # The console's (issue 31): a consumer's pending deliveries counted up to
    # a cap with the leased among them (lease ends after ``?``; consumer ``?``,
    # cap ``?``), and the oldest one's commit time (consumer ``?``).
    PENDING_SUMMARY: str
    OLDEST_PENDING: str


_APPLIED, _SKIPPED, _REPLACED = InboxState.APPLIED.value, InboxState.SKIPPED.value, InboxState.REPLACED.value
_BLOCKED = InboxState.BLOCKED.value
_DEAD, _UNKNOWN = EffectState.DEAD.value, EffectState.UNKNOWN.value
_IN_DOUBT, _RUNNING = EffectState.IN_DOUBT.value, EffectState.RUNNING.value
#: How the executor's record of a refused feeding begins (core.effects.FEEDBACK_REFUSED).
FEED_REFUSED = "feedback "
_ACTION = (
    "SELECT at, event_id, flow_id, seq, action, previous_state, actor, reason, replacement_event_id "
    "FROM consumer_action "
)


class InboxSql(SideSql):
    """The consumer side's statements."""

    TOMBSTONE = "SELECT flow_id, seq, body_hash FROM inbox_tombstone WHERE event_id = ?"
    TOMBSTONE_BURY = "INSERT INTO inbox_tombstone(event_id, flow_id, seq, body_hash, pruned_at) VALUES (?, ?, ?, ?, ?)"
    TOMBSTONES_BEFORE = "SELECT count(*) FROM (SELECT 1 FROM inbox_tombstone WHERE pruned_at < ? LIMIT ?) t"
    #: The start of a read of inbox rows in full (an engine's ROWS_OF_FLOW too).
    ROW = "SELECT event_id, flow_id, seq, state, reason, detail, received_at, blocked_at, body FROM inbox "
    META = "SELECT key, value FROM meta"
    PROJECTION = "SELECT state, last_seq, view FROM projection WHERE flow_id = ?"
    LAST_SEQ = "SELECT last_seq FROM projection WHERE flow_id = ?"
    FLOW = "SELECT state, last_seq, data FROM projection WHERE flow_id = ?"
    EFFECT_RECORDS = "SELECT event_id, flow_id, seq, kind FROM effect WHERE flow_id = ? ORDER BY id"
    INBOX_FLOWS = "SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id"
    PROJECTED_FLOWS = "SELECT flow_id FROM projection ORDER BY flow_id"
    OPEN_FLOWS = "SELECT DISTINCT flow_id FROM inbox WHERE state IN ('pending','blocked') ORDER BY flow_id"
    ROW_OF_EVENT = ROW + "WHERE event_id = ?"
    HOLDER = "SELECT event_id FROM inbox WHERE flow_id = ? AND seq = ? AND live = 1"
    UNAPPLIED = "SELECT count(*) FROM (SELECT 1 FROM inbox WHERE state IN ('pending','blocked') LIMIT ?) t"
    INSERT = "INSERT INTO inbox(event_id, flow_id, seq, body, received_at) VALUES (?, ?, ?, ?, ?)"
    # Metrics.  A flow is at a gap when its first row still waiting (pending
    # or blocked) is past last_seq + 1.
    INBOX_COUNTS = "SELECT state, reason, count(*) FROM inbox GROUP BY state, reason"
    GAPS = (
        "SELECT count(*) FROM (SELECT flow_id, min(seq) AS first FROM inbox WHERE state IN ('pending','blocked') "
        "GROUP BY flow_id) o LEFT JOIN projection p ON p.flow_id = o.flow_id "
        "WHERE o.first > coalesce(p.last_seq, 0) + 1"
    )
    UPSERT_PROJECTION = (
        "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(flow_id) DO UPDATE SET state = excluded.state, "
        "last_seq = excluded.last_seq, data = excluded.data, view = excluded.view"
    )
    RECORD_EFFECT = "INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (?, ?, ?, ?)"
    MARK_APPLIED = f"UPDATE inbox SET state = '{_APPLIED}', reason = NULL, detail = NULL WHERE event_id = ?"
    SET_SKIPPED = f"UPDATE inbox SET state = '{_SKIPPED}' WHERE event_id = ?"
    SET_REPLACED = f"UPDATE inbox SET state = '{_REPLACED}', live = NULL WHERE event_id = ?"
    # Each consumer's own order (issue 32, item 5): a ``latest`` consumer's
    # newest row still waiting, an ``any`` consumer's oldest pending row,
    # and the waiting rows below a seq set aside as superseded (its detail
    # says by which seq).
    NEWEST_WAITING = (
        "SELECT seq, event_id, body FROM inbox WHERE flow_id = ? AND state IN ('pending','blocked') "
        "AND live = 1 ORDER BY seq DESC LIMIT 1"
    )
    # The partial index inbox_open's own condition spelled out, so SQLite
    # searches it (applied rows left out) rather than the flow's whole history.
    OLDEST_PENDING = (
        "SELECT seq, event_id, body FROM inbox WHERE flow_id = ? AND state IN ('pending','blocked') "
        "AND state = 'pending' AND live = 1 ORDER BY seq LIMIT 1"
    )
    SUPERSEDE = (
        "UPDATE inbox SET state = 'superseded', reason = NULL, detail = ? "
        "WHERE flow_id = ? AND seq < ? AND state IN ('pending','blocked') AND live = 1"
    )
    RECORD_INBOX_ACTION = (
        "INSERT INTO consumer_action(at, event_id, flow_id, seq, action, previous_state, actor, reason, "
        "replacement_event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    INBOX_ACTIONS = _ACTION + "ORDER BY id"
    INBOX_ACTIONS_OF_EVENT = _ACTION + "WHERE event_id = ? OR replacement_event_id = ? ORDER BY id"
    ADD_EFFECT = (
        "INSERT INTO effect_outbox(key, name, payload, event_id, flow_id, seq, meta, ordered, deadline, "
        "version, fed, created_at, updated_at, due_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(key) DO NOTHING"
    )
    EFFECT = f"SELECT {EFFECT_SELECT} FROM effect_outbox WHERE key = ?"
    EFFECT_LIST = f"SELECT {EFFECT_SELECT} FROM effect_outbox {{where}} ORDER BY id"
    EFFECT_COUNTS = "SELECT state, count(*) FROM effect_outbox GROUP BY state ORDER BY state"
    # Pending effects waiting for a time (delayed, backing off, rate limited), per name.
    EFFECT_TIMERS = (
        "SELECT name, count(*), min(due_at) FROM effect_outbox WHERE state = 'pending' AND due_at > ? "
        "GROUP BY name ORDER BY name"
    )
    EFFECT_ACTIONS = "SELECT at, key, action, actor, reason FROM effect_action ORDER BY id"
    EFFECT_ACTIONS_OF = "SELECT at, key, action, actor, reason FROM effect_action WHERE key = ? ORDER BY id"
    RECORD_EFFECT_ACTION = "INSERT INTO effect_action(at, key, action, actor, reason) VALUES (?, ?, ?, ?, ?)"
    UPDATE_EFFECT = "UPDATE effect_outbox SET {assignments}, updated_at = ? WHERE key = ?"
    # The effect history (issue 20): one row per transition, read per key in order.
    EFFECT_HISTORY = (
        "SELECT key, name, at, transition, attempt, owner, detail, due_at FROM effect_history WHERE key = ? ORDER BY id"
    )
    ADD_TRANSITION = (
        "INSERT INTO effect_history(key, name, at, transition, attempt, owner, detail, due_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    )
    APP_VERSION = "SELECT version FROM app_schema WHERE name = ?"
    SET_APP_VERSION = (
        "INSERT INTO app_schema(name, version) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET version = excluded.version"
    )
    RECORD_PRUNE = "INSERT INTO prune_action(at, horizon, events, effect_records, effect_rows) VALUES (?, ?, ?, ?, ?)"
    # The console's bounded reads (issue 31, item 5), each through an index.
    # Flows that may need attention: a row still waiting (inbox_open) that is
    # blocked or arrived long enough ago.
    WAITING_FLOWS = (
        "SELECT DISTINCT flow_id FROM inbox WHERE state IN ('pending','blocked') AND flow_id > ? "
        f"AND (state = '{_BLOCKED}' OR received_at IS NULL OR received_at <= ?) ORDER BY flow_id LIMIT ?"
    )
    WAITING_SUMMARY = (
        "SELECT state, count(*), min(received_at) FROM (SELECT state, received_at FROM inbox "
        "WHERE state IN ('pending','blocked') LIMIT ?) t GROUP BY state"
    )
    APPLIES = "SELECT max(id) FROM effect"
    EFFECTS_UP_TO = "SELECT count(*) FROM (SELECT 1 FROM effect_outbox WHERE state = ? LIMIT ?) t"
    #: A keyset page's start: after the effect with key ``?``.
    EFFECT_AFTER = "id > (SELECT id FROM effect_outbox WHERE key = ?)"
    # Each kind of effect that may need a person from its own index, at most
    # ``?`` of each, then together in scheduling order.
    ATTENTION_EFFECTS = (
        f"SELECT {EFFECT_SELECT} FROM effect_outbox WHERE id IN ("
        + " UNION ALL ".join(
            f"SELECT id FROM (SELECT id FROM effect_outbox WHERE {where} ORDER BY id LIMIT ?) {alias}"
            for alias, where in (
                ("d", f"state = '{_DEAD}'"), ("u", f"state = '{_UNKNOWN}'"), ("i", f"state = '{_IN_DOUBT}'"),
                ("r", f"state = '{_RUNNING}' AND due_at <= ?"),
                ("f", f"fed = 0 AND (updated_at <= ? OR substr(last_error, 1, {len(FEED_REFUSED)}) = '{FEED_REFUSED}')"),
            ))
        + ") ORDER BY id LIMIT ?"
    )
    # Recurring effect schedules (issue 33, item 2): a small table, read whole.
    SCHEDULES = f"SELECT {SCHEDULE_SELECT} FROM effect_schedule ORDER BY schedule"
    SCHEDULE = f"SELECT {SCHEDULE_SELECT} FROM effect_schedule WHERE schedule = ?"
    DUE_SCHEDULES = (
        f"SELECT {SCHEDULE_SELECT} FROM effect_schedule WHERE paused = 0 AND next_at <= ? ORDER BY next_at, schedule"
    )
    ADD_SCHEDULE = (
        "INSERT INTO effect_schedule(schedule, name, payload, interval_seconds, cron, tz, missed, next_at, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(schedule) DO NOTHING"
    )
    #: Move a schedule on from the next tick it was read with (``?``): no
    #: row touched when another unit moved it first.
    ADVANCE_SCHEDULE = (
        "UPDATE effect_schedule SET next_at = ?, last_tick = coalesce(?, last_tick), skipped = skipped + ?, "
        "updated_at = ? WHERE schedule = ? AND next_at = ? AND paused = 0"
    )
    PAUSE_SCHEDULE = "UPDATE effect_schedule SET paused = ?, next_at = ?, updated_at = ? WHERE schedule = ?"
    REMOVE_SCHEDULE = "DELETE FROM effect_schedule WHERE schedule = ?"
    SCHEDULE_ACTIONS = "SELECT at, schedule, action, actor, reason FROM schedule_action ORDER BY id"
    SCHEDULE_ACTIONS_OF = "SELECT at, schedule, action, actor, reason FROM schedule_action WHERE schedule = ? ORDER BY id"
    RECORD_SCHEDULE_ACTION = "INSERT INTO schedule_action(at, schedule, action, actor, reason) VALUES (?, ?, ?, ?, ?)"
    # Each engine's own: NULL ordering, index hints, how a list of names is
    # matched (``{names}``), how a block compares NULLs, and the ``_LOCKED``
    # read's row locks.
    ROWS_OF_FLOW: str
    BLOCK: str
    DUE_EFFECTS: str
    DUE_EFFECTS_LOCKED: str
    NEXT_EFFECT_DUE: str
    HELD_EFFECTS: str
    EFFECT_STARTS: str
    UNFED: str
    FLOWS_BY_CORRELATION: str

"""SQL schema of both file kinds, as ordered migrations.

Each file kind has an ``application_id`` that marks the file as ours and a
tuple of migrations; migration *i* (1-based) brings ``PRAGMA user_version``
from *i-1* to *i*.  Later releases append migrations and never edit old ones,
so a file written by any earlier version upgrades in place on open.
Old migrations spell their CHECK values out literally for that reason: a
later change to an enum must not change what an old migration created.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...statuses import Transition

__all__ = ["CONSUMER", "PRODUCER", "FileKind"]


@dataclass(frozen=True)
class FileKind:
    name: str
    application_id: int
    migrations: tuple[tuple[str, ...], ...]

    @property
    def version(self) -> int:
        return len(self.migrations)


# The tombstone table of both file kinds (v4).  Frozen like every migration:
# a later change must be a new migration, never an edit of this text.
_TOMBSTONE_TABLE = """CREATE TABLE {name}(
                event_id TEXT PRIMARY KEY,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                body_hash BLOB NOT NULL,
                pruned_at REAL NOT NULL
            ) WITHOUT ROWID"""

# Operators' prunes (producer v5, consumer v7), one row per call, written in
# its first transaction; what each transaction removed stays in
# prune_action.  forget_before is NULL without forget_after.  Frozen.
_RETENTION_ACTION = """CREATE TABLE retention_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('prune')),
                horizon REAL NOT NULL,
                forget_before REAL,
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )"""

# The producer's v6 (issue 32): topics and subscriptions.  Frozen like every migration.
_PRODUCER_V6 = (
    # A consumer's subscription: NULL topics (every name registered before,
    # or without topics) gets every event; a JSON list of topic names gets
    # the events of those topics, routed by advance, with each delivery's
    # prev_seq (NULL: seq - 1).  topics_from: the outbox position after
    # which its subscription holds (the last event committed before it).
    "ALTER TABLE consumer ADD COLUMN topics TEXT",
    "ALTER TABLE consumer ADD COLUMN topics_from INTEGER",
    "ALTER TABLE delivery ADD COLUMN prev_seq INTEGER",
    # The seq of each flow's last event routed to each consumer: the
    # prev_seq of the next one, fixed when that one commits.
    """CREATE TABLE flow_head(
                flow_id TEXT NOT NULL,
                consumer TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                PRIMARY KEY (flow_id, consumer)
            ) WITHOUT ROWID""",
    # A subscription change is a registry action, with its topics; SQLite
    # cannot alter a CHECK constraint, so the table is rebuilt.
    """CREATE TABLE registry_action_v6(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                consumer TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('register','remove','subscribe')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL,
                topics TEXT
            )""",
    (
        "INSERT INTO registry_action_v6(id, at, consumer, action, actor, reason) "
        "SELECT id, at, consumer, action, actor, reason FROM registry_action"
    ),
    "DROP TABLE registry_action",
    "ALTER TABLE registry_action_v6 RENAME TO registry_action",
)

PRODUCER = FileKind(
    name="producer",
    application_id=0x52460001,  # "RF" 1
    migrations=(
        (
            # Facts about the file itself: the protocol it was created for.
            "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
            """CREATE TABLE flow(
                flow_id TEXT PRIMARY KEY,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                state TEXT NOT NULL,
                data TEXT NOT NULL
            )""",
            # pos gives every event a total commit order for fair, cheap scans.
            """CREATE TABLE outbox(
                pos INTEGER PRIMARY KEY AUTOINCREMENT,
                event_id TEXT NOT NULL UNIQUE,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                body TEXT NOT NULL,
                UNIQUE (flow_id, seq)
            )""",
            # One row per consumer name ever relayed to; uid pins the file.
            """CREATE TABLE consumer(
                name TEXT PRIMARY KEY,
                uid TEXT NOT NULL UNIQUE
            ) WITHOUT ROWID""",
            # Delivery state of each event towards each consumer.
            """CREATE TABLE delivery(
                consumer TEXT NOT NULL REFERENCES consumer(name),
                pos INTEGER NOT NULL REFERENCES outbox(pos),
                state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending','accepted','set_aside')),
                last_status TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (consumer, pos)
            ) WITHOUT ROWID""",
            "CREATE INDEX delivery_pending ON delivery(consumer, pos) WHERE state = 'pending'",
        ),
        (
            # v2: leases, backoff and operator actions.  SQLite cannot alter a
            # CHECK constraint, so the delivery table is rebuilt.
            """CREATE TABLE delivery_v2(
                consumer TEXT NOT NULL REFERENCES consumer(name),
                pos INTEGER NOT NULL REFERENCES outbox(pos),
                state TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending','accepted','set_aside','skipped')),
                last_status TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                failures INTEGER NOT NULL DEFAULT 0,
                due_at REAL NOT NULL DEFAULT 0,
                lease_owner TEXT,
                last_error TEXT,
                updated_at REAL,
                PRIMARY KEY (consumer, pos)
            ) WITHOUT ROWID""",
            (
                "INSERT INTO delivery_v2(consumer, pos, state, last_status, attempts) "
                "SELECT consumer, pos, state, last_status, attempts FROM delivery"
            ),
            "DROP TABLE delivery",
            "ALTER TABLE delivery_v2 RENAME TO delivery",
            # Next due event per consumer: oldest commit first, skipping the
            # few not yet due (due_at is in the index so the skip is cheap).
            "CREATE INDEX delivery_due ON delivery(consumer, pos, due_at) WHERE state = 'pending'",
            """CREATE TABLE operator_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                consumer TEXT NOT NULL,
                event_id TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('redeliver','skip')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )""",
        ),
        (
            # v3: consumers as a registry.  A name may be registered before
            # any file is bound to it (uid NULL until its first relay), with
            # when it was registered and, for one registered "from now", the
            # last event committed before (it gets none of those).  uid was
            # NOT NULL, and SQLite cannot drop a NOT NULL, so the table is
            # rebuilt.  Registering and removing names is recorded.
            """CREATE TABLE consumer_v3(
                name TEXT PRIMARY KEY,
                uid TEXT UNIQUE,
                registered_at REAL,
                from_pos INTEGER
            ) WITHOUT ROWID""",
            "INSERT INTO consumer_v3(name, uid) SELECT name, uid FROM consumer",
            "DROP TABLE consumer",
            "ALTER TABLE consumer_v3 RENAME TO consumer",
            """CREATE TABLE registry_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                consumer TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('register','remove')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )""",
        ),
        (
            # v4: retention.  ``committed_at`` (the producer's clock, written
            # by advance; NULL for events committed before v4, which count as
            # old enough to prune) tells an event's age.  A pruned event
            # leaves a tombstone: its id, flow, seq and the SHA-256 of its
            # canonical body, so a re-sent advance is still ``existing`` or
            # ``conflict``.  Tombstones stay until a prune with ``forget_after``.  Each pruning
            # transaction is recorded with what it removed.
            "ALTER TABLE outbox ADD COLUMN committed_at REAL",
            _TOMBSTONE_TABLE.format(name="outbox_tombstone"),
            """CREATE TABLE prune_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                horizon REAL NOT NULL,
                events INTEGER NOT NULL,
                deliveries INTEGER NOT NULL
            )""",
        ),
        # v5: who pruned, when and why: one row per prune call.
        (_RETENTION_ACTION,),
        # v6: topics and subscriptions (issue 32).
        _PRODUCER_V6,
        # v7: the set-aside deliveries, per consumer in commit order, without
        # walking every delivery (what needs attention; issue 31).
        ("CREATE INDEX delivery_set_aside ON delivery(consumer, pos) WHERE state = 'set_aside'",),
    ),
)

# v5 (issue 20): the CHECK lists every statuses.Transition value.
_EFFECT_HISTORY = """CREATE TABLE effect_history(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                key TEXT NOT NULL,
                name TEXT NOT NULL,
                at REAL NOT NULL,
                transition TEXT NOT NULL CHECK (transition IN ({transitions})),
                attempt INTEGER NOT NULL,
                owner TEXT,
                detail TEXT
            )""".format(transitions=",".join(f"'{t.value}'" for t in Transition))

# Recurring effect schedules: one row per schedule name (issue 33, item 2).
_SCHEDULE_TABLE = """CREATE TABLE effect_schedule(
                schedule TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                payload TEXT NOT NULL,
                interval_seconds {real},
                cron TEXT,
                tz TEXT NOT NULL,
                missed TEXT NOT NULL CHECK (missed IN ('one','all','skip')),
                paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
                next_at {real} NOT NULL,
                last_tick {real},
                skipped INTEGER NOT NULL DEFAULT 0,
                created_at {real} NOT NULL,
                updated_at {real} NOT NULL,
                CHECK ((interval_seconds IS NULL) <> (cron IS NULL))
            )"""
_SCHEDULE_ACTION = """CREATE TABLE schedule_action(
                id {id},
                at {real} NOT NULL,
                schedule TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('pause','resume','remove')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )"""

CONSUMER = FileKind(
    name="consumer",
    application_id=0x52460002,  # "RF" 2
    migrations=(
        (
            "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
            """CREATE TABLE inbox(
                event_id TEXT PRIMARY KEY,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                body TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending','blocked','applied')),
                reason TEXT,
                UNIQUE (flow_id, seq)
            )""",
            # Flows with work left; small, since applied rows drop out of it.
            "CREATE INDEX inbox_open ON inbox(flow_id, seq) WHERE state <> 'applied'",
            """CREATE TABLE projection(
                flow_id TEXT PRIMARY KEY,
                state TEXT NOT NULL,
                last_seq INTEGER NOT NULL CHECK (last_seq >= 1),
                data TEXT NOT NULL,
                view TEXT NOT NULL
            )""",
            # UNIQUE(event_id) is the last line of defence against a double effect.
            """CREATE TABLE effect(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                event_id TEXT NOT NULL UNIQUE,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                kind TEXT NOT NULL,
                UNIQUE (flow_id, seq)
            )""",
        ),
        (
            # v2: the effect outbox (side effects outside the file, scheduled
            # by apply handlers), operator actions on effects, and the
            # versions of the application's own tables.
            """CREATE TABLE effect_outbox(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                key TEXT NOT NULL UNIQUE,
                name TEXT NOT NULL,
                payload TEXT NOT NULL,
                event_id TEXT NOT NULL,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                meta TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
                    ('pending','running','in_doubt','succeeded','dead','unknown','expired','superseded','cancelled')),
                ordered INTEGER NOT NULL DEFAULT 0 CHECK (ordered IN (0, 1)),
                deadline REAL,
                version INTEGER,
                attempts INTEGER NOT NULL DEFAULT 0,
                failures INTEGER NOT NULL DEFAULT 0,
                due_at REAL NOT NULL DEFAULT 0,
                lease_owner TEXT,
                last_error TEXT,
                result TEXT,
                reason TEXT,
                fed INTEGER CHECK (fed IN (0, 1)),
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL
            )""",
            # Work an executor may claim: due pending, in-doubt, and running
            # effects whose lease ran out.
            "CREATE INDEX effect_due ON effect_outbox(due_at, id) WHERE state IN ('pending','running','in_doubt')",
            # An ordered flow's unresolved effects, oldest first.
            (
                "CREATE INDEX effect_open_ordered ON effect_outbox(flow_id, id) "
                "WHERE ordered = 1 AND state IN ('pending','running','in_doubt','dead','unknown')"
            ),
            "CREATE INDEX effect_by_state ON effect_outbox(state, id)",
            "CREATE INDEX effect_unfed ON effect_outbox(id) WHERE fed = 0",
            """CREATE TABLE effect_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                key TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('retry','resolve','cancel')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )""",
            "CREATE TABLE app_schema(name TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID",
        ),
        (
            # v3: an operator's way past a bad accepted event, and why a flow
            # waits.  A row may end ``skipped`` or ``replaced``; a replaced
            # row keeps its id and body but gives up its (flow, seq) slot to
            # its replacement: ``live`` is 1 while a row holds the slot and
            # NULL once replaced, so UNIQUE (flow_id, seq, live) still allows
            # one live row per slot.  ``received_at`` / ``blocked_at`` (the
            # consumer's clock) and the block's ``detail`` say since when and
            # why a flow waits (NULL for rows stored before v3).  SQLite
            # cannot alter a CHECK constraint, so the inbox table is rebuilt.
            """CREATE TABLE inbox_v3(
                event_id TEXT PRIMARY KEY,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                body TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending','blocked','applied','skipped','replaced')),
                reason TEXT,
                detail TEXT,
                received_at REAL,
                blocked_at REAL,
                live INTEGER DEFAULT 1 CHECK ((live IS 1) = (state <> 'replaced')),
                UNIQUE (flow_id, seq, live)
            )""",
            (
                "INSERT INTO inbox_v3(event_id, flow_id, seq, body, state, reason) "
                "SELECT event_id, flow_id, seq, body, state, reason FROM inbox"
            ),
            "DROP TABLE inbox",
            "ALTER TABLE inbox_v3 RENAME TO inbox",
            # Flows with work left: only rows still waiting (skipped and
            # replaced rows are as done as applied ones).
            "CREATE INDEX inbox_open ON inbox(flow_id, seq) WHERE state IN ('pending','blocked')",
            # Operators' skips and replacements of accepted events.
            """CREATE TABLE consumer_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                event_id TEXT NOT NULL,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('skip','replace')),
                previous_state TEXT NOT NULL CHECK (previous_state IN ('pending','blocked')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL,
                replacement_event_id TEXT
            )""",
        ),
        (
            # v4: retention.  A pruned inbox row (applied, skipped or
            # replaced, and at or before its flow's last applied seq) leaves
            # a tombstone: its id, flow, seq and the SHA-256 of its canonical
            # body, so a re-sent event is still ``duplicate`` or
            # ``id_conflict``.  Its age is ``received_at`` (NULL for rows
            # stored before v3: old enough).  Tombstones stay until a prune with ``forget_after``.
            # Each pruning transaction is recorded with what it removed.
            _TOMBSTONE_TABLE.format(name="inbox_tombstone"),
            """CREATE TABLE prune_action(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                at REAL NOT NULL,
                horizon REAL NOT NULL,
                events INTEGER NOT NULL,
                effect_records INTEGER NOT NULL,
                effect_rows INTEGER NOT NULL
            )""",
        ),
        (
            # v5: every transition of every effect, in order (issue 20):
            # what an operator reads when a refund went wrong, and what rate
            # limits count (the starts of calls of one name in a window).
            # The transition values are statuses.Transition's (pinned by a test).
            _EFFECT_HISTORY,
            "CREATE INDEX effect_history_key ON effect_history(key, id)",
            "CREATE INDEX effect_history_starts ON effect_history(name, at) WHERE transition = 'claimed'",
        ),
        # v6: when a transition left the effect due again, as a column
        # (EffectTransition.due_at), not only in the detail's words.
        # NULL for rows written before v6.
        ("ALTER TABLE effect_history ADD COLUMN due_at REAL",),
        # v7: who pruned, when and why: one row per prune call.
        (_RETENTION_ACTION,),
        # v8: the console's pages (issue 31, item 5) read effects a page at a
        # time by name, by state and name, and by flow, and find flows by
        # the correlation id in their events' meta: an expression index, so
        # the rows stored before it are indexed by the migration itself and
        # nothing on the write path changes.
        (
            "CREATE INDEX effect_by_name ON effect_outbox(name, id)",
            "CREATE INDEX effect_by_state_name ON effect_outbox(state, name, id)",
            "CREATE INDEX effect_by_flow ON effect_outbox(flow_id, id)",
            (
                "CREATE INDEX inbox_correlation ON inbox(json_extract(body, '$.meta.correlation_id'), flow_id) "
                "WHERE json_extract(body, '$.meta.correlation_id') IS NOT NULL"
            ),
        ),
        # v9: recurring effect schedules (issue 33, item 2) and the
        # operator's pauses, resumes and removals of them.
        (_SCHEDULE_TABLE.format(real="REAL"), _SCHEDULE_ACTION.format(id="INTEGER PRIMARY KEY AUTOINCREMENT",
                                                                         real="REAL")),
        (
            # v10 (issue 32, item 5): each consumer's own order.  A ``latest``
            # consumer sets an older arrival aside as ``superseded`` (its
            # detail says by which seq).  SQLite cannot alter a CHECK
            # constraint, so the inbox is rebuilt as in v3, its rowids (the
            # arrival order a prune follows) kept, and its indexes made again.
            """CREATE TABLE inbox_v10(
                event_id TEXT PRIMARY KEY,
                flow_id TEXT NOT NULL,
                seq INTEGER NOT NULL CHECK (seq >= 1),
                body TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending','blocked','applied','skipped','replaced','superseded')),
                reason TEXT,
                detail TEXT,
                received_at REAL,
                blocked_at REAL,
                live INTEGER DEFAULT 1 CHECK ((live IS 1) = (state <> 'replaced')),
                UNIQUE (flow_id, seq, live)
            )""",
            (
                "INSERT INTO inbox_v10(rowid, event_id, flow_id, seq, body, state, reason, detail, received_at, "
                "blocked_at, live) SELECT rowid, event_id, flow_id, seq, body, state, reason, detail, received_at, "
                "blocked_at, live FROM inbox"
            ),
            "DROP TABLE inbox",
            "ALTER TABLE inbox_v10 RENAME TO inbox",
            "CREATE INDEX inbox_open ON inbox(flow_id, seq) WHERE state IN ('pending','blocked')",
            (
                "CREATE INDEX inbox_correlation ON inbox(json_extract(body, '$.meta.correlation_id'), flow_id) "
                "WHERE json_extract(body, '$.meta.correlation_id') IS NOT NULL"
            ),
        ),
    ),
)

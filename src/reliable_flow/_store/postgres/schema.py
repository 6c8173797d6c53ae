"""PostgreSQL DDL of both store kinds, as ordered migrations.

Each store lives in its own schema (namespace).  Its ``rf_identity`` table
holds one row: the product (``reliable_flow``), the kind (``producer`` /
``consumer``) and the schema version, which plays the part of SQLite's
``application_id`` and ``user_version``.  Migration *i* (1-based) brings the
version from *i-1* to *i*; later releases append migrations and never edit
old ones, so their CHECK values are spelt out literally.

Positions (``pos``, ``arrival``, ``id``) are identity columns: they order
rows, but a transaction may commit a smaller one after a larger one, so no
reader uses them as a cursor ("everything after the last one I saw").
Text keys use the ``"C"`` collation: sorted lists come out in code point
order, as on SQLite, whatever the database's locale.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...statuses import Transition

__all__ = ["CONSUMER", "CORRELATION_ID", "IDENTITY_TABLE", "PRODUCER", "PRODUCT", "StoreKind"]

PRODUCT = "reliable_flow"
IDENTITY_TABLE = "rf_identity"


@dataclass(frozen=True)
class StoreKind:
    name: str
    migrations: tuple[tuple[str, ...], ...]

    @property
    def version(self) -> int:
        return len(self.migrations)


_IDENTITY = """CREATE TABLE rf_identity(
                one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
                product TEXT NOT NULL,
                kind TEXT NOT NULL,
                version INTEGER NOT NULL
            )"""
_META = 'CREATE TABLE meta(key TEXT COLLATE "C" PRIMARY KEY, value TEXT NOT NULL)'
_TOMBSTONE_TABLE = """CREATE TABLE {name}(
                event_id TEXT COLLATE "C" PRIMARY KEY,
                flow_id TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL CHECK (seq >= 1),
                body_hash BYTEA NOT NULL,
                pruned_at DOUBLE PRECISION NOT NULL
            )"""

# Operators' prunes, one row per call, written in its first transaction
# (producer v2, consumer v4); what each transaction removed stays in
# prune_action.  forget_before is NULL without forget_after.
_RETENTION_ACTION = """CREATE TABLE retention_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('prune')),
                horizon DOUBLE PRECISION NOT NULL,
                forget_before DOUBLE PRECISION,
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )"""

# v2 (issue 20): the CHECK lists every statuses.Transition value.
_EFFECT_HISTORY = """CREATE TABLE effect_history(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                key TEXT COLLATE "C" NOT NULL,
                name TEXT COLLATE "C" NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                transition TEXT NOT NULL CHECK (transition IN ({transitions})),
                attempt INTEGER NOT NULL,
                owner TEXT,
                detail TEXT
            )""".format(transitions=",".join(f"'{t.value}'" for t in Transition))

# v5 (issue 31): an inbox row's ``meta["correlation_id"]``, as the JSON text
# of the string (quotes and escapes kept), or NULL.  Read from the body's
# text with a regular expression, not by parsing it as json / jsonb: a body
# may hold \u0000, which PostgreSQL's JSON functions refuse to unescape, and
# an insert must never fail on an index.  The body is the envelope's
# canonical JSON: keys sorted (``event_id``, ``flow_id``, ``kind`` and then
# ``meta``: a quote inside those values is escaped, so the first unescaped
# ``"meta":{`` is the envelope's own), ``meta`` a flat object of strings.
# Frozen with the migration that indexes it.
CORRELATION_ID = (  # group 4: the id's string; no "?" in the text (the engine's placeholder is %s)
    r"""(regexp_match(body, '"meta":\{("([^"\\]|\\.)*":"([^"\\]|\\.)*",)*"correlation_id":"""
    r"""("([^"\\]|\\.)*")'))[4]"""
)

PRODUCER = StoreKind(
    name="producer",
    migrations=(
        (
            _IDENTITY,
            _META,
            """CREATE TABLE flow(
                flow_id TEXT COLLATE "C" PRIMARY KEY,
                seq BIGINT NOT NULL CHECK (seq >= 1),
                state TEXT NOT NULL,
                data TEXT NOT NULL
            )""",
            """CREATE TABLE outbox(
                pos BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                event_id TEXT COLLATE "C" NOT NULL UNIQUE,
                flow_id TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL CHECK (seq >= 1),
                body TEXT NOT NULL,
                committed_at DOUBLE PRECISION,
                UNIQUE (flow_id, seq)
            )""",
            """CREATE TABLE consumer(
                name TEXT COLLATE "C" PRIMARY KEY,
                uid TEXT UNIQUE,
                registered_at DOUBLE PRECISION,
                from_pos BIGINT
            )""",
            """CREATE TABLE delivery(
                consumer TEXT COLLATE "C" NOT NULL,
                pos BIGINT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending','accepted','set_aside','skipped')),
                last_status TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                failures INTEGER NOT NULL DEFAULT 0,
                due_at DOUBLE PRECISION NOT NULL DEFAULT 0,
                lease_owner TEXT,
                last_error TEXT,
                updated_at DOUBLE PRECISION,
                PRIMARY KEY (consumer, pos)
            )""",
            "CREATE INDEX delivery_due ON delivery(consumer, pos, due_at) WHERE state = 'pending'",
            "CREATE INDEX delivery_by_pos ON delivery(pos)",
            """CREATE TABLE operator_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                consumer TEXT NOT NULL,
                event_id TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('redeliver','skip')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )""",
            """CREATE TABLE registry_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                consumer TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('register','remove')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )""",
            _TOMBSTONE_TABLE.format(name="outbox_tombstone"),
            """CREATE TABLE prune_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                horizon DOUBLE PRECISION NOT NULL,
                events INTEGER NOT NULL,
                deliveries INTEGER NOT NULL
            )""",
        ),
        # v2: who pruned, when and why (one row per prune call), as SQLite's v5.
        (_RETENTION_ACTION,),
        (
            # v3 (issue 32): topics and subscriptions, as on SQLite's v6.
            "ALTER TABLE consumer ADD COLUMN topics TEXT",
            "ALTER TABLE consumer ADD COLUMN topics_from BIGINT",
            "ALTER TABLE delivery ADD COLUMN prev_seq BIGINT",
            """CREATE TABLE flow_head(
                flow_id TEXT COLLATE "C" NOT NULL,
                consumer TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL CHECK (seq >= 1),
                PRIMARY KEY (flow_id, consumer)
            )""",
            "ALTER TABLE registry_action DROP CONSTRAINT registry_action_action_check",
            (
                "ALTER TABLE registry_action ADD CONSTRAINT registry_action_action_check "
                "CHECK (action IN ('register','remove','subscribe'))"
            ),
            "ALTER TABLE registry_action ADD COLUMN topics TEXT",
        ),
        # v4: the set-aside deliveries, per consumer in commit order, as
        # SQLite's v7 (the console at scale, issue 31).
        ("CREATE INDEX delivery_set_aside ON delivery(consumer, pos) WHERE state = 'set_aside'",),
    ),
)

# Recurring effect schedules: one row per schedule name (issue 33, item 2).
_SCHEDULE_TABLE = """CREATE TABLE effect_schedule(
                schedule TEXT COLLATE "C" PRIMARY KEY, name TEXT COLLATE "C" NOT NULL, payload TEXT NOT NULL,
                interval_seconds DOUBLE PRECISION, cron TEXT, tz TEXT NOT NULL,
                missed TEXT NOT NULL CHECK (missed IN ('one','all','skip')),
                paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
                next_at DOUBLE PRECISION NOT NULL, last_tick DOUBLE PRECISION, skipped INTEGER NOT NULL DEFAULT 0,
                created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
                CHECK ((interval_seconds IS NULL) <> (cron IS NULL))
            )"""
_SCHEDULE_ACTION = """CREATE TABLE schedule_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                schedule TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('pause','resume','remove')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )"""

CONSUMER = StoreKind(
    name="consumer",
    migrations=(
        (
            _IDENTITY,
            _META,
            # A replaced row keeps its id and body but gives up its (flow,
            # seq) slot: live is 1 while it holds the slot, NULL once
            # replaced; NULLs are distinct, so UNIQUE (flow_id, seq, live)
            # allows one live row per slot.  arrival orders rows by receipt.
            """CREATE TABLE inbox(
                event_id TEXT COLLATE "C" PRIMARY KEY,
                arrival BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
                flow_id TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL CHECK (seq >= 1),
                body TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending','blocked','applied','skipped','replaced')),
                reason TEXT,
                detail TEXT,
                received_at DOUBLE PRECISION,
                blocked_at DOUBLE PRECISION,
                live INTEGER DEFAULT 1 CHECK ((live IS NOT DISTINCT FROM 1) = (state <> 'replaced')),
                UNIQUE (flow_id, seq, live)
            )""",
            "CREATE INDEX inbox_open ON inbox(flow_id, seq) WHERE state IN ('pending','blocked')",
            """CREATE TABLE projection(
                flow_id TEXT COLLATE "C" PRIMARY KEY,
                state TEXT NOT NULL,
                last_seq BIGINT NOT NULL CHECK (last_seq >= 1),
                data TEXT NOT NULL,
                view TEXT NOT NULL
            )""",
            # UNIQUE(event_id) is the last line of defence against a double effect.
            """CREATE TABLE effect(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                event_id TEXT COLLATE "C" NOT NULL UNIQUE,
                flow_id TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL,
                kind TEXT NOT NULL,
                UNIQUE (flow_id, seq)
            )""",
            """CREATE TABLE effect_outbox(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                key TEXT COLLATE "C" NOT NULL UNIQUE,
                name TEXT COLLATE "C" NOT NULL,
                payload TEXT NOT NULL,
                event_id TEXT NOT NULL,
                flow_id TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL,
                meta TEXT NOT NULL,
                state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN
                    ('pending','running','in_doubt','succeeded','dead','unknown','expired','superseded','cancelled')),
                ordered INTEGER NOT NULL DEFAULT 0 CHECK (ordered IN (0, 1)),
                deadline DOUBLE PRECISION,
                version BIGINT,
                attempts INTEGER NOT NULL DEFAULT 0,
                failures INTEGER NOT NULL DEFAULT 0,
                due_at DOUBLE PRECISION NOT NULL DEFAULT 0,
                lease_owner TEXT,
                last_error TEXT,
                result TEXT,
                reason TEXT,
                fed INTEGER CHECK (fed IN (0, 1)),
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL
            )""",
            "CREATE INDEX effect_due ON effect_outbox(due_at, id) WHERE state IN ('pending','running','in_doubt')",
            (
                "CREATE INDEX effect_open_ordered ON effect_outbox(flow_id, id) "
                "WHERE ordered = 1 AND state IN ('pending','running','in_doubt','dead','unknown')"
            ),
            "CREATE INDEX effect_by_state ON effect_outbox(state, id)",
            "CREATE INDEX effect_unfed ON effect_outbox(id) WHERE fed = 0",
            """CREATE TABLE effect_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                key TEXT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('retry','resolve','cancel')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL
            )""",
            'CREATE TABLE app_schema(name TEXT COLLATE "C" PRIMARY KEY, version INTEGER NOT NULL)',
            """CREATE TABLE consumer_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                event_id TEXT NOT NULL,
                flow_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                action TEXT NOT NULL CHECK (action IN ('skip','replace')),
                previous_state TEXT NOT NULL CHECK (previous_state IN ('pending','blocked')),
                actor TEXT NOT NULL,
                reason TEXT NOT NULL,
                replacement_event_id TEXT
            )""",
            _TOMBSTONE_TABLE.format(name="inbox_tombstone"),
            """CREATE TABLE prune_action(
                id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at DOUBLE PRECISION NOT NULL,
                horizon DOUBLE PRECISION NOT NULL,
                events INTEGER NOT NULL,
                effect_records INTEGER NOT NULL,
                effect_rows INTEGER NOT NULL
            )""",
        ),
        (
            # v2: every transition of every effect (issue 20), as on SQLite.
            _EFFECT_HISTORY,
            "CREATE INDEX effect_history_key ON effect_history(key, id)",
            "CREATE INDEX effect_history_starts ON effect_history(name, at) WHERE transition = 'claimed'",
        ),
        # v3: a transition's due time as a column (EffectTransition.due_at),
        # as SQLite's v6; NULL for rows written before it.
        ("ALTER TABLE effect_history ADD COLUMN due_at DOUBLE PRECISION",),
        # v4: who pruned, when and why (one row per prune call), as SQLite's v7.
        (_RETENTION_ACTION,),
        # v5: the console's indexes, as SQLite's v8 (issue 31, item 5); the
        # correlation id is an expression over the body, indexed by the
        # migration for the rows already stored (CORRELATION_ID).
        (
            "CREATE INDEX effect_by_name ON effect_outbox(name, id)",
            "CREATE INDEX effect_by_state_name ON effect_outbox(state, name, id)",
            "CREATE INDEX effect_by_flow ON effect_outbox(flow_id, id)",
            (
                f"CREATE INDEX inbox_correlation ON inbox(({CORRELATION_ID}), flow_id) "
                f"WHERE {CORRELATION_ID} IS NOT NULL"
            ),
        ),
        # v6: recurring effect schedules and their operator actions, as SQLite's v9.
        (_SCHEDULE_TABLE, _SCHEDULE_ACTION),
        (
            # v7 (issue 32, item 5): a ``latest`` consumer's ``superseded``
            # rows, as SQLite's v10 (here the CHECK is replaced in place).
            "ALTER TABLE inbox DROP CONSTRAINT inbox_state_check",
            (
                "ALTER TABLE inbox ADD CONSTRAINT inbox_state_check CHECK (state IN "
                "('pending','blocked','applied','skipped','replaced','superseded'))"
            ),
        ),
    ),
)

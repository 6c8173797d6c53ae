"""Apply handlers and scheduling effects: what a handler sees, what commits
with the apply, the application's own tables (AppSchema), and every way a
handler's input can be refused.

Real stores on both engines (a SQLite file in ``tmp_path`` or a PostgreSQL
schema), the reservation protocol, an injected clock; no sleeping.  The executor side is in ``test_effects.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_reads import is_pg, new_location, rows
from reliable_flow import ApplyContext, AppSchema, Consumer, EffectRegistry, Event, PayloadError
from reliable_flow._envelope import make
from reliable_flow.errors import EffectKeyConflict, InvalidEnvelope, NotResolvable, UnknownEffect
from reliable_flow.reservation import RESERVATION
from support import EffectWorld

# -- local helpers ----------------------------------------------------------------------------


def has_table(location: Any, name: str) -> bool:
    """Whether the store (either engine) has a table ``name``."""
    if is_pg(location):
        return bool(rows(location, "SELECT 1 FROM information_schema.tables "
                                   "WHERE table_schema = current_schema() AND table_name = ?", (name,)))
    return bool(rows(location, "SELECT 1 FROM sqlite_master WHERE name = ?", (name,)))


World = EffectWorld


@pytest.fixture
def world(engine: str, tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path, engine=engine)
    yield w
    w.close()


def registry(*names: str, run: Callable[..., Any] = lambda call: {"ok": True}) -> EffectRegistry:
    effects = EffectRegistry()
    for name in names:
        effects.register(name, run)
    return effects


NOTES = AppSchema("shop", [["CREATE TABLE note(flow TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL)"]])


def notes(w: World) -> list[tuple[Any, ...]]:
    """The app's note rows ([] while the consumer has no note table)."""
    if not has_table(w.consumer_path, "note"):
        return []
    return rows(w.consumer_path, "SELECT flow, seq, text FROM note ORDER BY flow, seq")


def assert_nothing_applied(w: World, c: Consumer, flow: str = "A", *, at_seq: int = 0) -> None:
    """The flow is still at ``at_seq``: no projection change, no effect record, no
    scheduled effect, no app row for the next event, and its inbox row not applied."""
    projection = c.projection(flow)
    assert (projection or {}).get("last_seq", 0) == at_seq
    assert len(c.applied(flow)) == at_seq
    assert [e for e in c.scheduled_effects(flow_id=flow) if e.seq > at_seq] == []
    assert [n for n in notes(w) if n[0] == flow and n[1] > at_seq] == []
    assert [e.state for e in c.inbox(flow) if e.seq == at_seq + 1] in (["pending"], ["blocked"])


# -- 1. handlers --------------------------------------------------------------------------------


def test_handler_sees_whole_event_states_data_and_consumer(world: World) -> None:
    seen: list[dict[str, Any]] = []

    def look(ctx: ApplyContext) -> None:
        seen.append({"event": ctx.event, "previous": ctx.previous_state, "state": ctx.state,
                     "data": dict(ctx.data), "consumer": ctx.consumer})
        ctx.data["amount"] = 999  # a copy: must not leak into the flow's data

    c = world.consumer((look,), name="shop")
    world.push("A", 2, meta={"trace": "t-1"})
    world.deliver(c)
    assert c.drain("A", batch_size=10).applied == 2  # one transaction: the data is carried over
    assert seen == [
        {"event": make(event_id="A1", flow_id="A", seq=1, kind="reserved", schema=1, payload={"amount": 3}, meta={"trace": "t-1"}),
         "previous": "new", "state": "reserved", "data": {"amount": 3}, "consumer": "shop"},
        {"event": make(event_id="A2", flow_id="A", seq=2, kind="confirmed", schema=1, payload={"amount": 3}, meta={"trace": "t-1"}),
         "previous": "reserved", "state": "confirmed", "data": {"amount": 3}, "consumer": "shop"},
    ]
    assert c.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}


def test_handler_sees_raw_payload_of_schema_2_and_empty_meta(world: World) -> None:
    seen: list[Event] = []
    c = world.consumer((lambda ctx: seen.append(ctx.event),), schemas={1, 2})
    assert world.producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"units": 4},
                                  schema=2).status == "committed"
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    assert seen == [make(event_id="A1", flow_id="A", seq=1, kind="reserved", schema=2, payload={"units": 4}, meta={})]


def test_handler_writes_app_table_and_schedules_everything_commits_with_apply(world: World) -> None:
    def record(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, seq, text) VALUES (?, ?, ?)",
                    (ctx.event.flow_id, ctx.event.seq, ctx.state))
        assert ctx.execute("SELECT count(*) FROM note WHERE flow = ?", (ctx.event.flow_id,)) == [(ctx.event.seq,)]
        ctx.schedule("notify", {"state": ctx.state})

    c = world.consumer((record,), registry("notify"), app_schema=NOTES)
    world.push("A", 2)
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    # Committed: visible to a separate connection at once.
    assert notes(world) == [("A", 1, "reserved")]
    assert [(e.key, e.payload, e.state) for e in c.scheduled_effects()] == [
        ("default:A1:notify", {"state": "reserved"}, "pending")]
    assert c.apply_next("A").status == "applied"
    assert notes(world) == [("A", 1, "reserved"), ("A", 2, "confirmed")]
    assert len(c.scheduled_effects()) == 2


def test_handler_raising_rolls_back_everything_and_fixed_handler_applies_later(world: World) -> None:
    broken = {"on": True}

    def handler(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, seq, text) VALUES (?, ?, 'x')", (ctx.event.flow_id, ctx.event.seq))
        ctx.schedule("notify", {"n": ctx.event.seq})
        if broken["on"]:
            raise RuntimeError("handler bug")

    c = world.consumer((handler,), registry("notify"), app_schema=NOTES)
    world.push("A", 2)
    world.deliver(c)
    broken["on"] = False
    assert c.apply_next("A").status == "applied"
    broken["on"] = True
    for _ in range(2):  # raises every time, and leaves nothing
        with pytest.raises(RuntimeError, match="handler bug"):
            c.apply_next("A")
        assert_nothing_applied(world, c, at_seq=1)
        assert c.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}
        assert [e.key for e in c.scheduled_effects()] == ["default:A1:notify"]
    with pytest.raises(RuntimeError):
        c.drain("A")
    assert_nothing_applied(world, c, at_seq=1)
    # The same file, a consumer with the handler fixed: applies the same event once.
    broken["on"] = False
    c.close()
    fixed = world.consumer((handler,), registry("notify"), app_schema=NOTES)
    assert fixed.apply_next("A").status == "applied"
    assert fixed.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}
    assert notes(world) == [("A", 1, "x"), ("A", 2, "x")]
    assert [e.key for e in fixed.scheduled_effects()] == ["default:A1:notify", "default:A2:notify"]


def test_handler_payload_error_blocks_with_detail_and_leaves_nothing(world: World) -> None:
    calls: list[int] = []
    refuse = {"on": True}

    def handler(ctx: ApplyContext) -> None:
        calls.append(ctx.event.seq)
        ctx.execute("INSERT INTO note(flow, seq, text) VALUES (?, ?, 'x')", (ctx.event.flow_id, ctx.event.seq))
        ctx.schedule("notify", {})
        if refuse["on"]:
            raise PayloadError("amount", "more than the warehouse holds")

    c = world.consumer((handler,), registry("notify"), app_schema=NOTES)
    world.push("A", 1)
    world.deliver(c)
    for attempt in (1, 2):  # examined again on every call
        result = c.apply_next("A")
        assert (result.status, result.seq, result.event_id, result.reason, result.detail) == (
            "blocked", 1, "A1", "invalid_payload", "payload.amount: more than the warehouse holds")
        assert calls == [1] * attempt
        assert_nothing_applied(world, c)
        assert [(e.state, e.reason) for e in c.inbox("A")] == [("blocked", "invalid_payload")]
    refuse["on"] = False
    assert c.apply_next("A").status == "applied"
    assert [(e.state, e.reason) for e in c.inbox("A")] == [("applied", None)]
    assert notes(world) == [("A", 1, "x")]
    assert len(c.scheduled_effects()) == 1


def test_payload_error_in_a_drain_batch_keeps_the_earlier_applies(world: World) -> None:
    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("notify", {})
        if ctx.event.kind == "confirmed":
            raise PayloadError("amount", "no")

    c = world.consumer((handler,), registry("notify"))
    world.push("A", 2)
    world.deliver(c)
    drained = c.drain("A", batch_size=10)
    assert (drained.applied, drained.stop, drained.last.detail) == (1, "blocked", "payload.amount: no")
    assert [e.key for e in c.scheduled_effects()] == ["default:A1:notify"]
    assert c.projection("A")["last_seq"] == 1


TRANSACTION_CONTROL = [
    "COMMIT", "commit", "  END", "END TRANSACTION", "BEGIN", "BEGIN IMMEDIATE", "ROLLBACK", "ROLLBACK TO step",
    "SAVEPOINT mine", "RELEASE step", "RELEASE SAVEPOINT step", "VACUUM", "ATTACH DATABASE ':memory:' AS x",
    "DETACH x", "\n\tcommit", "/* x */ COMMIT", "-- x\nCOMMIT", "/* a */ -- b\n /* c */ rollback",
]


@pytest.mark.parametrize("sql", [*TRANSACTION_CONTROL, "; COMMIT", "/* x */;COMMIT", "\ufeffCOMMIT"])
def test_execute_refuses_transaction_control(world: World, sql: str) -> None:
    refused: list[str] = []

    def handler(ctx: ApplyContext) -> None:
        ctx.execute("INSERT INTO note(flow, seq, text) VALUES ('A', 1, 'x')")
        ctx.schedule("notify", {})
        try:
            ctx.execute(sql)
        except ValueError as exc:
            refused.append(str(exc))
        raise RuntimeError("roll the apply back")

    c = world.consumer((handler,), registry("notify"), app_schema=NOTES)
    world.push("A", 1)
    world.deliver(c)
    if world.engine == "postgres" and sql.startswith("\ufeff"):
        # PostgreSQL reads no byte order mark: the server refuses the statement
        # (nothing runs) and the apply rolls back.
        with pytest.raises(Exception, match="syntax error"):
            c.apply_next("A")
        assert_nothing_applied(world, c)
        assert refused == []
        return
    with pytest.raises(RuntimeError, match="roll the apply back"):
        c.apply_next("A")
    assert_nothing_applied(world, c)
    assert len(refused) == 1 and "transaction control" in refused[0]


def test_execute_refuses_non_text_sql(world: World) -> None:
    errors: list[Exception] = []

    def handler(ctx: ApplyContext) -> None:
        try:
            ctx.execute(b"SELECT 1")  # type: ignore[arg-type]
        except ValueError as exc:
            errors.append(exc)

    c = world.consumer((handler,))
    world.push("A", 1)
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    assert len(errors) == 1


# -- AppSchema ----------------------------------------------------------------------------------


LOGGED_V1 = ["CREATE TABLE app_log(step TEXT NOT NULL)", "INSERT INTO app_log VALUES ('v1')"]
LOGGED_V2 = ["ALTER TABLE app_log ADD COLUMN extra TEXT", "INSERT INTO app_log(step) VALUES ('v2')"]


def app_log(path: Path) -> list[str]:
    return [r[0] for r in rows(path, "SELECT step FROM app_log ORDER BY step")]  # v1, v2, ... in order


def app_versions(path: Path) -> list[tuple[Any, ...]]:
    return rows(path, "SELECT name, version FROM app_schema ORDER BY name")


def test_app_schema_second_migration_on_existing_file_applies_once(world: World) -> None:
    world.consumer(app_schema=AppSchema("shop", [LOGGED_V1])).close()
    assert app_log(world.consumer_path) == ["v1"]
    assert app_versions(world.consumer_path) == [("shop", 1)]
    for _ in range(2):  # reopening with the same migrations changes nothing
        world.consumer(app_schema=AppSchema("shop", [LOGGED_V1, LOGGED_V2])).close()
        assert app_log(world.consumer_path) == ["v1", "v2"]
        assert app_versions(world.consumer_path) == [("shop", 2)]
    # A second schema name keeps its own version.
    world.consumer(app_schema=AppSchema("audit", [["CREATE TABLE audit(x INTEGER)"]])).close()
    assert app_versions(world.consumer_path) == [("audit", 1), ("shop", 2)]


def test_app_schema_failing_migration_rolls_back_its_version_only(world: World) -> None:
    world.consumer(app_schema=AppSchema("shop", [LOGGED_V1])).close()
    bad = AppSchema("shop", [LOGGED_V1, ["INSERT INTO app_log(step) VALUES ('v2')", "CREATE TABLE oops("]])
    with pytest.raises(Exception):  # noqa: B017 - whatever the SQL error becomes
        world.consumer(app_schema=bad)
    assert app_log(world.consumer_path) == ["v1"]
    assert app_versions(world.consumer_path) == [("shop", 1)]


def test_app_schema_refuses_bad_migrations() -> None:
    with pytest.raises(ValueError):
        AppSchema("shop", ["CREATE TABLE x(y)"])  # a string, not a list of statements
    with pytest.raises(ValueError):
        AppSchema("shop", [["   "]])


@pytest.mark.parametrize(("migrations", "message"), [
    ("CREATE TABLE x(y)", r"^migrations must be a list of migrations"),
    ({"sqlite": [], "postgres": []}, r"^migrations must be a list of migrations"),
    ([["CREATE TABLE x(y)"], "CREATE TABLE z(y)"], r"^migrations\[1\] must be a list of SQL statements"),
    ([["CREATE TABLE x(y)", ""]], r"^migrations\[0\]\[1\] must be a non-empty SQL statement"),
    ([{"sqlite": [], "postgres": [], "mysql": []}], r"^migrations\[0\] names unknown engine 'mysql'"),
    ([{"sqlite": ["CREATE TABLE x(y)"]}], r"^migrations\[0\] must give the statements of every engine; 'postgres'"),
    ([{"sqlite": "CREATE TABLE x(y)", "postgres": []}], r"^migrations\[0\]\['sqlite'\] must be a list of SQL"),
    ([{"sqlite": [], "postgres": ["CREATE TABLE x(y)", " "]}],
     r"^migrations\[0\]\['postgres'\]\[1\] must be a non-empty SQL statement"),
    ([{"sqlite": [], "postgres": [None]}], r"^migrations\[0\]\['postgres'\]\[0\] must be a non-empty SQL"),
])
def test_app_schema_names_the_bad_part_of_its_migrations(migrations: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AppSchema("shop", migrations)


def test_app_schema_gives_each_engine_its_statements() -> None:
    schema = AppSchema("shop", [
        ("CREATE TABLE a(x)",),
        {"postgres": ["CREATE TABLE b(id BIGSERIAL)"], "sqlite": ["CREATE TABLE b(id INTEGER PRIMARY KEY)", "X"]},
        {"sqlite": [], "postgres": ["CREATE INDEX b_id ON b(id)"]},
    ])
    assert [schema.statements(v, "sqlite") for v in (1, 2, 3)] == [
        ["CREATE TABLE a(x)"], ["CREATE TABLE b(id INTEGER PRIMARY KEY)", "X"], []]
    assert [schema.statements(v, "postgres") for v in (1, 2, 3)] == [
        ["CREATE TABLE a(x)"], ["CREATE TABLE b(id BIGSERIAL)"], ["CREATE INDEX b_id ON b(id)"]]
    with pytest.raises(ValueError, match=r"^engine must be one of sqlite, postgres, got 'mysql'"):
        schema.statements(1, "mysql")
    for version in (0, 4, True, "1"):
        with pytest.raises(ValueError, match=r"^version must be from 1 to 3"):
            schema.statements(version, "sqlite")  # type: ignore[arg-type]


def test_app_schema_with_an_empty_engine_step_records_the_version(world: World) -> None:
    schema = AppSchema("shop", [LOGGED_V1, {"sqlite": [], "postgres": ["CREATE TABLE pg_only(x INTEGER)"]}])
    world.consumer(app_schema=schema).close()
    assert app_versions(world.consumer_path) == [("shop", 2)]
    assert has_table(world.consumer_path, "pg_only") == (world.engine == "postgres")


@pytest.mark.parametrize("round_", range(3))
def test_two_consumers_opening_concurrently_apply_app_migrations_once(engine: str, tmp_path: Path, round_: int) -> None:
    path = new_location(engine, tmp_path, "consumer")
    Consumer(path, RESERVATION, app_schema=AppSchema("shop", [LOGGED_V1])).close()
    schema = AppSchema("shop", [LOGGED_V1, LOGGED_V2, ["INSERT INTO app_log(step) VALUES ('v3')"]])
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            barrier.wait(timeout=10)
            Consumer(path, RESERVATION, app_schema=schema).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert app_log(path) == ["v1", "v2", "v3"]
    assert app_versions(path) == [("shop", 3)]


def test_two_consumers_creating_a_new_file_concurrently_apply_app_migrations_once(engine: str, tmp_path: Path) -> None:
    path = new_location(engine, tmp_path, "consumer")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            barrier.wait(timeout=10)
            Consumer(path, RESERVATION, app_schema=AppSchema("shop", [LOGGED_V1, LOGGED_V2])).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert app_log(path) == ["v1", "v2"]


# -- 2. scheduling and bad input ----------------------------------------------------------------


def schedule_on_reserved(*calls: tuple[str, dict[str, Any], dict[str, Any]]) -> Callable[[ApplyContext], None]:
    """A handler scheduling each (name, payload, kwargs) on the reserved step; keys go in .keys."""

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            for name, payload, kw in calls:
                handler.keys.append(ctx.schedule(name, payload, **kw))  # type: ignore[attr-defined]

    handler.keys = []  # type: ignore[attr-defined]
    return handler


@pytest.mark.parametrize("name", [None, "shop"])
def test_default_key_is_consumer_event_and_name(world: World, name: str | None) -> None:
    handler = schedule_on_reserved(("notify", {"a": 1}, {}), ("bill", {"b": [1, {"c": None}]}, {}))
    c = world.consumer((handler,), registry("notify", "bill"), name=name)
    world.push("A", 1)
    world.deliver(c)
    c.apply_next("A")
    prefix = name or "default"
    assert handler.keys == [f"{prefix}:A1:notify", f"{prefix}:A1:bill"]
    stored = c.scheduled_effects()
    assert [(e.key, e.name, e.payload, e.event_id, e.flow_id, e.seq, e.state, e.attempts, e.created_at)
            for e in stored] == [
        (f"{prefix}:A1:notify", "notify", {"a": 1}, "A1", "A", 1, "pending", 0, 1000.0),
        (f"{prefix}:A1:bill", "bill", {"b": [1, {"c": None}]}, "A1", "A", 1, "pending", 0, 1000.0),
    ]
    assert c.scheduled_effect(f"{prefix}:A1:notify") == stored[0]
    assert c.scheduled_effect("nope") is None


def test_explicit_keys_let_one_event_schedule_a_name_twice(world: World) -> None:
    handler = schedule_on_reserved(("notify", {"to": "a"}, {"key": "mail-a"}),
                                   ("notify", {"to": "b"}, {"key": "mail-b"}))
    c = world.consumer((handler,), registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    c.apply_next("A")
    assert handler.keys == ["mail-a", "mail-b"]
    assert [(e.key, e.payload) for e in c.scheduled_effects()] == [("mail-a", {"to": "a"}), ("mail-b", {"to": "b"})]


@pytest.mark.parametrize("key", ["", "k" * 513, 7])
def test_bad_explicit_key_is_refused(world: World, key: Any) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {}, {"key": key})),), registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises(ValueError, match="key"):
        c.apply_next("A")
    assert_nothing_applied(world, c)


def test_unregistered_name_raises_unknown_effect_and_stores_nothing(world: World) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {}, {}), ("nope", {}, {})),), registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises(UnknownEffect, match="nope"):
        c.apply_next("A")
    assert_nothing_applied(world, c)
    assert c.scheduled_effects() == []


@pytest.mark.parametrize(("payload", "field"), [
    ({"x": float("nan")}, "payload.x"),
    ({"x": float("inf")}, "payload.x"),
    ({"x": -float("inf")}, "payload.x"),
    ({"x": {1, 2}}, "payload.x"),
    ({"x": object()}, "payload.x"),
    ({"x": b"bytes"}, "payload.x"),
    ({"x": {1: "one"}}, "payload.x"),
    ({2: "two"}, "payload"),
    ({"x": [1, {"y": float("nan")}]}, "payload.x[1].y"),
    (["not", "an", "object"], "payload"),
    (None, "payload"),
    ({"x": "\ud800"}, "payload.x"),
    ({"x": ["ok", "\udc00"]}, "payload.x[1]"),
    ({"\ud800": 1}, "payload"),
])
def test_non_json_payload_raises_invalid_envelope_naming_the_field(world: World, payload: Any, field: str) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {"fine": 1}, {"key": "first"}), ("notify", payload, {})),),
                       registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises(InvalidEnvelope) as caught:
        c.apply_next("A")
    assert caught.value.field == field
    assert_nothing_applied(world, c)
    assert c.scheduled_effects() == []


@pytest.mark.parametrize("kw", [{"version": True}, {"version": False}, {"version": 0}, {"version": "1"},
                                {"deadline": True}, {"deadline": float("nan")}, {"deadline": float("inf")},
                                {"deadline": "1500"}, {"ordered": 1}])
def test_bad_version_deadline_or_ordered_is_refused(world: World, kw: dict[str, Any]) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {}, kw)),), registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises((ValueError, TypeError)):
        c.apply_next("A")
    assert_nothing_applied(world, c)


def test_same_key_different_payload_in_one_apply_conflicts_and_rolls_back(world: World) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {"n": 1}, {"key": "k"}), ("notify", {"n": 2}, {"key": "k"})),),
                       registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises(EffectKeyConflict, match="'k'"):
        c.apply_next("A")
    assert_nothing_applied(world, c)
    assert c.scheduled_effects() == []


def test_same_key_different_name_conflicts(world: World) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {}, {"key": "k"}), ("bill", {}, {"key": "k"})),),
                       registry("notify", "bill"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises(EffectKeyConflict):
        c.apply_next("A")
    assert c.scheduled_effects() == []


def test_same_key_from_a_later_event_conflicts_and_the_flow_stays(world: World) -> None:
    def handler(ctx: ApplyContext) -> None:
        ctx.schedule("notify", {"n": 1}, key="order-1")

    c = world.consumer((handler,), registry("notify"))
    world.push("A", 2)
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    with pytest.raises(EffectKeyConflict, match="order-1"):
        c.apply_next("A")  # same name and payload, but another event
    assert_nothing_applied(world, c, at_seq=1)
    assert [e.event_id for e in c.scheduled_effects()] == ["A1"]


@pytest.mark.parametrize("options", [{"deadline": 5000.0}, {"version": 3}, {"ordered": True}])
def test_same_key_same_payload_other_options_conflicts(world: World, options: dict[str, Any]) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {"n": 1}, {"key": "k"}),
                                             ("notify", {"n": 1}, {"key": "k", **options})),),
                       registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    with pytest.raises(EffectKeyConflict, match="'k'"):
        c.apply_next("A")
    assert_nothing_applied(world, c)
    assert c.scheduled_effects() == []


def test_same_key_same_payload_twice_in_one_apply_is_one_row(world: World) -> None:
    first = schedule_on_reserved(("notify", {"n": 1}, {}))
    second = schedule_on_reserved(("notify", {"n": 1}, {}))
    c = world.consumer((first, second), registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    assert first.keys == second.keys == ["default:A1:notify"]
    assert [e.key for e in c.scheduled_effects()] == ["default:A1:notify"]


@pytest.mark.parametrize(("expires_at", "deadline"), [
    ("1500", 1500.0),
    ("1500.25", 1500.25),
    ("2030-01-01T00:00:00Z", 1893456000.0),
    ("2030-01-01T02:00:00+02:00", 1893456000.0),
])
def test_deadline_defaults_to_meta_expires_at(world: World, expires_at: str, deadline: float) -> None:
    handler = schedule_on_reserved(("notify", {}, {}), ("notify", {}, {"key": "explicit", "deadline": 1200}))
    c = world.consumer((handler,), registry("notify"))
    world.push("A", 1, meta={"expires_at": expires_at})
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    assert [(e.key, e.deadline, e.meta) for e in c.scheduled_effects()] == [
        ("default:A1:notify", deadline, {"expires_at": expires_at}),
        ("explicit", 1200.0, {"expires_at": expires_at}),
    ]


def test_no_expires_at_means_no_deadline(world: World) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {}, {})),), registry("notify"))
    world.push("A", 1)
    world.deliver(c)
    c.apply_next("A")
    assert c.scheduled_effect("default:A1:notify").deadline is None


@pytest.mark.parametrize("expires_at", ["next tuesday", "2030-01-01T00:00:00", "nan", "inf", ""])
def test_malformed_expires_at_blocks_the_event(world: World, expires_at: str) -> None:
    c = world.consumer((schedule_on_reserved(("notify", {}, {})),), registry("notify"), app_schema=NOTES)
    world.push("A", 1, meta={"expires_at": expires_at})
    world.deliver(c)
    result = c.apply_next("A")
    assert (result.status, result.reason) == ("blocked", "invalid_payload")
    assert result.detail.startswith("meta.expires_at: ")
    assert repr(expires_at) in result.detail
    assert_nothing_applied(world, c)


def test_malformed_expires_at_does_not_matter_without_scheduling(world: World) -> None:
    c = world.consumer((lambda ctx: None,), registry("notify"))
    world.push("A", 1, meta={"expires_at": "next tuesday"})
    world.deliver(c)
    assert c.apply_next("A").status == "applied"


def test_already_expired_deadline_is_stored_and_expires_without_running(world: World) -> None:
    calls: list[str] = []
    effects = EffectRegistry()
    effects.register("notify", lambda call: calls.append(call.key))
    c = world.consumer((schedule_on_reserved(("notify", {}, {})),), effects)
    world.push("A", 1, meta={"expires_at": "900"})  # the clock says 1000
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    stored = c.scheduled_effect("default:A1:notify")
    assert (stored.state, stored.deadline) == ("pending", 900.0)
    ex = world.executor(c)
    assert ex.run_once().work == 1
    expired = c.scheduled_effect("default:A1:notify")
    assert (expired.state, expired.attempts) == ("expired", 0)
    assert "deadline 900.000 passed" in expired.reason
    assert calls == []
    assert ex.stats.outcomes == {"expired": 1}


def test_handler_cancel_checks_its_arguments(world: World) -> None:
    outcome: dict[str, BaseException] = {}

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("notify", {})
            return
        for name, args in (("unknown", ("nope", "why")), ("empty_reason", ("default:A1:notify", " "))):
            try:
                ctx.cancel(*args)
            except Exception as exc:  # noqa: BLE001 - recorded and checked
                outcome[name] = exc
        ctx.cancel("default:A1:notify", "not needed once confirmed")

    c = world.consumer((handler,), registry("notify"))
    world.push("A", 2)
    world.deliver(c)
    assert c.drain("A").applied == 2
    assert isinstance(outcome["unknown"], UnknownEffect)
    assert isinstance(outcome["empty_reason"], ValueError)
    cancelled = c.scheduled_effect("default:A1:notify")
    assert (cancelled.state, cancelled.reason) == ("cancelled", "not needed once confirmed")


def test_handler_cancel_of_a_non_pending_effect_rolls_the_apply_back(world: World) -> None:
    def handler(ctx: ApplyContext) -> None:
        if ctx.event.kind == "reserved":
            ctx.schedule("notify", {})
        else:
            ctx.cancel("default:A1:notify", "too late")

    c = world.consumer((handler,), registry("notify"))
    world.push("A", 2)
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    world.executor(c).run_until_idle()
    assert c.scheduled_effect("default:A1:notify").state == "succeeded"
    with pytest.raises(NotResolvable, match="succeeded"):
        c.apply_next("A")
    assert_nothing_applied(world, c, at_seq=1)
    assert c.scheduled_effect("default:A1:notify").state == "succeeded"


def test_consumer_without_registry_schedules_any_name(world: World) -> None:
    c = world.consumer((schedule_on_reserved(("anything", {}, {})),))
    world.push("A", 1)
    world.deliver(c)
    assert c.apply_next("A").status == "applied"
    assert [e.name for e in c.scheduled_effects()] == ["anything"]
